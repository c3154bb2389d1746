"""Torch path of the k3_dcp_mla kernel contract (`naive.mla_dcp_attention_paged`): a DCP rank's absorbed MLA over
its stripe of a paged latent cache, for CPU hosts.

The block table is flattened to the rank's cache rows (`dcp_layout.paged_key_rows`); a batch of one query per
request (decode) then runs as one padded batched attention over the keys each query sees (`decode_torch`), anything
else (target verify, prefill chunks) through the tiled extend with the strided causal layout (`extend_tiled`: key i
at position cp_rank + cp_world * i).
"""
from __future__ import annotations

import torch

from k3_sglang.kernels.mla.dcp_layout import local_key_counts, paged_key_rows
from k3_sglang.kernels.mla.decode_torch import mla_decode_absorbed_padded
from k3_sglang.kernels.mla.extend_layout import ExtendLayout
from k3_sglang.kernels.mla.extend_tiled import mla_extend_tiled


def check_dcp_args(name: str, q_lat, kv_cache, block_table, q_indptr, kv_lens, causal_seqs, page_size, cp_world,
                   cp_rank, v_dim) -> None:
    """Shared ValueError checks of the DCP kernel contract (the torch and Triton paths)."""
    if q_lat.dim() != 3 or kv_cache.dim() != 2 or q_lat.shape[-1] != kv_cache.shape[-1]:
        raise ValueError(f"{name}: q_lat {tuple(q_lat.shape)} must be [T, H, L], kv_cache {tuple(kv_cache.shape)} "
                         "[N, L]")
    b = kv_lens.shape[0]
    if block_table.dim() != 2 or block_table.shape[0] != b or tuple(causal_seqs.shape) != (b,) \
            or tuple(q_indptr.shape) != (b + 1,):
        raise ValueError(f"{name}: block_table {tuple(block_table.shape)} must be [B, M], kv_lens and causal_seqs "
                         f"[B], q_indptr [B+1]; got B={b}, causal_seqs {tuple(causal_seqs.shape)}, q_indptr "
                         f"{tuple(q_indptr.shape)}")
    if page_size < 1 or not 0 <= cp_rank < cp_world:
        raise ValueError(f"{name}: page_size {page_size} must be >= 1 and cp_rank {cp_rank} in [0, {cp_world})")
    if not 0 < v_dim <= q_lat.shape[-1]:
        raise ValueError(f"{name}: v_dim={v_dim} must be in (0, L={q_lat.shape[-1]}]")


def mla_dcp_attention_torch(
    q_lat: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, q_indptr: torch.Tensor,
    kv_lens: torch.Tensor, causal_seqs: torch.Tensor, page_size: int, cp_world: int, cp_rank: int, v_dim: int,
    scale: float, q_len: int | None = None, num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q_lat [T, H, L]; kv_cache [N, L] this rank's rows; block_table [B, M] physical pages; q_indptr [B+1] query rows
    of each request; kv_lens [B] this rank's key counts; causal_seqs [B] global position of each request's last query
    plus one. Returns (o [T, H, v_dim] in q_lat.dtype, lse [T, H] fp32, natural log; o = 0, lse = -inf where no key
    is visible), as `naive.mla_dcp_attention_paged`. q_len and num_splits (hints of the Triton path) are not needed."""
    check_dcp_args("mla_dcp_attention_torch", q_lat, kv_cache, block_table, q_indptr, kv_lens, causal_seqs,
                   page_size, cp_world, cp_rank, v_dim)
    n_q = (q_indptr[1:] - q_indptr[:-1]).long()
    if q_lat.shape[0] == n_q.shape[0] and bool((n_q == 1).all()):  # decode: each query sees the keys before it
        seen = torch.minimum(kv_lens.long(), local_key_counts(causal_seqs.long(), cp_world, cp_rank))
        kv_indices, kv_indptr = paged_key_rows(block_table, seen, page_size)
        return mla_decode_absorbed_padded(q_lat, kv_cache, kv_indices, kv_indptr, v_dim, scale)
    kv_indices, kv_indptr = paged_key_rows(block_table, kv_lens, page_size)
    q_start = (causal_seqs.long() - n_q).tolist()
    if any(s < 0 for s in q_start):
        raise ValueError(f"mla_dcp_attention_torch: a request has more queries than its causal length {q_start}")
    layout = ExtendLayout(tuple(q_indptr.tolist()), tuple(kv_indptr.tolist()), tuple(q_start), kv_offset=cp_rank,
                          kv_stride=cp_world)
    return mla_extend_tiled(q_lat, kv_cache, kv_indices, layout, v_dim, scale)
