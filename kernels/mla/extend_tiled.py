"""Absorbed MLA extend (prefill chunk over a cached prefix) in plain PyTorch, tiled over queries and keys.

Each query attends only its own request's cached key rows (its prefix from the radix cache and earlier chunks,
plus the chunk itself, already written to the pool), so a chunk costs O(chunk x seq_len) rather than the
O(seq_len^2) of recomputing the whole sequence. Tiles (`extend_layout.plan_tiles`) bound the scores to a fixed
element budget and are combined by an online log-sum-exp merge in float32 (float64 for float64 inputs); the
result is exact softmax attention up to rounding, with the natural-log LSE per query and head returned for
further merging (DCP partials).
"""
from __future__ import annotations

import torch

from k3_sglang.kernels.mla.extend_layout import ExtendLayout, Tile, key_tile, plan_tiles
from k3_sglang.kernels.norm.naive import compute_dtype


def _row_ids(indptr: tuple[int, ...], device: torch.device) -> torch.Tensor:
    counts = torch.tensor([hi - lo for lo, hi in zip(indptr, indptr[1:])], dtype=torch.long)
    return torch.repeat_interleave(torch.arange(len(counts)), counts).to(device)


def _positions(layout: ExtendLayout, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(q_req [T], q_pos [T], kv_req [K], kv_pos [K]): request and absolute position of every query and key row."""
    q_req, kv_req = _row_ids(layout.q_indptr, device), _row_ids(layout.kv_indptr, device)
    q_idx = torch.arange(layout.num_queries, device=device) - torch.tensor(layout.q_indptr[:-1], device=device)[q_req]
    kv_idx = torch.arange(layout.num_keys, device=device) - torch.tensor(layout.kv_indptr[:-1], device=device)[kv_req]
    q_pos = torch.tensor(layout.q_start, device=device)[q_req] + q_idx
    kv_pos = layout.kv_offset + layout.kv_stride * kv_idx
    return q_req, q_pos, kv_req, kv_pos


def mla_extend_tiled(
    q_lat: torch.Tensor, kv_cache: torch.Tensor, kv_indices: torch.Tensor, layout: ExtendLayout, v_dim: int,
    scale: float, q_tile: int | None = None, tile_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal absorbed attention of an extend batch over each request's cached rows.

    q_lat [T, H, L] queries (T = layout.num_queries), kv_cache [N, L] latent pool rows, kv_indices [K] int pool row
    of each request's keys in order (K = layout.num_keys); the value is the first v_dim columns of a row.
    Returns (o_lat [T, H, v_dim] in q_lat.dtype, lse [T, H] float32 (float64 for float64 input)); a query with no
    visible key gets o = 0 and lse = -inf.

    On CPU, requests with more than FLASH_MIN_KEYS keys (or one key tile) in the plain layout run through PyTorch's fused flash-attention CPU
    kernel (float32 accumulation, also for bf16 inputs); everything else runs the tile loop below.
    """
    if q_lat.dim() != 3 or kv_cache.dim() != 2 or q_lat.shape[-1] != kv_cache.shape[-1]:
        raise ValueError(f"mla_extend_tiled: q_lat {tuple(q_lat.shape)} must be [T, H, L], kv_cache "
                         f"{tuple(kv_cache.shape)} [N, L]")
    if q_lat.shape[0] != layout.num_queries or kv_indices.shape != (layout.num_keys,):
        raise ValueError(f"mla_extend_tiled: q_lat has {q_lat.shape[0]} rows and kv_indices {tuple(kv_indices.shape)}, "
                         f"layout needs {layout.num_queries} and ({layout.num_keys},)")
    if not 0 < v_dim <= q_lat.shape[-1]:
        raise ValueError(f"mla_extend_tiled: v_dim={v_dim} must be in (0, L={q_lat.shape[-1]}]")
    t, h, _ = q_lat.shape
    dt = compute_dtype(q_lat, kv_cache)
    state = _OnlineSoftmax(t, h, v_dim, dt, q_lat.device)
    sizes = {k: v for k, v in (("q_tile", q_tile), ("tile_elements", tile_elements)) if v is not None}
    long_requests = frozenset()
    if _flash_applies(q_lat, kv_cache, layout):
        min_keys = min(FLASH_MIN_KEYS, key_tile(h, **sizes))
        long_requests = frozenset(b for b in range(layout.num_requests) if _flash_shaped(layout, b, min_keys))
        for b in sorted(long_requests):
            _flash_request(state, q_lat, kv_cache, kv_indices, layout, b, v_dim, scale)
    _run_tiles(state, q_lat, kv_cache, kv_indices, layout, plan_tiles(layout, h, exclude=long_requests, **sizes),
               v_dim, scale)
    o, lse = state.result()
    return o.to(q_lat.dtype), lse.to(torch.float64 if dt == torch.float64 else torch.float32)


class _OnlineSoftmax:
    """Running (max, denominator, weighted sum) per query and head, float32/64; merges partial attentions."""

    def __init__(self, t: int, h: int, v_dim: int, dtype: torch.dtype, device: torch.device):
        self.m = torch.full((t, h), float("-inf"), dtype=dtype, device=device)
        self.denom = torch.zeros(t, h, dtype=dtype, device=device)
        self.acc = torch.zeros(t, h, v_dim, dtype=dtype, device=device)

    def add_scores(self, t0: int, t1: int, p: torch.Tensor, values: torch.Tensor, m_new: torch.Tensor,
                   shift: torch.Tensor) -> None:
        """p [n, H, k] = exp(scores - shift) for rows t0:t1 whose running max becomes m_new; values [k, v_dim]."""
        n, h, k = p.shape
        rescale = (self.m[t0:t1] - shift).exp()  # exp(-inf) = 0 for rows not seen before
        self.denom[t0:t1] = self.denom[t0:t1] * rescale + p.sum(-1)
        pv = torch.matmul(p.view(n * h, k), values).view(n, h, -1)
        self.acc[t0:t1] = self.acc[t0:t1] * rescale[..., None] + pv
        self.m[t0:t1] = m_new

    def add_partial(self, t0: int, t1: int, o: torch.Tensor, lse: torch.Tensor) -> None:
        """A normalised partial attention o [n, H, v_dim] with its lse [n, H] (-inf: empty) for rows t0:t1."""
        lse = lse.to(self.m.dtype)
        m_new = torch.maximum(self.m[t0:t1], lse)
        shift = torch.where(torch.isneginf(m_new), 0.0, m_new)
        rescale = (self.m[t0:t1] - shift).exp()
        weight = (lse - shift).exp()
        self.denom[t0:t1] = self.denom[t0:t1] * rescale + weight
        self.acc[t0:t1] = self.acc[t0:t1] * rescale[..., None] + weight[..., None] * o.to(self.acc.dtype)
        self.m[t0:t1] = m_new

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        seen = self.denom > 0
        safe = torch.where(seen, self.denom, 1.0)
        o = torch.where(seen[..., None], self.acc / safe[..., None], 0.0)
        return o, torch.where(seen, self.m + torch.log(safe), float("-inf"))


def _run_tiles(state: _OnlineSoftmax, q_lat, kv_cache, kv_indices, layout: ExtendLayout, tiles: list[Tile],
               v_dim: int, scale: float) -> None:
    h, width = q_lat.shape[1], q_lat.shape[2]
    dt = state.m.dtype
    if any(tile.masked for tile in tiles):
        q_req, q_pos, kv_req, kv_pos = _positions(layout, q_lat.device)
    keys, keys_range = None, None
    for tile in tiles:
        if tile.k1 == tile.k0:  # a request with no key here (a DCP stripe shorter than the rank): nothing to add
            continue
        if keys_range != (tile.k0, tile.k1):
            keys = kv_cache[kv_indices[tile.k0:tile.k1].long()].to(dt)  # [k, L]
            keys_range = (tile.k0, tile.k1)
        n, k = tile.t1 - tile.t0, tile.k1 - tile.k0
        q = q_lat[tile.t0:tile.t1].to(dt).reshape(n * h, width)
        s = torch.matmul(q, keys.T).mul_(scale).view(n, h, k)
        if tile.masked:
            visible = (q_req[tile.t0:tile.t1, None] == kv_req[None, tile.k0:tile.k1]) & (
                kv_pos[None, tile.k0:tile.k1] <= q_pos[tile.t0:tile.t1, None])
            s.masked_fill_(~visible[:, None, :], float("-inf"))
        m_new = torch.maximum(state.m[tile.t0:tile.t1], s.amax(-1))
        shift = torch.where(torch.isneginf(m_new), 0.0, m_new)
        state.add_scores(tile.t0, tile.t1, s.sub_(shift[..., None]).exp_(), keys[:, :v_dim], m_new, shift)


FLASH_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Requests with more keys than this (or than one key tile) take the fused kernel; below it the packed tile loop
# (many small requests in a few large matmuls) is cheaper than one kernel call per request.
FLASH_MIN_KEYS = 256


def _flash_applies(q_lat: torch.Tensor, kv_cache: torch.Tensor, layout: ExtendLayout) -> bool:
    return (q_lat.device.type == "cpu" and q_lat.dtype in FLASH_DTYPES and kv_cache.dtype == q_lat.dtype
            and layout.kv_offset == 0 and layout.kv_stride == 1)


def _flash_shaped(layout: ExtendLayout, b: int, min_keys: int) -> bool:
    """A request with more than min_keys keys that are exactly its prefix plus its queries."""
    n, keys = layout.q_indptr[b + 1] - layout.q_indptr[b], layout.kv_indptr[b + 1] - layout.kv_indptr[b]
    return n > 0 and keys > min_keys and keys == layout.q_start[b] + n


def _flash_request(state: _OnlineSoftmax, q_lat, kv_cache, kv_indices, layout: ExtendLayout, b: int, v_dim: int,
                   scale: float) -> None:
    """One long request in the plain layout: its prefix keys (seen by every query, heads folded into the query
    rows of one unmasked MQA call) and the chunk's own keys (a square causal call), merged by their LSEs."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    t0, t1 = layout.q_indptr[b], layout.q_indptr[b + 1]
    n, h, width = t1 - t0, q_lat.shape[1], q_lat.shape[2]
    prefix = layout.q_start[b]
    keys = kv_cache[kv_indices[layout.kv_indptr[b]:layout.kv_indptr[b + 1]].long()]  # [prefix + n, L]
    q = q_lat[t0:t1]
    if prefix > 0:
        before = keys[:prefix][None, None]
        o, lse = flash(q.reshape(1, 1, n * h, width), before, before, 0.0, False, scale=scale)
        state.add_partial(t0, t1, o.view(n, h, width)[..., :v_dim], lse.view(n, h))
    own = keys[prefix:][None, None].expand(1, h, n, width)
    o, lse = flash(q.transpose(0, 1)[None], own, own, 0.0, True, scale=scale)  # square: causal is lower-right
    state.add_partial(t0, t1, o[0].transpose(0, 1)[..., :v_dim], lse[0].transpose(0, 1))
