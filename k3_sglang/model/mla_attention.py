"""MLA attention inside SGLang's pools: write this step's latent rows, attend each request's cached rows.

Extend (prefill chunks) is chunk-only: the chunk's rows are written to the MLA pool first, then every query
attends only its own request's rows (radix-cache prefix, earlier chunks, the chunk itself) through the tiled
kernel, at O(chunk x prefix) per chunk and memory bounded by the tile budget (SGLang's torch_native extend
recomputes the whole prefix every chunk). Decode is one padded batched attention (`dispatch.mla_decode`), its
gather sized from the live seq_lens. Fresh prompts, later chunks, prefix-cache hits and mixed batches take the
same path.

Under DCP (c ranks, SGLang's layout: position p on rank p mod c at physical row v // c of its widened id v) the
write is owner-filtered by SGLang's `set_mla_kv_buffer`, queries of the group's c x H_l heads are all-gathered,
each rank attends its stripe (key i at position r + c i) and the partials are merged exactly through their LSEs
(`k3_sglang.parallel.dcp`).
"""
from __future__ import annotations

import torch

from k3_sglang.kernels import dispatch
from k3_sglang.kernels.mla.decode_layout import decode_kv_layout
from k3_sglang.kernels.mla.extend_layout import ExtendLayout
from k3_sglang.model.kv_read_trace import KVReadTrace
from k3_sglang.parallel.dcp import local_key_count, merge
from k3_sglang.parallel.tp import Shard


def mla_pool_views(forward_batch):
    """(token_to_kv_pool, req_to_token [R, max_ctx]) of SGLang's full-attention backend for this forward."""
    from sglang.srt.model_executor.forward_context import get_attn_backend

    backend = get_attn_backend()
    backend = getattr(backend, "full_attn_backend", backend)
    return backend.token_to_kv_pool, backend.req_to_token_pool.req_to_token


def batch_lengths(forward_batch) -> tuple[list[int], list[int]]:
    """(prefix_lens, new_lens) per request from SGLang's host-side lengths; decode: (seq_len - 1, 1); a chain
    verify (TARGET_VERIFY): (committed seq_len, verify length), its chains attended like an extend chunk; the lengths
    are SGLang's ragged verify layout's, or draft_token_num each without one."""
    if forward_batch.forward_mode.is_target_verify():
        seq = [int(n) for n in forward_batch.seq_lens_cpu.tolist()]
        spec = forward_batch.spec_info
        ragged = getattr(spec, "ragged_verify_layout", None)
        if ragged is not None:
            return seq, [int(n) for n in ragged.verify_lens_cpu]
        return seq, [int(spec.draft_token_num)] * len(seq)
    if forward_batch.forward_mode.is_decode():
        seq = [int(n) for n in forward_batch.seq_lens_cpu.tolist()]
        return [n - 1 for n in seq], [1] * len(seq)
    return ([int(p) for p in forward_batch.extend_prefix_lens_cpu],
            [int(n) for n in forward_batch.extend_seq_lens_cpu])


def stripe_keys(req_to_token: torch.Tensor, req_pool_indices: list[int], seq_lens: list[int],
                dcp: Shard) -> tuple[list[int], torch.Tensor]:
    """This rank's keys of each request: (counts [B], physical pool rows [sum(counts)] int64, request after request).

    req_to_token holds widened ids; rank r owns positions r, r + c, ... at physical row id // c (dense layout:
    c = 1, every position, row = id)."""
    c, r = dcp.size, dcp.rank
    counts, rows = [], []
    for req, n in zip(req_pool_indices, seq_lens):
        k = local_key_count(n, c, r)
        counts.append(k)
        if k:
            rows.append(req_to_token[req, r: r + c * (k - 1) + 1: c].long() // c)
    return counts, (torch.cat(rows) if rows else req_to_token.new_zeros(0, dtype=torch.long))


_TRACES: dict[int, KVReadTrace] = {}


def _trace(rank: int) -> KVReadTrace:
    if rank not in _TRACES:
        _TRACES[rank] = KVReadTrace.from_env(rank)
    return _TRACES[rank]


def write_rows(pool, attn, rows: torch.Tensor, forward_batch, v_dim: int) -> None:
    """rows [T, L] = [c | k_pe] of this step's tokens into their pool slots (owner-filtered under DCP)."""
    pool.set_mla_kv_buffer(attn, forward_batch.out_cache_loc, rows[:, None, :v_dim], rows[:, None, v_dim:])


def _gather_heads(q_lat: torch.Tensor, group) -> torch.Tensor:
    """[T, H_l, L] on each rank of the DCP group -> [T, c H_l, L], head blocks in DCP-rank order."""
    g = group.all_gather(q_lat)  # [c, T, H_l, L]
    return g.transpose(0, 1).reshape(q_lat.shape[0], -1, q_lat.shape[2])


def mla_attention(attn, q_lat: torch.Tensor, rows: torch.Tensor, forward_batch, v_dim: int, dcp: Shard,
                  merge_backend: str = "ag_rs", tp_rank: int = 0) -> torch.Tensor:
    """attn: the layer's RadixAttention (layer id, scaling); q_lat [T, H_l, L] this rank's absorbed queries;
    rows [T, L] this step's cache rows. Returns o_lat [T, H_l * v_dim] for this rank's heads."""
    pool, req_to_token = mla_pool_views(forward_batch)
    write_rows(pool, attn, rows, forward_batch, v_dim)
    cache = pool.get_key_buffer(attn.layer_id)
    cache = cache.view(cache.shape[0], -1)  # [N, L]
    decode = forward_batch.forward_mode.is_decode()
    t = q_lat.shape[0]
    if dcp.size == 1 and decode:
        kv_indices, kv_indptr = decode_kv_layout(req_to_token, forward_batch.req_pool_indices, forward_batch.seq_lens)
        _trace(tp_rank).record("decode", int(kv_indices.numel()))
        o_lat, _ = dispatch.mla_decode(q_lat, cache, kv_indices, kv_indptr, v_dim, attn.scaling)
        return o_lat.reshape(t, -1)
    group = None
    if dcp.size > 1:
        from k3_sglang.parallel.groups import sglang_group

        group = sglang_group("dcp_group")
        q_lat = _gather_heads(q_lat, group)
    prefix, new = batch_lengths(forward_batch)
    if sum(new) != t:
        raise RuntimeError(f"MLA attention: the batch has {t} query rows but SGLang's lengths sum to {sum(new)} "
                           f"(forward mode {forward_batch.forward_mode})")
    seq = [p + n for p, n in zip(prefix, new)]
    counts, kv_indices = stripe_keys(req_to_token, forward_batch.req_pool_indices.tolist(), seq, dcp)
    _trace(tp_rank).record("decode" if decode else "extend", int(kv_indices.numel()))
    kv_indptr = [0]
    for k in counts:
        kv_indptr.append(kv_indptr[-1] + k)
    if decode:  # one query per request sees every key of its stripe: no mask
        indptr = torch.tensor(kv_indptr, dtype=torch.long, device=q_lat.device)
        o_lat, lse = dispatch.mla_decode(q_lat, cache, kv_indices, indptr, v_dim, attn.scaling)
    else:
        q_indptr = [0]
        for n in new:
            q_indptr.append(q_indptr[-1] + n)
        layout = ExtendLayout(tuple(q_indptr), tuple(kv_indptr), tuple(prefix), kv_offset=dcp.rank,
                              kv_stride=dcp.size)
        o_lat, lse = dispatch.mla_extend(q_lat, cache, kv_indices, layout, v_dim, attn.scaling)
    if group is not None:
        o_lat = merge(o_lat, lse, group, merge_backend)
    return o_lat.reshape(t, -1)
