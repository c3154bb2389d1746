"""Normalisation references shared by the families."""
from k3_sglang.kernels.norm.naive import rms_norm

__all__ = ["rms_norm"]
