"""MLA attention inside SGLang's pools: write this step's latent rows, attend each request's cached rows through the
k3_dcp_mla kernel (`k3_sglang/dcp_mla`, the one DCP implementation SGLang's own K3 uses too).

Extend (prefill chunks) is chunk-only: the chunk's rows are written to the MLA pool first, then every query
attends only its own request's rows (radix-cache prefix, earlier chunks, the chunk itself); on CPU the kernel's
torch path runs decode as one padded batched attention and extends through the tiled kernel, at O(chunk x prefix)
per chunk and memory bounded by the tile budget (SGLang's torch_native extend recomputes the whole prefix every
chunk). Fresh prompts, later chunks, prefix-cache hits, mixed batches and K3_CSV verify chains take the same path.

Under DCP (c ranks, SGLang's layout: position p on rank p mod c at physical row v // c of its widened id v) the
write is owner-filtered by SGLang's `set_mla_kv_buffer`, queries of the group's c x H_l heads are all-gathered,
each rank attends its stripe (key i at position r + c i) and the partials are merged exactly through their LSEs by
SGLang's own merges (`dcp_mla/merge.py`).
"""
from __future__ import annotations

import torch

from k3_sglang.dcp_mla.merge import attend, dcp_group, gather_heads, merge_heads
from k3_sglang.dcp_mla.metadata import stripe_batch
from k3_sglang.dcp_mla.kv_read_trace import KVReadTrace
from k3_sglang.parallel.tp import Shard


def mla_pool_views(forward_batch):
    """(token_to_kv_pool, req_to_token [R, max_ctx]) of SGLang's full-attention backend for this forward."""
    from sglang.srt.model_executor.forward_context import get_attn_backend

    backend = get_attn_backend()
    backend = getattr(backend, "full_attn_backend", backend)
    return backend.token_to_kv_pool, backend.req_to_token_pool.req_to_token


_TRACES: dict[int, KVReadTrace] = {}


def _trace(rank: int) -> KVReadTrace:
    if rank not in _TRACES:
        _TRACES[rank] = KVReadTrace.from_env(rank)
    return _TRACES[rank]


def write_rows(pool, attn, rows: torch.Tensor, forward_batch, v_dim: int) -> None:
    """rows [T, L] = [c | k_pe] of this step's tokens into their pool slots (owner-filtered under DCP)."""
    pool.set_mla_kv_buffer(attn, forward_batch.out_cache_loc, rows[:, None, :v_dim], rows[:, None, v_dim:])


def mla_attention(attn, q_lat: torch.Tensor, rows: torch.Tensor, forward_batch, v_dim: int, dcp: Shard,
                  merge_backend: str = "ag_rs", tp_rank: int = 0) -> torch.Tensor:
    """attn: the layer's RadixAttention (layer id, scaling); q_lat [T, H_l, L] this rank's absorbed queries;
    rows [T, L] this step's cache rows. Returns o_lat [T, H_l * v_dim] for this rank's heads."""
    pool, req_to_token = mla_pool_views(forward_batch)
    write_rows(pool, attn, rows, forward_batch, v_dim)
    cache = pool.get_key_buffer(attn.layer_id)
    cache = cache.view(cache.shape[0], -1)  # [N, L]
    t = q_lat.shape[0]
    group = dcp_group() if dcp.size > 1 else None
    if group is not None:
        q_lat = gather_heads(q_lat, group)
    batch = stripe_batch(forward_batch, req_to_token, int(getattr(pool, "page_size", 1)), dcp.size, dcp.rank)
    queries = int(batch.q_indptr[-1])
    if queries != t:
        raise RuntimeError(f"MLA attention: the batch has {t} query rows but SGLang's lengths sum to {queries} "
                           f"(forward mode {forward_batch.forward_mode})")
    _trace(tp_rank).record("decode" if forward_batch.forward_mode.is_decode() else "extend",
                           int(batch.kv_lens.sum()))
    o_lat, lse = attend(q_lat, cache, batch, v_dim, attn.scaling)
    if group is not None:
        o_lat = merge_heads(o_lat, lse, group, merge_backend)
    return o_lat.reshape(t, -1)
