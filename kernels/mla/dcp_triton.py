"""Triton kernel of the k3_dcp_mla contract (`naive.mla_dcp_attention_paged`): one DCP rank's absorbed MLA over its
stripe of a paged latent cache, for decode (one query per request), target verify and prefill chunks (several).

A program takes a block of BQ query tokens of one request times BH heads (BQ * BH rows of one MQA tile: every head
reads the same latent rows) and one split of the rank-local keys. Rank-local key i sits at global position
cp_rank + cp_world * i, in cache row block_table[b, i // P] * P + i % P; a row masks the keys past its own global
position. Online softmax in fp32; a row that sees no key writes o = 0, lse = -inf. With several splits the fp32
partials are merged exactly (decode.merge_attention_states_triton).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from k3_sglang.kernels.mla.dcp_torch import check_dcp_args
from k3_sglang.kernels.mla.decode import default_num_splits, merge_attention_states_triton


@triton.jit
def mla_dcp_kernel(
    q_ptr, kv_ptr, bt_ptr, qb_req_ptr, qb_tok_ptr, q_indptr_ptr, kv_lens_ptr, causal_ptr, o_ptr, lse_ptr,
    scale, T, H, bt_stride, cp_world, cp_rank,
    L: tl.constexpr, C: tl.constexpr, R: tl.constexpr, P: tl.constexpr, BQ: tl.constexpr, BH: tl.constexpr,
    BC: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT_FP32: tl.constexpr,
):
    i_qb, i_hb, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b = tl.load(qb_req_ptr + i_qb).to(tl.int64)
    t0 = tl.load(qb_tok_ptr + i_qb).to(tl.int64)
    q_lo = tl.load(q_indptr_ptr + b).to(tl.int64)
    q_hi = tl.load(q_indptr_ptr + b + 1).to(tl.int64)
    first_pos = tl.load(causal_ptr + b).to(tl.int64) - (q_hi - q_lo)  # global position of the request's 1st query
    mm = tl.arange(0, BQ * BH)
    tok = t0 + mm // BH
    head = i_hb * BH + mm % BH
    row_ok = (tok < q_hi) & (head < H)
    pos = first_pos + tok - q_lo  # [BQ * BH]
    last_pos = first_pos + tl.minimum(t0 + BQ, q_hi) - 1 - q_lo
    lim = tl.where(last_pos >= cp_rank, (last_pos - cp_rank) // cp_world + 1, 0)  # keys any row here can see
    lim = tl.minimum(lim, tl.load(kv_lens_ptr + b).to(tl.int64))
    per = tl.cdiv(lim, NUM_SPLITS)
    s0 = i_s * per
    s1 = tl.minimum(s0 + per, lim)
    cc, rr = tl.arange(0, BC), tl.arange(0, BR)
    mc, mr = cc < C, rr < R
    q_row = q_ptr + (tok * H + head)[:, None] * L
    q_c = tl.load(q_row + cc[None, :], mask=row_ok[:, None] & mc[None, :], other=0.0)
    q_r = tl.load(q_row + C + rr[None, :], mask=row_ok[:, None] & mr[None, :], other=0.0)
    if DOT_FP32:
        q_c, q_r = q_c.to(tl.float32), q_r.to(tl.float32)
    m = tl.full([BQ * BH], float("-inf"), tl.float32)
    denom = tl.zeros([BQ * BH], tl.float32)
    acc = tl.zeros([BQ * BH, BC], tl.float32)
    for n0 in range(s0, s1, BN):
        kk = n0 + tl.arange(0, BN)
        mk = kk < s1
        page = tl.load(bt_ptr + b * bt_stride + kk // P, mask=mk, other=0).to(tl.int64)
        rows = page * P + kk % P
        k_c = tl.load(kv_ptr + rows[:, None] * L + cc[None, :], mask=mk[:, None] & mc[None, :], other=0.0)
        k_r = tl.load(kv_ptr + rows[:, None] * L + C + rr[None, :], mask=mk[:, None] & mr[None, :], other=0.0)
        if DOT_FP32:
            k_c, k_r = k_c.to(tl.float32), k_r.to(tl.float32)
            s = tl.dot(q_c, tl.trans(k_c), input_precision="ieee") + tl.dot(q_r, tl.trans(k_r), input_precision="ieee")
        else:
            s = tl.dot(q_c, tl.trans(k_c)) + tl.dot(q_r, tl.trans(k_r))
        key_pos = cp_rank + cp_world * kk
        seen = mk[None, :] & (key_pos[None, :] <= pos[:, None])
        s = tl.where(seen, s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen yet stays at 0 weight
        alpha = tl.exp(m - shift)
        p = tl.exp(s - shift[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        if DOT_FP32:
            acc = acc * alpha[:, None] + tl.dot(p, k_c, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(k_c.dtype), k_c)
        m = m_new
    nonempty = denom > 0
    o = tl.where(nonempty[:, None], acc / tl.where(nonempty, denom, 1.0)[:, None], 0.0)
    lse = tl.where(nonempty, m + tl.log(tl.where(nonempty, denom, 1.0)), float("-inf"))
    out = (i_s * T + tok) * H + head
    tl.store(o_ptr + out[:, None] * C + cc[None, :], o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & mc[None, :])
    tl.store(lse_ptr + out, lse, mask=row_ok)


def query_blocks(q_indptr: torch.Tensor, block: int, q_len: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(request [NQB] int32, first query row [NQB] int32) of every block of `block` queries of a request. With every
    request holding q_len queries the list is built on the device without a host sync."""
    b = q_indptr.shape[0] - 1
    dev = q_indptr.device
    if q_len is not None:
        per = triton.cdiv(q_len, block)
        idx = torch.arange(b * per, device=dev, dtype=torch.int32)
        req = idx // per
        return req, req * q_len + (idx % per) * block
    lens = (q_indptr[1:] - q_indptr[:-1]).long()
    per = (lens + block - 1) // block
    req = torch.repeat_interleave(torch.arange(b, device=dev), per)
    first = torch.zeros(b + 1, dtype=torch.long, device=dev)
    torch.cumsum(per, 0, out=first[1:])
    local = torch.arange(req.shape[0], device=dev) - first[:-1][req]
    return req.to(torch.int32), (q_indptr.long()[req] + local * block).to(torch.int32)


@dataclass(frozen=True)
class LaunchConfig:
    """One program's tile: `heads` (BH) x `queries` (BQ) rows against `keys` (BN) keys per step, and its warps and
    software-pipeline stages."""

    heads: int
    queries: int
    keys: int
    num_warps: int
    num_stages: int


def launch_config(h: int, q_len: int | None) -> LaunchConfig:
    """The tile for h query heads per rank and q_len queries per request (None: ragged prefill chunks).

    Rows (BH heads x BQ queries): up to 32 heads of one query, so the 96 heads of a GB300 TP8/DCP8 rank stream their
    keys 3 times, not 6; decode fills 16 rows with queries of one request only when there are fewer heads (there is
    one query), verify and prefill chunks fill 32. Always 8 warps: at 4 warps the fp32 accumulator [rows, 512] and
    the query tile leave ptxas at 255 registers with spills (16 rows, sm_100a) or spills outright (32 rows). Keys per
    step: 16 at 32 rows and 32 at 16 rows, the same [rows, keys] score tile, so that with 3 stages a program needs
    about 96-128 registers and 55 KB shared on sm_90a and sm_100a and two programs fit on an SM (16 warps), where
    32 keys at 32 rows took 160-184 registers and one (docs/kernels.md, `k3 bench kernels --static`)."""
    bh = max(1, min(32, triton.next_power_of_2(h)))
    bq = max(1, (16 if q_len == 1 else 32) // bh)
    return LaunchConfig(bh, bq, 512 // (bh * bq), 8, 3)


def use_fp32_dots(dtype: torch.dtype) -> bool:
    """fp32 inputs: exact fp32 dots (no TF32); 16-bit: tensor-core dots. The CPU interpreter cannot dot 16-bit
    floats, so under TRITON_INTERPRET=1 16-bit inputs take the fp32 branch (tests may patch this)."""
    return dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"


# Split partials stay under this many bytes (fp32 [splits, T, H, v_dim]); beyond it the kernel runs unsplit.
PARTIALS_BYTES = 64 << 20


def mla_dcp_attention_triton(
    q_lat: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, q_indptr: torch.Tensor,
    kv_lens: torch.Tensor, causal_seqs: torch.Tensor, page_size: int, cp_world: int, cp_rank: int, v_dim: int,
    scale: float, q_len: int | None = None, num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The contract of `naive.mla_dcp_attention_paged` (arguments as `dcp_torch.mla_dcp_attention_torch`).

    q_len: every request holds exactly q_len queries (decode 1, target verify the draft width): no host sync for the
    block list. num_splits None picks a KV split count from the longest stripe (a host sync).
    Returns (o [T, H, v_dim] in q_lat.dtype, lse [T, H] fp32, natural log)."""
    check_dcp_args("mla_dcp_attention_triton", q_lat, kv_cache, block_table, q_indptr, kv_lens, causal_seqs,
                   page_size, cp_world, cp_rank, v_dim)
    if kv_cache.dtype != q_lat.dtype:
        raise ValueError(f"mla_dcp_attention_triton: kv_cache is {kv_cache.dtype}, q_lat {q_lat.dtype}")
    q_lat, kv_cache, block_table = q_lat.contiguous(), kv_cache.contiguous(), block_table.contiguous()
    t, h, width = q_lat.shape
    cfg = launch_config(h, q_len)
    bh, bq = cfg.heads, cfg.queries
    qb_req, qb_tok = query_blocks(q_indptr, bq, q_len)
    head_blocks = triton.cdiv(h, bh)
    if num_splits is None:
        longest = int(kv_lens.max().item()) if kv_lens.numel() else 0
        num_splits = default_num_splits(qb_req.shape[0], head_blocks, longest, q_lat.device)
        num_splits = max(1, min(num_splits, PARTIALS_BYTES // max(1, t * h * v_dim * 4)))
    lse = torch.empty(num_splits, t, h, dtype=torch.float32, device=q_lat.device)
    if num_splits == 1:
        o = torch.empty(1, t, h, v_dim, dtype=q_lat.dtype, device=q_lat.device)
    else:
        o = torch.empty(num_splits, t, h, v_dim, dtype=torch.float32, device=q_lat.device)
    if qb_req.shape[0] == 0 or t == 0:
        return o[0].zero_().to(q_lat.dtype), lse[0].fill_(float("-inf"))
    dot_fp32 = use_fp32_dots(q_lat.dtype)
    mla_dcp_kernel[(qb_req.shape[0], head_blocks, num_splits)](
        q_lat, kv_cache, block_table, qb_req, qb_tok, q_indptr, kv_lens, causal_seqs, o, lse, scale, t, h,
        block_table.stride(0), cp_world, cp_rank, L=width, C=v_dim, R=width - v_dim, P=page_size, BQ=bq, BH=bh,
        BC=max(16, triton.next_power_of_2(v_dim)), BR=max(16, triton.next_power_of_2(width - v_dim)), BN=cfg.keys,
        NUM_SPLITS=num_splits, DOT_FP32=dot_fp32, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if num_splits == 1:
        return o[0], lse[0]
    merged, merged_lse = merge_attention_states_triton(o, lse)
    return merged.to(q_lat.dtype), merged_lse
