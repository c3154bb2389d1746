"""KDA (Kimi Delta Attention) family: references in `naive`, Triton kernels beside them."""
from k3_sglang.kernels.kda.naive import (
    chunk_kda,
    gated_rms_norm,
    kda_gate,
    kda_recurrent_step,
    l2_normalize,
    naive_recurrent_kda,
    short_conv_silu,
)

__all__ = [
    "chunk_kda",
    "gated_rms_norm",
    "kda_gate",
    "kda_recurrent_step",
    "l2_normalize",
    "naive_recurrent_kda",
    "short_conv_silu",
]
