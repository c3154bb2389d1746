"""Tiled absorbed-MLA extend against the per-request full-softmax reference, and its tile plan."""
from __future__ import annotations

import pytest
import torch

from k3_sglang.kernels.mla.extend_layout import ExtendLayout, plan_tiles
from k3_sglang.kernels.mla.extend_tiled import mla_extend_tiled
from k3_sglang.kernels.mla.naive import mla_attention_unabsorbed, mla_extend_absorbed
from tests.utils.numerics import FP32_VS_FP64, assert_close

L, C, H = 20, 12, 3


def _batch(prefix_lens, extend_lens, dtype=torch.float64, pool_extra=7):
    """A random pool with each request's rows scattered over it; returns (q_lat, pool, kv_indices, layout)."""
    layout = ExtendLayout.dense(prefix_lens, extend_lens)
    pool = torch.randn(layout.num_keys + pool_extra, L, dtype=dtype)
    kv_indices = torch.randperm(pool.shape[0])[: layout.num_keys]
    q_lat = torch.randn(layout.num_queries, H, L, dtype=dtype)
    return q_lat, pool, kv_indices, layout


def _reference(q_lat, pool, kv_indices, layout, **kw):
    return mla_extend_absorbed(q_lat, pool, kv_indices, list(layout.q_indptr), list(layout.kv_indptr),
                               list(layout.q_start), C, 0.37, layout.kv_offset, layout.kv_stride, **kw)


CASES = {
    "fresh-single": ([0], [37]),
    "cached-prefix": ([300], [45]),
    "mixed-batch": ([0, 190, 3, 0, 611], [9, 64, 1, 130, 17]),
    "many-small": ([2] * 40, [3] * 40),
    "empty-extend-in-batch": ([5, 0, 9], [4, 0, 6]),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("tiles", [(8, 200), (64, 1 << 22), (5, 64)], ids=["small-tiles", "one-tile", "tiny-tiles"])
def test_tiled_matches_reference_float64(case, tiles):
    q_lat, pool, kv_indices, layout = _batch(*CASES[case])
    o_ref, lse_ref = _reference(q_lat, pool, kv_indices, layout)
    o, lse = mla_extend_tiled(q_lat, pool, kv_indices, layout, C, 0.37, q_tile=tiles[0], tile_elements=tiles[1])
    assert_close("o", o_ref, o, 1e-12)
    assert_close("lse", lse_ref, lse, 1e-12)


def test_tiled_float32_against_float64_reference():
    q_lat, pool, kv_indices, layout = _batch([0, 500, 40], [33, 70, 257])
    o_ref, lse_ref = _reference(q_lat, pool, kv_indices, layout)
    o, lse = mla_extend_tiled(q_lat.float(), pool.float(), kv_indices, layout, C, 0.37, q_tile=32, tile_elements=4096)
    assert o.dtype == torch.float32 and lse.dtype == torch.float32
    assert_close("o", o_ref, o, FP32_VS_FP64)
    assert_close("lse", lse_ref, lse, FP32_VS_FP64)


def test_reference_equals_unabsorbed_causal_attention():
    """The extend reference is the same attention as the unabsorbed MLA prefill over prefix + chunk."""
    Dn, Dr, Dv, prefix, n = 8, L - C, 6, 11, 9
    S = prefix + n
    c, k_pe = torch.randn(S, C, dtype=torch.float64), torch.randn(S, Dr, dtype=torch.float64)
    w_uk, w_uv = torch.randn(H, Dn, C, dtype=torch.float64), torch.randn(H, Dv, C, dtype=torch.float64)
    q_nope, q_pe = torch.randn(n, H, Dn, dtype=torch.float64), torch.randn(n, H, Dr, dtype=torch.float64)
    want = mla_attention_unabsorbed(q_nope, q_pe, torch.einsum("hdc,sc->shd", w_uk, c), k_pe,
                                    torch.einsum("hdc,sc->shd", w_uv, c), 0.37, prefix)
    q_lat = torch.cat([torch.einsum("thd,hdc->thc", q_nope, w_uk), q_pe], -1)
    o_lat, _ = mla_extend_absorbed(q_lat, torch.cat([c, k_pe], -1), torch.arange(S), [0, n], [0, S], [prefix], C, 0.37)
    assert_close("o", want, torch.einsum("hvc,thc->thv", w_uv, o_lat), 1e-12)


def test_strided_keys_of_a_dcp_rank():
    """Rank 1 of 3 holds positions 1, 4, 7, ...: queries before a rank's first key see nothing (lse -inf, o 0)."""
    prefix, n = 10, 6
    keys = len(range(1, prefix + n, 3))
    layout = ExtendLayout((0, n), (0, keys), (prefix,), kv_offset=1, kv_stride=3)
    pool = torch.randn(keys + 3, L, dtype=torch.float64)
    kv_indices = torch.randperm(keys + 3)[:keys]
    q_lat = torch.randn(n, H, L, dtype=torch.float64)
    o_ref, lse_ref = _reference(q_lat, pool, kv_indices, layout)
    o, lse = mla_extend_tiled(q_lat, pool, kv_indices, layout, C, 0.37, q_tile=2, tile_elements=64)
    assert_close("o", o_ref, o, 1e-12)
    assert_close("lse", lse_ref, lse, 1e-12)
    early = ExtendLayout((0, 2), (0, 1), (0,), kv_offset=1, kv_stride=3)  # query 0 sits before key position 1
    o, lse = mla_extend_tiled(q_lat[:2], pool, kv_indices[:1], early, C, 0.37)
    assert bool(torch.isneginf(lse[0]).all()) and bool((o[0] == 0).all()) and bool(torch.isfinite(lse[1]).all())


def test_tiles_cover_every_visible_pair_once_and_skip_the_future():
    layout = ExtendLayout.dense([0, 700, 3, 3, 0], [300, 200, 2, 2, 1])
    tiles = plan_tiles(layout, num_heads=4, q_tile=64, tile_elements=64 * 4 * 128)
    covered = torch.zeros(layout.num_queries, layout.num_keys, dtype=torch.int32)
    for tile in tiles:
        assert tile.t1 - tile.t0 <= 64 and tile.k1 - tile.k0 <= 128
        covered[tile.t0:tile.t1, tile.k0:tile.k1] += 1
    q_req = torch.repeat_interleave(torch.arange(5), torch.tensor([300, 200, 2, 2, 1]))
    kv_req = torch.repeat_interleave(torch.arange(5), torch.tensor([300, 900, 5, 5, 1]))
    q_pos = torch.cat([torch.arange(300), 700 + torch.arange(200), 3 + torch.arange(2), 3 + torch.arange(2), torch.arange(1)])
    kv_pos = torch.cat([torch.arange(n) for n in (300, 900, 5, 5, 1)])
    visible = (q_req[:, None] == kv_req[None]) & (kv_pos[None] <= q_pos[:, None])
    assert bool((covered[visible] == 1).all()), "every visible pair is in exactly one tile"
    # the long requests' key tiles after a query tile's last position are skipped: far fewer pairs than dense
    assert covered.sum().item() < 0.6 * layout.num_queries * layout.num_keys
    unmasked = [t for t in tiles if not t.masked]
    assert unmasked, "tiles wholly below the diagonal run without a mask"
    for t in unmasked:
        assert bool(visible[t.t0:t.t1, t.k0:t.k1].all())


def test_small_requests_share_tiles():
    layout = ExtendLayout.dense([1] * 32, [2] * 32)
    assert len(plan_tiles(layout, num_heads=4, q_tile=64, tile_elements=1 << 16)) == 1


def test_bad_arguments_are_named():
    q_lat, pool, kv_indices, layout = _batch([3], [4])
    with pytest.raises(ValueError, match="layout needs 4"):
        mla_extend_tiled(q_lat[:3], pool, kv_indices, layout, C, 0.37)
    with pytest.raises(ValueError, match="v_dim"):
        mla_extend_tiled(q_lat, pool, kv_indices, layout, L + 1, 0.37)
    with pytest.raises(ValueError, match="B\\+1"):
        ExtendLayout((0, 1), (0, 1, 2), (0,))
    with pytest.raises(ValueError, match="not decrease"):
        ExtendLayout((0, 3, 2), (0, 3, 5), (0, 0))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, FP32_VS_FP64), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("prefix_lens,extend_lens", [([0], [400]), ([900], [130]), ([700, 0, 2], [64, 300, 5])],
                         ids=["fresh", "cached-prefix", "long-and-short"])
def test_cpu_flash_path_against_float64_reference(monkeypatch, dtype, tol, prefix_lens, extend_lens):
    """Long plain-layout requests take the fused flash-attention path on CPU; the rest of the batch the tile loop."""
    import k3_sglang.kernels.mla.extend_tiled as extend_tiled

    calls = []
    real = extend_tiled._flash_request
    monkeypatch.setattr(extend_tiled, "_flash_request", lambda *a: calls.append(a[5]) or real(*a))
    q_lat, pool, kv_indices, layout = _batch(prefix_lens, extend_lens)
    o_ref, lse_ref = _reference(q_lat, pool, kv_indices, layout)
    o, lse = mla_extend_tiled(q_lat.to(dtype), pool.to(dtype), kv_indices, layout, C, 0.37, q_tile=32,
                              tile_elements=32 * H * 128)
    long_ones = [b for b, (p, n) in enumerate(zip(prefix_lens, extend_lens)) if p + n > 128]
    assert sorted(calls) == long_ones
    assert o.dtype == dtype
    assert_close("o", o_ref, o, tol)
    assert_close("lse", lse_ref, lse, tol)
