"""MXFP4 family: decode (and encode, for test checkpoints) of routed-expert weights."""
from k3_sglang.kernels.mxfp4.naive import dequant_mxfp4, quant_mxfp4

__all__ = ["dequant_mxfp4", "quant_mxfp4"]
