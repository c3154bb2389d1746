"""Typed Kimi K3 configuration, parsed once from an HF `config.json`.

One frozen dataclass per concern (KDA, MLA, MoE, AttnRes, SiTU, quantization), all held
by `K3Config`. Nothing else in the code base reads raw config keys: use the fields and
derived properties here. Layer indices are 0-based everywhere (the HF lists are 1-based).

Presets: `k3_full()` (the published values) and `k3_tiny()` (a small config keeping every
structural feature). `K3Config.to_hf()` writes the published nested layout back out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------- helpers


def _require(cond: bool, name: str, message: str) -> None:
    if not cond:
        raise ValueError(f"invalid K3 config: {name}: {message}")


def _positive(name: str, value: Any) -> None:
    _require(isinstance(value, int) and not isinstance(value, bool) and value > 0, name, f"must be a positive int, got {value!r}")


def _take(src: dict, name: str, kind: type, prefix: str = "") -> Any:
    """Read one required key with a type check; ValueError names the field."""
    full = f"{prefix}{name}"
    _require(name in src, full, "missing")
    value = src[name]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    _require(ok, full, f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def _take_opt(src: dict, name: str, kind: type, default: Any, prefix: str = "") -> Any:
    return _take(src, name, kind, prefix) if name in src else default


# ---------------------------------------------------------------------------- concerns


@dataclass(frozen=True)
class KDAConfig:
    """Kimi Delta Attention: per-head gated delta rule with a fixed [K, V] fp32 state."""

    num_heads: int
    head_dim: int
    conv_kernel_size: int
    gate_lower_bound: float
    use_full_rank_gate: bool
    layer_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("num_heads", "head_dim", "conv_kernel_size"):
            _positive(f"linear_attn_config.{name}", getattr(self, name))
        _require(self.gate_lower_bound < 0, "linear_attn_config.gate_lower_bound", f"must be < 0, got {self.gate_lower_bound}")
        _require(self.use_full_rank_gate, "linear_attn_config.use_full_rank_gate", "K3 requires the full-rank output gate")

    @property
    def proj_dim(self) -> int:
        """P = heads * head_dim: width of q, k, v, the decay gate and the output gate."""
        return self.num_heads * self.head_dim

    def recurrent_state_bytes(self, dtype_bytes: int = 4) -> int:
        """One layer's recurrent state [H, K, V] for one request."""
        return self.num_heads * self.head_dim * self.head_dim * dtype_bytes

    def conv_state_bytes(self, dtype_bytes: int = 2) -> int:
        """One layer's conv windows (q, k, v) of the last K-1 pre-conv rows for one request."""
        return 3 * self.proj_dim * (self.conv_kernel_size - 1) * dtype_bytes


@dataclass(frozen=True)
class MLAConfig:
    """Gated NoPE multi-head latent attention; the cache holds [c (kv_lora) | k_pe (rope dim)]."""

    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    use_nope: bool
    use_output_gate: bool
    lora_norm_eps: float
    layer_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("num_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            _positive(name, getattr(self, name))
        _require(self.use_nope, "mla_use_nope", "K3 has no rotary embedding (mla_use_nope must be true)")
        _require(self.use_output_gate, "mla_use_output_gate", "K3's MLA has an output gate")

    @property
    def latent_dim(self) -> int:
        """Width of one cached latent row: kv_lora_rank + qk_rope_head_dim (576 for K3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        return self.qk_head_dim ** -0.5

    def kv_bytes_per_token_per_layer(self, dtype_bytes: int = 2) -> int:
        return self.latent_dim * dtype_bytes


@dataclass(frozen=True)
class MoEConfig:
    """Latent MoE: routed experts run in a narrower latent; shared experts on the full hidden."""

    num_experts: int
    num_experts_per_token: int
    num_shared_experts: int
    moe_intermediate_size: int
    routed_expert_hidden_size: int
    latent_moe_use_norm: bool
    router_activation: str
    topk_method: str
    num_expert_group: int
    topk_group: int
    renormalize: bool
    routed_scaling_factor: float
    first_k_dense_replace: int
    moe_layer_freq: int
    dense_intermediate_size: int

    def __post_init__(self) -> None:
        for name in ("num_experts", "num_experts_per_token", "moe_intermediate_size", "routed_expert_hidden_size",
                     "num_expert_group", "topk_group", "moe_layer_freq", "dense_intermediate_size"):
            _positive(name, getattr(self, name))
        _require(self.num_shared_experts >= 0, "num_shared_experts", f"must be >= 0, got {self.num_shared_experts}")
        _require(self.first_k_dense_replace >= 0, "first_k_dense_replace", f"must be >= 0, got {self.first_k_dense_replace}")
        _require(self.num_experts_per_token <= self.num_experts, "num_experts_per_token",
                 f"{self.num_experts_per_token} exceeds num_experts={self.num_experts}")
        _require(self.router_activation == "sigmoid", "moe_router_activation_func", f"only 'sigmoid' is supported, got {self.router_activation!r}")
        _require(self.topk_method == "noaux_tc", "topk_method", f"only 'noaux_tc' is supported, got {self.topk_method!r}")
        _require(self.num_experts % self.num_expert_group == 0, "num_expert_group",
                 f"{self.num_expert_group} does not divide num_experts={self.num_experts}")

    @property
    def shared_intermediate_size(self) -> int:
        """The shared experts are one SiTU-GLU MLP of width num_shared * moe_intermediate."""
        return self.num_shared_experts * self.moe_intermediate_size

    def is_moe_layer(self, layer_id: int) -> bool:
        return layer_id >= self.first_k_dense_replace and layer_id % self.moe_layer_freq == 0


@dataclass(frozen=True)
class AttnResConfig:
    """Block Attention Residuals: the raw stream is sealed into a bank every `block_size` layers."""

    block_size: int

    def __post_init__(self) -> None:
        _positive("attn_res_block_size", self.block_size)

    def num_blocks(self, num_layers: int) -> int:
        return -(-num_layers // self.block_size)

    def is_block_start(self, layer_id: int) -> bool:
        return layer_id % self.block_size == 0


@dataclass(frozen=True)
class SiTUConfig:
    """SiTU(g, u) = beta*tanh(g/beta)*sigmoid(g) * beta_lin*tanh(u/beta_lin)."""

    beta: float
    linear_beta: float

    def __post_init__(self) -> None:
        _require(self.beta > 0, "activation_situ_beta", f"must be > 0, got {self.beta}")
        _require(self.linear_beta > 0, "activation_situ_linear_beta", f"must be > 0, got {self.linear_beta}")


@dataclass(frozen=True)
class QuantConfig:
    """Routed-expert weight quantisation: 'mxfp4' (E2M1 + E8M0 per group), 'none', or 'other' (a scheme SGLang's own
    K3 may load on a GPU, e.g. another compressed-tensors format; `scheme` names it; refused on CPU)."""

    method: str = "none"
    group_size: int = 32
    ignore: tuple[str, ...] = ()
    scheme: str = ""

    def __post_init__(self) -> None:
        _require(self.method in ("none", "mxfp4", "other"), "quantization_config", f"unknown method {self.method!r}")
        _positive("quantization_config.group_size", self.group_size)

    @property
    def experts_mxfp4(self) -> bool:
        return self.method == "mxfp4"

    def cpu_problem(self) -> str | None:
        """Why SGLang's K3 cannot load this quantization on the k3_cpu platform (None: it can)."""
        if self.method != "other":
            return None
        return (f"quantization ({self.scheme}): SGLang's K3 on CPU loads unquantised checkpoints or MXFP4 routed "
                "experts (compressed-tensors mxfp4-pack-quantized) only")


MXFP4_FORMAT = "mxfp4-pack-quantized"
MXFP4_IGNORE = ("re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
                "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*")


@dataclass(frozen=True)
class TokenIds:
    bos: int
    eos: int
    pad: int


# ---------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class K3Config:
    hidden_size: int
    num_layers: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    tokens: TokenIds
    kda: KDAConfig
    mla: MLAConfig
    moe: MoEConfig
    attn_res: AttnResConfig
    situ: SiTUConfig
    quant: QuantConfig = field(default_factory=QuantConfig)
    name: str = "custom"

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "vocab_size", "max_position_embeddings"):
            _positive(name, getattr(self, name))
        both = set(self.kda.layer_ids) | set(self.mla.layer_ids)
        _require(not set(self.kda.layer_ids) & set(self.mla.layer_ids), "linear_attn_config.kda_layers",
                 f"layers listed as both KDA and MLA: {sorted(set(self.kda.layer_ids) & set(self.mla.layer_ids))}")
        _require(both == set(range(self.num_layers)), "linear_attn_config.full_attn_layers",
                 f"KDA + MLA layers must cover 1..{self.num_layers} exactly (1-based); missing "
                 f"{sorted(set(range(self.num_layers)) - both)}, extra {sorted(both - set(range(self.num_layers)))}")
        _require(self.num_layers - 1 in self.mla.layer_ids, "linear_attn_config.full_attn_layers", "the last layer must be MLA")
        for name, tok in (("bos_token_id", self.tokens.bos), ("eos_token_id", self.tokens.eos), ("pad_token_id", self.tokens.pad)):
            _require(0 <= tok < self.vocab_size, name, f"{tok} outside vocab_size={self.vocab_size}")
        if self.quant.experts_mxfp4:
            for name in ("routed_expert_hidden_size", "moe_intermediate_size"):
                _require(getattr(self.moe, name) % self.quant.group_size == 0, name,
                         f"{getattr(self.moe, name)} is not a multiple of the MXFP4 group size {self.quant.group_size}")

    # -- layer structure
    def is_kda_layer(self, layer_id: int) -> bool:
        return layer_id in self.kda.layer_ids

    @property
    def num_kda_layers(self) -> int:
        return len(self.kda.layer_ids)

    @property
    def num_mla_layers(self) -> int:
        return len(self.mla.layer_ids)

    # -- memory figures (per request / per token, whole model, one replica)
    def mla_kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """MLA latent cache bytes per token over all MLA layers (27,648 for K3 in bf16)."""
        return self.num_mla_layers * self.mla.kv_bytes_per_token_per_layer(dtype_bytes)

    def kda_state_bytes_per_request(self, ssm_dtype_bytes: int = 4, conv_dtype_bytes: int = 2) -> int:
        """KDA recurrent + conv state over all KDA layers for one request (449,372,160 for K3)."""
        per_layer = self.kda.recurrent_state_bytes(ssm_dtype_bytes) + self.kda.conv_state_bytes(conv_dtype_bytes)
        return self.num_kda_layers * per_layer

    # -- (de)serialisation
    @classmethod
    def from_hf(cls, hf: dict, name: str = "custom") -> "K3Config":
        from k3_sglang.config_hf import parse_hf_config

        return parse_hf_config(hf, name)

    @classmethod
    def from_json(cls, path: str | Path) -> "K3Config":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"invalid K3 config: no config.json at {path}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid K3 config: {path} is not valid JSON ({exc})") from None
        return cls.from_hf(data, name=path.parent.name)

    def to_hf(self) -> dict:
        from k3_sglang.config_hf import to_hf_config

        return to_hf_config(self)


def preset(name: str) -> K3Config:
    """Return a named preset: 'k3-full' or 'k3-tiny'."""
    from k3_sglang.config_presets import PRESETS

    if name not in PRESETS:
        raise ValueError(f"unknown K3 preset {name!r}; choose from {sorted(PRESETS)}")
    return PRESETS[name]()
