"""MLA family (absorbed decode over the latent cache, unabsorbed prefill, LSE merge)."""
from k3_sglang.kernels.mla.naive import (
    absorb_query,
    merge_attention_states,
    mla_attention_unabsorbed,
    mla_decode_absorbed,
)
from k3_sglang.kernels.norm.naive import rms_norm

__all__ = ["absorb_query", "merge_attention_states", "mla_attention_unabsorbed", "mla_decode_absorbed", "rms_norm"]
