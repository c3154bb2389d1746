"""Chunk-only MLA extend inside SGLang: the chunk's queries attend the request's cached pool rows.

SGLang's torch_native extend recomputes attention over the whole sequence (prefix + chunk) for every chunk, so a
long prompt costs O(L^2) per chunk and O(L^3) in total. Here the chunk's latent rows are written to the MLA pool
first, then every query of the batch attends only its own request's rows (radix-cache prefix, earlier chunks and
the chunk itself) through the tiled kernel, at O(chunk x L) per chunk and memory bounded by the tile budget.
Fresh prompts, later chunks, prefix-cache hits and mixed batches all take this one path.
"""
from __future__ import annotations

import torch

from k3_sglang.kernels import dispatch
from k3_sglang.kernels.mla.extend_layout import ExtendLayout


def mla_pool_views(forward_batch):
    """(token_to_kv_pool, req_to_token [R, max_ctx]) of SGLang's full-attention backend for this forward."""
    from sglang.srt.model_executor.forward_context import get_attn_backend

    backend = get_attn_backend()
    backend = getattr(backend, "full_attn_backend", backend)
    return backend.token_to_kv_pool, backend.req_to_token_pool.req_to_token


def extend_keys(forward_batch, req_to_token: torch.Tensor) -> tuple[ExtendLayout, torch.Tensor]:
    """The batch's layout (from SGLang's host-side lengths) and kv_indices [sum(seq_lens)] pool rows per request."""
    prefix = [int(p) for p in forward_batch.extend_prefix_lens_cpu]
    extend = [int(n) for n in forward_batch.extend_seq_lens_cpu]
    layout = ExtendLayout.dense(prefix, extend)
    reqs = forward_batch.req_pool_indices.tolist()
    rows = [req_to_token[r, : p + n] for r, p, n in zip(reqs, prefix, extend) if p + n > 0]
    kv_indices = torch.cat(rows) if rows else req_to_token.new_zeros(0)
    return layout, kv_indices


def mla_extend_forward(attn, q_lat: torch.Tensor, rows: torch.Tensor, forward_batch, v_dim: int) -> torch.Tensor:
    """Write the chunk's rows, then attend over each request's cached rows.

    attn: the layer's RadixAttention (layer id, scaling); q_lat [T, H, L] absorbed queries; rows [T, L] this
    chunk's cache rows [norm(c) | k_pe]. Returns o_lat [T, H * v_dim].
    """
    pool, req_to_token = mla_pool_views(forward_batch)
    pool.set_kv_buffer(attn, forward_batch.out_cache_loc, rows.unsqueeze(1), None)
    layout, kv_indices = extend_keys(forward_batch, req_to_token)
    if layout.num_queries != q_lat.shape[0]:
        raise RuntimeError(f"MLA extend: the batch has {q_lat.shape[0]} query rows but SGLang's extend lengths sum "
                           f"to {layout.num_queries} (forward mode {forward_batch.forward_mode})")
    cache = pool.get_key_buffer(attn.layer_id)  # [N, 1, L]
    o_lat, _lse = dispatch.mla_extend(q_lat, cache.view(cache.shape[0], -1), kv_indices, layout, v_dim, attn.scaling)
    return o_lat.reshape(q_lat.shape[0], -1)
