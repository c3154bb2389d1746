"""Triton: absorbed MLA decode over the paged 576-wide latent pool (flash-decoding split over the KV length), and
the exact merge of partial (output, lse) pairs.

A (request, head block, split) program streams its share of the request's latent rows once for BH heads
(MQA: every head reads the same rows), with an online softmax in fp32. Partials are [P, B, Hh, v_dim] / [P, B, Hh]
and go through merge_attention_states_triton, which DCP can call with partials from other ranks too.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from k3_sglang.kernels.mla.naive import check_decode_args


@triton.jit
def mla_decode_split_kernel(
    q_ptr, kv_ptr, idx_ptr, indptr_ptr, o_ptr, lse_ptr, scale, B, Hh,
    L: tl.constexpr, C: tl.constexpr, R: tl.constexpr, BH: tl.constexpr, BC: tl.constexpr, BR: tl.constexpr,
    BN: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT_FP32: tl.constexpr,
):
    i_b, i_hb, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start = tl.load(indptr_ptr + i_b).to(tl.int64)
    end = tl.load(indptr_ptr + i_b + 1).to(tl.int64)
    per = tl.cdiv(end - start, NUM_SPLITS)
    s0 = start + i_s * per
    s1 = tl.minimum(s0 + per, end)
    hh = i_hb * BH + tl.arange(0, BH)
    cc, rr = tl.arange(0, BC), tl.arange(0, BR)
    mh, mc, mr = hh < Hh, cc < C, rr < R
    q_row = q_ptr + (i_b * Hh + hh)[:, None] * L
    q_c = tl.load(q_row + cc[None, :], mask=mh[:, None] & mc[None, :], other=0.0)
    q_r = tl.load(q_row + C + rr[None, :], mask=mh[:, None] & mr[None, :], other=0.0)
    if DOT_FP32:
        q_c, q_r = q_c.to(tl.float32), q_r.to(tl.float32)
    m = tl.full([BH], float("-inf"), tl.float32)
    denom = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, BC], tl.float32)
    for n0 in range(s0, s1, BN):
        nn = n0 + tl.arange(0, BN)
        mn = nn < s1
        rows = tl.load(idx_ptr + nn, mask=mn, other=0).to(tl.int64)
        k_c = tl.load(kv_ptr + rows[:, None] * L + cc[None, :], mask=mn[:, None] & mc[None, :], other=0.0)
        k_r = tl.load(kv_ptr + rows[:, None] * L + C + rr[None, :], mask=mn[:, None] & mr[None, :], other=0.0)
        if DOT_FP32:
            k_c, k_r = k_c.to(tl.float32), k_r.to(tl.float32)
            s = tl.dot(q_c, tl.trans(k_c), input_precision="ieee") + tl.dot(q_r, tl.trans(k_r), input_precision="ieee")
        else:
            s = tl.dot(q_c, tl.trans(k_c)) + tl.dot(q_r, tl.trans(k_r))
        s = s * scale
        s = tl.where(mn[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        if DOT_FP32:
            acc = acc * alpha[:, None] + tl.dot(p, k_c, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(k_c.dtype), k_c)
        m = m_new
    nonempty = denom > 0
    o = tl.where(nonempty[:, None], acc / tl.where(nonempty, denom, 1.0)[:, None], 0.0)
    lse = tl.where(nonempty, m + tl.log(tl.where(nonempty, denom, 1.0)), float("-inf"))
    part = (i_s * B + i_b) * Hh + hh
    tl.store(o_ptr + part[:, None] * C + cc[None, :], o.to(o_ptr.dtype.element_ty), mask=mh[:, None] & mc[None, :])
    tl.store(lse_ptr + part, lse, mask=mh)


@triton.jit
def merge_states_kernel(o_ptr, lse_ptr, out_ptr, out_lse_ptr, P, rows, D, BD: tl.constexpr):
    i_r, i_d = tl.program_id(0), tl.program_id(1)
    dd = i_d * BD + tl.arange(0, BD)
    md = dd < D
    m = tl.load(lse_ptr + i_r).to(tl.float32)
    for p in range(1, P):
        m = tl.maximum(m, tl.load(lse_ptr + p * rows + i_r).to(tl.float32))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = m_safe * 0.0
    acc = tl.zeros([BD], tl.float32)
    for p in range(P):
        w = tl.exp(tl.load(lse_ptr + p * rows + i_r).to(tl.float32) - m_safe)
        o = tl.load(o_ptr + (p * rows + i_r) * D + dd, mask=md, other=0.0).to(tl.float32)
        acc += tl.where(w > 0, w * o, 0.0)  # an empty partial (lse = -inf) is ignored even if its o is NaN
        total += w
    out = tl.where(total > 0, acc / tl.where(total > 0, total, 1.0), 0.0)
    tl.store(out_ptr + i_r * D + dd, out.to(out_ptr.dtype.element_ty), mask=md)
    if i_d == 0:
        tl.store(out_lse_ptr + i_r, m + tl.log(total))


def merge_attention_states_triton(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact merge of P >= 1 partials: outs [P, B, H, D], lses [P, B, H] fp32 (-inf = empty partial).

    Returns (o [B, H, D] in outs.dtype, lse [B, H] fp32); all-empty gives o = 0, lse = -inf.
    """
    if outs.dim() != 4 or tuple(lses.shape) != tuple(outs.shape[:3]) or outs.shape[0] < 1:
        raise ValueError(f"merge_attention_states: outs {tuple(outs.shape)} must be [P>=1, B, H, D], lses {tuple(lses.shape)} [P, B, H]")
    assert outs.is_contiguous() and lses.is_contiguous(), "merge_attention_states: partials must be contiguous"
    P, B, H, D = outs.shape
    out = torch.empty(B, H, D, dtype=outs.dtype, device=outs.device)
    out_lse = torch.empty(B, H, dtype=torch.float32, device=outs.device)
    BD = min(triton.next_power_of_2(D), 512)
    merge_states_kernel[(B * H, triton.cdiv(D, BD))](outs, lses, out, out_lse, P, B * H, D, BD=BD)
    return out, out_lse


def default_num_splits(B: int, head_blocks: int, longest: int, device: torch.device) -> int:
    """Enough splits for ~2 programs per SM, but at least 256 rows per split and at most 64 splits."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    want = triton.cdiv(2 * sms, max(1, B * head_blocks))
    return max(1, min(64, want, triton.cdiv(longest, 256)))


def mla_decode_absorbed_triton(
    q_lat: torch.Tensor, kv_cache: torch.Tensor, kv_indices: torch.Tensor, kv_indptr: torch.Tensor, v_dim: int,
    scale: float, num_splits: int | None = None, return_partials: bool = False,
):
    """Absorbed MLA decode with LSE, split over the KV length.

    q_lat [B, Hh, L], kv_cache [N, L] (same dtype), kv_indices [sum_lens] int row ids, kv_indptr [B+1] int.
    num_splits None picks a split count from the longest request (a host sync; pass it for CUDA graphs).
    Returns (o_lat [B, Hh, v_dim] in q_lat.dtype, lse [B, Hh] fp32), or with return_partials the unmerged
    ([P, B, Hh, v_dim], [P, B, Hh]) pair.
    """
    check_decode_args("mla_decode_absorbed", q_lat, kv_cache, kv_indices, kv_indptr, v_dim)
    if kv_cache.dtype != q_lat.dtype:
        raise ValueError(f"mla_decode_absorbed: kv_cache {tuple(kv_cache.shape)} is {kv_cache.dtype}, q_lat {q_lat.dtype}")
    assert q_lat.is_contiguous() and kv_cache.is_contiguous(), "mla_decode_absorbed: q_lat and kv_cache must be contiguous"
    B, Hh, L = q_lat.shape
    BH = max(16, min(32, triton.next_power_of_2(Hh)))  # [BH, 512] fp32 accumulator per program
    if num_splits is None:
        longest = int((kv_indptr[1:] - kv_indptr[:-1]).max().item()) if B else 0
        num_splits = default_num_splits(B, triton.cdiv(Hh, BH), longest, q_lat.device)
    parts = torch.empty(num_splits, B, Hh, v_dim, dtype=torch.float32, device=q_lat.device)
    lses = torch.empty(num_splits, B, Hh, dtype=torch.float32, device=q_lat.device)
    # fp32 inputs: exact fp32 dots (no TF32). bf16/fp16: tensor-core dots, p rounded to the cache dtype. The CPU
    # interpreter cannot dot 16-bit floats, so there the tiles are upcast.
    dot_fp32 = q_lat.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"
    mla_decode_split_kernel[(B, triton.cdiv(Hh, BH), num_splits)](
        q_lat, kv_cache, kv_indices, kv_indptr, parts, lses, scale, B, Hh, L=L, C=v_dim, R=L - v_dim, BH=BH,
        BC=max(16, triton.next_power_of_2(v_dim)), BR=max(16, triton.next_power_of_2(L - v_dim)), BN=32,
        NUM_SPLITS=num_splits, DOT_FP32=dot_fp32, num_warps=4 if BH <= 16 else 8,
    )
    if return_partials:
        return parts, lses
    o, lse = merge_attention_states_triton(parts, lses)
    return o.to(q_lat.dtype), lse
