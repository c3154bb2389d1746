"""Pure-PyTorch reference for the Block Attention Residuals read, design doc §2.5."""
from __future__ import annotations

import torch

from k3_sglang.kernels.norm.naive import compute_dtype


def attn_res_read(candidates: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Depth-wise softmax read over the bank entries and the live stream.

    candidates [N, T, D] (bank entries then live), weight [D] (the fused res_norm.w * res_proj.w).
    key_i = v_i * rsqrt(mean(v_i^2) + eps) (fp32); score_i = sum_c weight[c] * key_i[c]; alpha = softmax over N;
    returns sum_i alpha_i * v_i [T, D] in candidates.dtype.
    """
    if candidates.dim() != 3 or candidates.shape[0] < 1 or weight.shape != (candidates.shape[-1],):
        raise ValueError(f"attn_res_read: candidates {tuple(candidates.shape)} must be [N>=1, T, D], weight {tuple(weight.shape)} [D]")
    dt = compute_dtype(candidates)
    v = candidates.to(dt)
    key = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    alpha = (key @ weight.to(dt)).softmax(0)  # [N, T]
    return (alpha[..., None] * v).sum(0).to(candidates.dtype)
