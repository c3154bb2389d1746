"""The expected text tensors of a K3 checkpoint, derived from the config alone.

`text_manifest(cfg)` lists every tensor (name, shape, dtype) the published layout holds for
the text model. For k3-full it totals 497,052 tensors and 1,559,965,606,912 bytes; the
published checkpoint's other 168 tensors are the vision tower, skipped by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from k3_sglang.config import K3Config

DTYPE_BYTES = {"bf16": 2, "f32": 4, "u8": 1}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "bf16" | "f32" | "u8"

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * DTYPE_BYTES[self.dtype]


def _kda_tensors(cfg: K3Config, pre: str) -> list[TensorSpec]:
    k, h = cfg.kda, cfg.hidden_size
    p = k.proj_dim
    # K3 stores A_log wider than the head count ([128] for 96 heads); the loader narrows it.
    a_log_width = max(k.head_dim, k.num_heads)
    out = [TensorSpec(f"{pre}{n}_proj.weight", (p, h), "bf16") for n in ("q", "k", "v")]
    out += [TensorSpec(f"{pre}{n}_conv1d.weight", (p, 1, k.conv_kernel_size), "f32") for n in ("q", "k", "v")]
    out += [
        TensorSpec(f"{pre}A_log", (a_log_width,), "f32"),
        TensorSpec(f"{pre}f_a_proj.weight", (k.head_dim, h), "bf16"),
        TensorSpec(f"{pre}f_b_proj.weight", (p, k.head_dim), "bf16"),
        TensorSpec(f"{pre}dt_bias", (p,), "f32"),
        TensorSpec(f"{pre}b_proj.weight", (k.num_heads, h), "bf16"),
        TensorSpec(f"{pre}o_norm.weight", (k.head_dim,), "f32"),
        TensorSpec(f"{pre}g_proj.weight", (p, h), "bf16"),
        TensorSpec(f"{pre}o_proj.weight", (h, p), "bf16"),
    ]
    return out


def _mla_tensors(cfg: K3Config, pre: str) -> list[TensorSpec]:
    m, h = cfg.mla, cfg.hidden_size
    return [
        TensorSpec(f"{pre}q_a_proj.weight", (m.q_lora_rank, h), "bf16"),
        TensorSpec(f"{pre}q_a_layernorm.weight", (m.q_lora_rank,), "bf16"),
        TensorSpec(f"{pre}q_b_proj.weight", (m.num_heads * m.qk_head_dim, m.q_lora_rank), "bf16"),
        TensorSpec(f"{pre}kv_a_proj_with_mqa.weight", (m.latent_dim, h), "bf16"),
        TensorSpec(f"{pre}kv_a_layernorm.weight", (m.kv_lora_rank,), "bf16"),
        TensorSpec(f"{pre}kv_b_proj.weight", (m.num_heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank), "bf16"),
        TensorSpec(f"{pre}g_proj.weight", (m.num_heads * m.v_head_dim, h), "bf16"),
        TensorSpec(f"{pre}o_proj.weight", (h, m.num_heads * m.v_head_dim), "bf16"),
    ]


def _mlp_tensors(pre: str, hidden: int, inter: int) -> list[TensorSpec]:
    return [
        TensorSpec(f"{pre}gate_proj.weight", (inter, hidden), "bf16"),
        TensorSpec(f"{pre}up_proj.weight", (inter, hidden), "bf16"),
        TensorSpec(f"{pre}down_proj.weight", (hidden, inter), "bf16"),
    ]


def expert_tensors(cfg: K3Config, pre: str) -> list[TensorSpec]:
    """One routed expert: w1/w3 (gate/up, [I, Dl]) and w2 (down, [Dl, I]), MXFP4 or bf16."""
    m = cfg.moe
    inter, lat = m.moe_intermediate_size, m.routed_expert_hidden_size
    shapes = {"w1": (inter, lat), "w3": (inter, lat), "w2": (lat, inter)}
    if not cfg.quant.experts_mxfp4:
        return [TensorSpec(f"{pre}{w}.weight", s, "bf16") for w, s in shapes.items()]
    g = cfg.quant.group_size
    out = []
    for w in ("w1", "w3", "w2"):
        rows, cols = shapes[w]
        out += [TensorSpec(f"{pre}{w}.weight_packed", (rows, cols // 2), "u8"),
                TensorSpec(f"{pre}{w}.weight_scale", (rows, cols // g), "u8")]
    return out


def _moe_tensors(cfg: K3Config, pre: str) -> list[TensorSpec]:
    m, h = cfg.moe, cfg.hidden_size
    lat = m.routed_expert_hidden_size
    out = [
        TensorSpec(f"{pre}gate.weight", (m.num_experts, h), "bf16"),
        TensorSpec(f"{pre}gate.e_score_correction_bias", (m.num_experts,), "f32"),
        TensorSpec(f"{pre}routed_expert_down_proj.weight", (lat, h), "bf16"),
        TensorSpec(f"{pre}routed_expert_up_proj.weight", (h, lat), "bf16"),
        TensorSpec(f"{pre}routed_expert_norm.weight", (lat,), "bf16"),
    ]
    if m.num_shared_experts:
        out += _mlp_tensors(f"{pre}shared_experts.", h, m.shared_intermediate_size)
    for e in range(m.num_experts):
        out += expert_tensors(cfg, f"{pre}experts.{e}.")
    return out


def _layer_tensors(cfg: K3Config, i: int, pre: str) -> list[TensorSpec]:
    h = cfg.hidden_size
    out = [TensorSpec(f"{pre}{n}.weight", (h,), "bf16") for n in ("input_layernorm", "post_attention_layernorm")]
    for site in ("self_attention", "mlp"):
        out += [TensorSpec(f"{pre}{site}_res_norm.weight", (h,), "bf16"),
                TensorSpec(f"{pre}{site}_res_proj.weight", (1, h), "bf16")]
    attn = f"{pre}self_attn."
    out += _kda_tensors(cfg, attn) if cfg.is_kda_layer(i) else _mla_tensors(cfg, attn)
    if cfg.moe.is_moe_layer(i):
        out += _moe_tensors(cfg, f"{pre}block_sparse_moe.")
    else:
        out += _mlp_tensors(f"{pre}mlp.", h, cfg.moe.dense_intermediate_size)
    return out


def text_manifest(cfg: K3Config, prefix: str = "") -> list[TensorSpec]:
    """Every text tensor of the checkpoint, named as in the file (`prefix` e.g. 'language_model.')."""
    h, v = cfg.hidden_size, cfg.vocab_size
    out = [
        TensorSpec(f"{prefix}model.embed_tokens.weight", (v, h), "bf16"),
        TensorSpec(f"{prefix}lm_head.weight", (v, h), "bf16"),
        TensorSpec(f"{prefix}model.norm.weight", (h,), "bf16"),
        TensorSpec(f"{prefix}model.output_attn_res_norm.weight", (h,), "bf16"),
        TensorSpec(f"{prefix}model.output_attn_res_proj.weight", (1, h), "bf16"),
    ]
    for i in range(cfg.num_layers):
        out += _layer_tensors(cfg, i, f"{prefix}model.layers.{i}.")
    return out


def manifest_totals(specs: list[TensorSpec]) -> tuple[int, int]:
    """(tensor count, total bytes)."""
    return len(specs), sum(s.nbytes for s in specs)
