"""KDA (Kimi Delta Attention) family: the float64-capable references in `naive` (SGLang's K3 on CPU runs its chunked
form, k3_sglang/sglang_cpu/kda_ops.py) and the packed-chain layout of a verify in `chains`. On a GPU, SGLang's own
KDA kernels serve; no Triton KDA kernel of ours remains."""
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
