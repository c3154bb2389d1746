"""Torch absorbed MLA decode for the dispatch layer's CPU path: every request in one padded batched attention.

Same contract as the reference `naive.mla_decode_absorbed` (which loops over requests): the padded form keeps a
batch-32 CPU decode bound by compute rather than by a Python loop. The pad length comes from kv_indptr, the real
lengths, so it can never be shorter than a request's context.
"""
from __future__ import annotations

import torch

from k3_sglang.kernels.mla.naive import check_decode_args
from k3_sglang.kernels.norm.naive import compute_dtype


def mla_decode_absorbed_padded(
    q_lat: torch.Tensor, kv_cache: torch.Tensor, kv_indices: torch.Tensor, kv_indptr: torch.Tensor, v_dim: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA decode (MQA over the latent pool), all requests at once.

    q_lat [B, Hh, L], kv_cache [N, L] latent rows, kv_indices [sum_lens] row ids, kv_indptr [B+1] (request b reads
    rows kv_indices[kv_indptr[b]:kv_indptr[b+1]]); the value is the first v_dim columns of each row.
    Returns (o_lat [B, Hh, v_dim] in q_lat.dtype, lse [B, Hh] float32 (float64 for float64 inputs); -inf and o = 0
    for an empty request). Gathers a [B, max_len, L] key tensor (fp32 compute).
    """
    check_decode_args("mla_decode_absorbed_padded", q_lat, kv_cache, kv_indices, kv_indptr, v_dim)
    B, Hh, _ = q_lat.shape
    dt = compute_dtype(q_lat, kv_cache)
    lse_dt = torch.float64 if dt == torch.float64 else torch.float32
    starts, lens = kv_indptr[:-1].long(), (kv_indptr[1:] - kv_indptr[:-1]).long()
    longest = int(lens.max()) if B else 0
    if longest == 0:
        return (torch.zeros(B, Hh, v_dim, dtype=q_lat.dtype, device=q_lat.device),
                torch.full((B, Hh), float("-inf"), dtype=lse_dt, device=q_lat.device))
    pos = torch.arange(longest, device=q_lat.device)
    valid = pos[None, :] < lens[:, None]  # [B, S]
    flat = torch.where(valid, starts[:, None] + pos[None, :], 0)  # padding reads entry 0, then is masked
    keys = kv_cache[kv_indices[flat].long()].to(dt)  # [B, S, L]
    scores = torch.matmul(q_lat.to(dt), keys.transpose(1, 2)) * scale  # [B, Hh, S]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, -1)  # [B, Hh]
    seen = ~torch.isneginf(lse)
    probs = torch.where(valid[:, None, :], (scores - torch.where(seen, lse, 0.0)[..., None]).exp(), 0.0)
    o = torch.matmul(probs, keys[..., :v_dim])  # [B, Hh, v_dim]
    return o.to(q_lat.dtype), lse.to(lse_dt)
