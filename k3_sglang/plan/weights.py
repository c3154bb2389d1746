"""Weight bytes of K3, from the config's shapes (checkpoint layout in k3-architecture.md section 4).

Each layer's bytes are split by how SGLang places them on GPUs:
  attention  - sharded over the attention-TP ranks (q/k/v/g/o, MLA up/down projections)
  mlp        - sharded over TP (layer 0's dense FFN, the shared experts)
  routed     - sharded over TP (EP x MoE-TP = TP): 896 experts, MXFP4 or bf16
  replicated - on every GPU (norms, AttnRes projections, router gate, latent down/up projections)
For k3-full with MXFP4 experts the sum is the published text checkpoint, 1,559,965,606,912 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from k3_sglang.config import K3Config

BF16 = 2
FP32 = 4
A_LOG_STORED_LEN = 128  # the checkpoint stores KDA's A_log padded to 128 entries (96 used)


@dataclass(frozen=True)
class LayerWeights:
    """Bytes of one decoder layer (or of the global tensors), by placement class."""

    attention: int = 0
    mlp: int = 0
    routed: int = 0
    replicated: int = 0

    @property
    def total(self) -> int:
        """All bytes of the layer."""
        return self.attention + self.mlp + self.routed + self.replicated

    def __add__(self, other: "LayerWeights") -> "LayerWeights":
        return LayerWeights(self.attention + other.attention, self.mlp + other.mlp,
                            self.routed + other.routed, self.replicated + other.replicated)


def expert_bytes(cfg: K3Config, mxfp4: bool) -> int:
    """One routed expert (w1, w3: [I, latent]; w2: [latent, I]); MXFP4 = E2M1 nibbles + one E8M0 per group."""
    elements = 3 * cfg.moe.moe_intermediate_size * cfg.moe.routed_expert_hidden_size
    if not mxfp4:
        return elements * BF16
    return elements // 2 + elements // cfg.quant.group_size


def _common_layer(cfg: K3Config, gate_out: int) -> LayerWeights:
    """Every layer: 4 norms and 2 AttnRes projections (replicated), output gate and o_proj (attention)."""
    h = cfg.hidden_size
    return LayerWeights(attention=2 * gate_out * h * BF16, replicated=6 * h * BF16)


def kda_attention(cfg: K3Config) -> LayerWeights:
    """A KDA layer's attention: q/k/v, short convs (fp32), decay-gate low rank, beta, A_log, dt_bias, o_norm."""
    k, h, p = cfg.kda, cfg.hidden_size, cfg.kda.proj_dim
    sharded = (3 * p * h + k.head_dim * h + p * k.head_dim + k.num_heads * h) * BF16
    sharded += (3 * p * k.conv_kernel_size + p) * FP32
    small = (max(k.num_heads, A_LOG_STORED_LEN) + k.head_dim) * FP32
    return _common_layer(cfg, p) + LayerWeights(attention=sharded, replicated=small)


def mla_q_projection_bytes(cfg: K3Config) -> int:
    """q_b_proj + W_UK (k half of kv_b_proj) of one MLA layer: what --dcp-replicate-q-proj gathers."""
    m = cfg.mla
    q_b = m.num_heads * m.qk_head_dim * m.q_lora_rank
    w_kc = m.num_heads * m.qk_nope_head_dim * m.kv_lora_rank
    return (q_b + w_kc) * BF16


def mla_attention(cfg: K3Config) -> LayerWeights:
    """An MLA layer's attention: q_a/q_b, kv_a (latent + rope), kv_b, their norms."""
    m, h = cfg.mla, cfg.hidden_size
    sharded = (m.q_lora_rank * h + m.num_heads * m.qk_head_dim * m.q_lora_rank + m.latent_dim * h
               + m.num_heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank) * BF16
    norms = (m.q_lora_rank + m.kv_lora_rank) * BF16
    return _common_layer(cfg, m.num_heads * m.v_head_dim) + LayerWeights(attention=sharded, replicated=norms)


def ffn(cfg: K3Config, layer_id: int, mxfp4: bool) -> LayerWeights:
    """The layer's FFN: dense SiTU-GLU (layer 0) or the latent MoE (router, latent proj, shared, routed)."""
    moe, h = cfg.moe, cfg.hidden_size
    if not moe.is_moe_layer(layer_id):
        return LayerWeights(mlp=3 * moe.dense_intermediate_size * h * BF16)
    latent = moe.routed_expert_hidden_size
    router = moe.num_experts * h * BF16 + moe.num_experts * FP32
    latent_proj = (2 * latent * h + latent) * BF16
    shared = 3 * moe.shared_intermediate_size * h * BF16
    return LayerWeights(mlp=shared, routed=moe.num_experts * expert_bytes(cfg, mxfp4),
                        replicated=router + latent_proj)


def layer_weights(cfg: K3Config, layer_id: int, mxfp4: bool) -> LayerWeights:
    """All bytes of decoder layer `layer_id` (0-based)."""
    attention = kda_attention(cfg) if cfg.is_kda_layer(layer_id) else mla_attention(cfg)
    return attention + ffn(cfg, layer_id, mxfp4)


def embedding_bytes(cfg: K3Config) -> int:
    """Input embedding [vocab, hidden] bf16 (vocab-parallel over TP)."""
    return cfg.vocab_size * cfg.hidden_size * BF16


def lm_head_bytes(cfg: K3Config) -> int:
    """Output head, absent when tied to the embedding."""
    return 0 if cfg.tie_word_embeddings else embedding_bytes(cfg)


def final_norm_bytes(cfg: K3Config) -> int:
    """model.norm, output_attn_res_norm and output_attn_res_proj (replicated on the last stage)."""
    return 3 * cfg.hidden_size * BF16


def checkpoint_bytes(cfg: K3Config, mxfp4: bool = True) -> int:
    """All text-model weight bytes (1,559,965,606,912 for k3-full with MXFP4 experts)."""
    layers = sum(layer_weights(cfg, i, mxfp4).total for i in range(cfg.num_layers))
    return layers + embedding_bytes(cfg) + lm_head_bytes(cfg) + final_norm_bytes(cfg)
