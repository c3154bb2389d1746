"""MXFP4 family: decode (and encode, for test checkpoints) of routed-expert weights; grouped expert matmul."""
from k3_sglang.kernels.mxfp4.naive import dequant_mxfp4, mxfp4_grouped_matmul, quant_mxfp4

__all__ = ["dequant_mxfp4", "mxfp4_grouped_matmul", "quant_mxfp4"]
