"""KDA (Kimi Delta Attention) family: references in `naive`, pooled torch ops in `naive_decode`, Triton kernels in
`fused_recurrent` (decode / verify) and `chunk` (varlen prefill). Triton modules are not imported here."""
from k3_sglang.kernels.kda.decode_common import KDAOptions, KDAWeights, VerifyScratch
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
    "KDAOptions",
    "KDAWeights",
    "VerifyScratch",
    "chunk_kda",
    "gated_rms_norm",
    "kda_gate",
    "kda_recurrent_step",
    "l2_normalize",
    "naive_recurrent_kda",
    "short_conv_silu",
]
