"""Block Attention Residuals family."""
from k3_sglang.kernels.attn_res.naive import attn_res_read

__all__ = ["attn_res_read"]
