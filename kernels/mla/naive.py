"""Pure-PyTorch references for K3's gated MLA (NoPE), design doc §2.2.

Unabsorbed prefill form (qk dim Dn + Dr, value dim Dv per head) and absorbed decode form (MQA over the 576-wide
latent [c (512) | k_pe (64)], value = the first 512 columns), plus the exact merge of partial attention states.
Compute is float32 (float64 for float64 inputs); outputs are in the query dtype, LSEs in float32/float64.
"""
from __future__ import annotations

import torch

from k3_sglang.kernels.norm.naive import compute_dtype


def mla_attention_unabsorbed(
    q_nope: torch.Tensor, q_pe: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor,
    scale: float, q_offset: int,
) -> torch.Tensor:
    """Causal MLA attention, per head, no RoPE.

    q_nope [T, Hh, Dn], q_pe [T, Hh, Dr], k_nope [S, Hh, Dn], k_pe [S, Dr] (shared by all heads), v [S, Hh, Dv],
    S == q_offset + T; query i sits at absolute position q_offset + i and attends keys 0..q_offset + i.
    Returns o [T, Hh, Dv] in q_nope.dtype.
    """
    T, Hh, Dn = q_nope.shape
    S = k_nope.shape[0]
    if S != q_offset + T:
        raise ValueError(f"mla_attention_unabsorbed: k_nope {tuple(k_nope.shape)} needs S == q_offset + T = {q_offset + T}")
    if tuple(q_pe.shape[:2]) != (T, Hh) or tuple(k_nope.shape[1:]) != (Hh, Dn) or k_pe.shape != (S, q_pe.shape[2]):
        raise ValueError(
            f"mla_attention_unabsorbed: q_pe {tuple(q_pe.shape)}, k_nope {tuple(k_nope.shape)}, k_pe {tuple(k_pe.shape)} "
            f"do not match q_nope {tuple(q_nope.shape)}"
        )
    if tuple(v.shape[:2]) != (S, Hh):
        raise ValueError(f"mla_attention_unabsorbed: v {tuple(v.shape)} must be [S, Hh, Dv] with S={S}, Hh={Hh}")
    dt = compute_dtype(q_nope, q_pe, k_nope, k_pe, v)
    scores = torch.einsum("thd,shd->hts", q_nope.to(dt), k_nope.to(dt))
    scores = (scores + torch.einsum("thd,sd->hts", q_pe.to(dt), k_pe.to(dt))) * scale
    pos_q = torch.arange(T, device=q_nope.device)[:, None] + q_offset
    pos_k = torch.arange(S, device=q_nope.device)[None, :]
    scores = scores.masked_fill(pos_k > pos_q, float("-inf"))
    o = torch.einsum("hts,shd->thd", scores.softmax(-1), v.to(dt))
    return o.to(q_nope.dtype)


def absorb_query(q_nope: torch.Tensor, q_pe: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """Absorb W_UK into the query.

    q_nope [T, Hh, Dn], q_pe [T, Hh, Dr], w_uk [Hh, Dn, C] (per head, the k_nope rows of kv_b_proj).
    Returns q_lat [T, Hh, C + Dr] = [q_nope_h @ W_UK,h | q_pe_h] in q_nope.dtype.
    """
    T, Hh, Dn = q_nope.shape
    if w_uk.dim() != 3 or tuple(w_uk.shape[:2]) != (Hh, Dn) or tuple(q_pe.shape[:2]) != (T, Hh):
        raise ValueError(
            f"absorb_query: w_uk {tuple(w_uk.shape)} must be [Hh, Dn, C] = [{Hh}, {Dn}, C], q_pe {tuple(q_pe.shape)} "
            f"[T, Hh, Dr]"
        )
    dt = compute_dtype(q_nope, w_uk)
    q_c = torch.einsum("thd,hdc->thc", q_nope.to(dt), w_uk.to(dt))
    return torch.cat([q_c, q_pe.to(dt)], -1).to(q_nope.dtype)


def check_decode_args(name, q_lat, kv_cache, kv_indices, kv_indptr, v_dim) -> None:
    """Shared ValueError checks for the absorbed decode (the reference and the Triton op)."""
    if q_lat.dim() != 3 or kv_cache.dim() != 2 or q_lat.shape[-1] != kv_cache.shape[-1]:
        raise ValueError(f"{name}: q_lat {tuple(q_lat.shape)} must be [B, Hh, L], kv_cache {tuple(kv_cache.shape)} [N, L]")
    if kv_indptr.dim() != 1 or kv_indptr.shape[0] != q_lat.shape[0] + 1 or kv_indices.dim() != 1:
        raise ValueError(
            f"{name}: kv_indptr {tuple(kv_indptr.shape)} must be [B+1] for q_lat {tuple(q_lat.shape)}, "
            f"kv_indices {tuple(kv_indices.shape)} 1-D"
        )
    if not 0 < v_dim <= q_lat.shape[-1]:
        raise ValueError(f"{name}: v_dim={v_dim} must be in (0, L={q_lat.shape[-1]}]")


def mla_decode_absorbed(
    q_lat: torch.Tensor, kv_cache: torch.Tensor, kv_indices: torch.Tensor, kv_indptr: torch.Tensor, v_dim: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA decode (MQA over the latent pool).

    q_lat [B, Hh, L] (L = C + Dr = 576 for K3), kv_cache [N, L] latent rows, kv_indices [sum_lens] int64 row ids,
    kv_indptr [B+1]: request b reads rows kv_indices[kv_indptr[b]:kv_indptr[b+1]]; the value is the first v_dim
    columns of each row. Returns (o_lat [B, Hh, v_dim] in q_lat.dtype, lse [B, Hh] float32 natural log-sum-exp of
    the scaled scores; -inf and o = 0 for an empty request).
    """
    check_decode_args("mla_decode_absorbed", q_lat, kv_cache, kv_indices, kv_indptr, v_dim)
    B, Hh, _ = q_lat.shape
    dt = compute_dtype(q_lat, kv_cache)
    o = torch.zeros(B, Hh, v_dim, dtype=dt, device=q_lat.device)
    lse = torch.full((B, Hh), float("-inf"), dtype=dt, device=q_lat.device)
    bounds = kv_indptr.tolist()
    for b in range(B):
        if bounds[b + 1] <= bounds[b]:
            continue
        rows = kv_cache[kv_indices[bounds[b]:bounds[b + 1]].long()].to(dt)  # [n, L]
        s = (q_lat[b].to(dt) @ rows.T) * scale  # [Hh, n]
        lse[b] = torch.logsumexp(s, -1)
        o[b] = (s - lse[b][:, None]).exp() @ rows[:, :v_dim]
    return o.to(q_lat.dtype), lse.to(torch.float64 if dt == torch.float64 else torch.float32)


def merge_attention_states(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact merge of P partial attention states (e.g. KV splits or DCP ranks).

    outs [P, B, H, D], lses [P, B, H] (-inf marks an empty partial; its output is ignored, even if NaN).
    lse = logsumexp_p(lse_p), o = sum_p exp(lse_p - lse) * o_p. All-empty gives o = 0, lse = -inf, no NaN.
    Returns (o [B, H, D] in outs.dtype, lse [B, H] in lses.dtype).
    """
    if outs.dim() != 4 or tuple(lses.shape) != tuple(outs.shape[:3]):
        raise ValueError(f"merge_attention_states: outs {tuple(outs.shape)} must be [P, B, H, D], lses {tuple(lses.shape)} [P, B, H]")
    dt = compute_dtype(outs, lses)
    lf = lses.to(dt)
    lse = torch.logsumexp(lf, 0)
    empty = torch.isneginf(lse)
    w = (lf - torch.where(empty, 0.0, lse)).exp()  # [P, B, H]; 0 for empty partials
    contrib = torch.where((w > 0)[..., None], w[..., None] * outs.to(dt), 0.0)
    return contrib.sum(0).to(outs.dtype), lse.to(lses.dtype)


def mla_extend_absorbed(
    q_lat: torch.Tensor, kv_cache: torch.Tensor, kv_indices: torch.Tensor, q_indptr: list[int], kv_indptr: list[int],
    q_start: list[int], v_dim: int, scale: float, kv_offset: int = 0, kv_stride: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA extend, one request at a time with a full softmax (the reference for the tiled path).

    q_lat [T, Hh, L]; request b's queries are rows q_indptr[b]:q_indptr[b+1], the j-th at absolute position
    q_start[b] + j; its keys are kv_cache[kv_indices[kv_indptr[b]:kv_indptr[b+1]]], the i-th at position
    kv_offset + kv_stride * i. A query sees its request's keys at positions <= its own.
    Returns (o_lat [T, Hh, v_dim] in q_lat.dtype, lse [T, Hh]; o = 0 and lse = -inf where no key is visible).
    """
    T, Hh, _ = q_lat.shape
    dt = compute_dtype(q_lat, kv_cache)
    o = torch.zeros(T, Hh, v_dim, dtype=dt, device=q_lat.device)
    lse = torch.full((T, Hh), float("-inf"), dtype=dt, device=q_lat.device)
    for b in range(len(q_start)):
        q0, q1, k0, k1 = q_indptr[b], q_indptr[b + 1], kv_indptr[b], kv_indptr[b + 1]
        if q1 == q0 or k1 == k0:
            continue
        rows = kv_cache[kv_indices[k0:k1].long()].to(dt)  # [S, L]
        s = torch.einsum("thl,sl->ths", q_lat[q0:q1].to(dt), rows) * scale
        q_pos = q_start[b] + torch.arange(q1 - q0, device=q_lat.device)
        k_pos = kv_offset + kv_stride * torch.arange(k1 - k0, device=q_lat.device)
        s = s.masked_fill((k_pos[None, :] > q_pos[:, None])[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(s, -1)  # [n, Hh]
        seen = ~torch.isneginf(row_lse)
        probs = torch.where(seen[..., None], (s - torch.where(seen, row_lse, 0.0)[..., None]).exp(), 0.0)
        o[q0:q1] = torch.einsum("ths,sv->thv", probs, rows[:, :v_dim])
        lse[q0:q1] = row_lse
    return o.to(q_lat.dtype), lse.to(torch.float64 if dt == torch.float64 else torch.float32)


def mla_dcp_attention_paged(
    q_lat: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, q_indptr: list[int], kv_lens: list[int],
    causal_seqs: list[int], page_size: int, cp_world: int, cp_rank: int, v_dim: int, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA of one DCP rank over its stripe of a paged latent cache (the k3_dcp_mla kernel contract).

    q_lat [T, Hh, L]; request b's queries are rows q_indptr[b]:q_indptr[b+1] (n_b of them), the j-th at global
    position causal_seqs[b] - n_b + j. Its rank-local keys are i = 0..kv_lens[b]-1: the i-th sits at global
    position cp_rank + cp_world * i, in cache row block_table[b, i // page_size] * page_size + i % page_size of
    kv_cache [N, L]. A query sees its request's keys at positions <= its own; the value is the first v_dim columns.
    Returns (o [T, Hh, v_dim] in q_lat.dtype, lse [T, Hh] natural log; o = 0 and lse = -inf where no key is seen).
    """
    rows, kv_indptr, q_start = [], [0], []
    for b, n_keys in enumerate(kv_lens):
        for i in range(n_keys):
            rows.append(int(block_table[b, i // page_size]) * page_size + i % page_size)
        kv_indptr.append(len(rows))
        q_start.append(causal_seqs[b] - (q_indptr[b + 1] - q_indptr[b]))
        if q_start[-1] < 0:
            raise ValueError(f"mla_dcp_attention_paged: request {b} has {q_indptr[b + 1] - q_indptr[b]} queries but "
                             f"a causal length of {causal_seqs[b]}")
    kv_indices = torch.tensor(rows, dtype=torch.long, device=q_lat.device)
    return mla_extend_absorbed(q_lat, kv_cache, kv_indices, list(q_indptr), kv_indptr, q_start, v_dim, scale,
                               kv_offset=cp_rank, kv_stride=cp_world)
