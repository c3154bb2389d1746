"""Reference RMSNorm (KimiRMSNorm semantics)."""
from __future__ import annotations

import torch


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 when any input is float64, else float32: the dtype every reference computes in."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim.

    x [..., D], weight [D]. Normalises in fp32 (fp64 for fp64 input), casts back to x.dtype, then multiplies by
    weight (cast to x.dtype). Returns [..., D] in x.dtype.
    """
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"rms_norm: weight {tuple(weight.shape)} must be [D] with D = x.shape[-1] of {tuple(x.shape)}")
    xf = x.to(compute_dtype(x))
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y.to(x.dtype) * weight.to(x.dtype)
