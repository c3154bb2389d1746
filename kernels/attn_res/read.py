"""Triton: the AttnRes read in one pass per token (two sweeps over D: statistics, then the weighted sum)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_CANDIDATES = 16


@triton.jit
def attn_res_read_kernel(c_ptr, w_ptr, out_ptr, N, D, stride_n, stride_t, eps, BN: tl.constexpr, BD: tl.constexpr):
    i_t = tl.program_id(0)
    nn = tl.arange(0, BN)
    mn = nn < N
    base = c_ptr + nn[:, None].to(tl.int64) * stride_n + i_t.to(tl.int64) * stride_t
    sq = tl.zeros([BN], tl.float32)
    dot = tl.zeros([BN], tl.float32)
    for d0 in range(0, D, BD):
        dd = d0 + tl.arange(0, BD)
        md = dd < D
        v = tl.load(base + dd[None, :], mask=mn[:, None] & md[None, :], other=0.0).to(tl.float32)
        w = tl.load(w_ptr + dd, mask=md, other=0.0).to(tl.float32)
        sq += tl.sum(v * v, 1)
        dot += tl.sum(v * w[None, :], 1)
    score = tl.where(mn, dot * tl.rsqrt(sq / D + eps), float("-inf"))
    alpha = tl.exp(score - tl.max(score, 0))
    alpha = alpha / tl.sum(alpha, 0)
    for d0 in range(0, D, BD):
        dd = d0 + tl.arange(0, BD)
        md = dd < D
        v = tl.load(base + dd[None, :], mask=mn[:, None] & md[None, :], other=0.0).to(tl.float32)
        out = tl.sum(alpha[:, None] * v, 0)
        tl.store(out_ptr + i_t.to(tl.int64) * D + dd, out.to(out_ptr.dtype.element_ty), mask=md)


def attn_res_read_triton(candidates: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """candidates [N, T, D] (N <= 16; any strides with a contiguous last dim), weight [D]. Returns [T, D]."""
    if candidates.dim() != 3 or not 1 <= candidates.shape[0] <= MAX_CANDIDATES or weight.shape != (candidates.shape[-1],):
        raise ValueError(
            f"attn_res_read: candidates {tuple(candidates.shape)} must be [N, T, D] with 1 <= N <= {MAX_CANDIDATES}, "
            f"weight {tuple(weight.shape)} [D]"
        )
    assert candidates.stride(-1) == 1 and weight.is_contiguous(), "attn_res_read: last dim must be contiguous"
    N, T, D = candidates.shape
    out = torch.empty(T, D, dtype=candidates.dtype, device=candidates.device)
    BN = max(2, triton.next_power_of_2(N))
    BD = max(64, min(triton.next_power_of_2(D), 8192 // BN))  # [BN, BD] fp32 tile: <= 64 registers per thread
    attn_res_read_kernel[(T,)](candidates, weight, out, N, D, candidates.stride(0), candidates.stride(1), eps,
                               BN=BN, BD=BD, num_warps=4)
    return out
