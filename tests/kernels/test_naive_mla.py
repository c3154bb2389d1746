"""MLA references: absorbed decode vs the unabsorbed causal form, and the LSE merge."""
import pytest
import torch

from k3_sglang.kernels.mla import absorb_query, merge_attention_states, mla_attention_unabsorbed, mla_decode_absorbed
from k3_sglang.kernels.norm import rms_norm
from tests.utils.numerics import assert_close

F64 = torch.float64


def make_mla(S, Hh=3, Dn=8, Dr=4, C=12, Dv=8):
    """A small MLA layer: latent cache rows [c | k_pe] and the per-head kv_b split."""
    c, k_pe = torch.randn(S, C, dtype=F64), torch.randn(S, Dr, dtype=F64)
    w_uk, w_uv = torch.randn(Hh, Dn, C, dtype=F64), torch.randn(Hh, Dv, C, dtype=F64)
    return c, k_pe, w_uk, w_uv


@pytest.mark.parametrize("S", [1, 7])
def test_mla_decode_absorbed_matches_unabsorbed(S):
    Hh, Dn, Dr, C, Dv = 3, 8, 4, 12, 8
    c, k_pe, w_uk, w_uv = make_mla(S, Hh, Dn, Dr, C, Dv)
    q_nope, q_pe = torch.randn(1, Hh, Dn, dtype=F64), torch.randn(1, Hh, Dr, dtype=F64)
    k_nope = torch.einsum("hdc,sc->shd", w_uk, c)
    v = torch.einsum("hdc,sc->shd", w_uv, c)
    scale = (Dn + Dr) ** -0.5
    ref = mla_attention_unabsorbed(q_nope, q_pe, k_nope, k_pe, v, scale, q_offset=S - 1)
    pool = torch.randn(S + 5, C + Dr, dtype=F64)
    rows = torch.randperm(S + 5)[:S]
    pool[rows] = torch.cat([c, k_pe], -1)
    q_lat = absorb_query(q_nope, q_pe, w_uk)
    o_lat, lse = mla_decode_absorbed(q_lat, pool, rows, torch.tensor([0, S]), C, scale)
    assert_close("o", ref[0], torch.einsum("hdc,hc->hd", w_uv, o_lat[0]), 1e-12)
    scores = torch.einsum("hc,sc->hs", q_lat[0], pool[rows]) * scale
    assert_close("lse", torch.logsumexp(scores, -1), lse[0], 1e-12)


def test_mla_attention_unabsorbed_causal():
    T, S, Hh, Dn, Dr, Dv = 3, 5, 2, 4, 2, 3
    q_nope, q_pe = torch.randn(T, Hh, Dn, dtype=F64), torch.randn(T, Hh, Dr, dtype=F64)
    k_nope, k_pe, v = torch.randn(S, Hh, Dn, dtype=F64), torch.randn(S, Dr, dtype=F64), torch.randn(S, Hh, Dv, dtype=F64)
    o = mla_attention_unabsorbed(q_nope, q_pe, k_nope, k_pe, v, 0.3, q_offset=2)
    for i in range(T):
        n = 2 + i + 1
        for h in range(Hh):
            s = (k_nope[:n, h] @ q_nope[i, h] + k_pe[:n] @ q_pe[i, h]) * 0.3
            assert_close("o", s.softmax(0) @ v[:n, h], o[i, h], 1e-12)
    with pytest.raises(ValueError, match=r"k_nope \(5, 2, 4\)"):
        mla_attention_unabsorbed(q_nope, q_pe, k_nope, k_pe, v, 0.3, q_offset=1)


def test_mla_decode_absorbed_batch_and_empty():
    pool = torch.randn(20, 10, dtype=F64)
    q_lat = torch.randn(3, 2, 10, dtype=F64)
    idx = torch.tensor([4, 9, 1, 3, 3, 0])
    o, lse = mla_decode_absorbed(q_lat, pool, idx, torch.tensor([0, 2, 2, 6]), 6, 0.5)
    assert bool(torch.isneginf(lse[1]).all()) and bool((o[1] == 0).all())
    s = q_lat[2] @ pool[idx[2:6]].T * 0.5
    assert_close("o[2]", s.softmax(-1) @ pool[idx[2:6], :6], o[2], 1e-12)
    with pytest.raises(ValueError, match=r"kv_indptr \(3,\)"):
        mla_decode_absorbed(q_lat, pool, idx, torch.tensor([0, 2, 6]), 6, 0.5)


@pytest.mark.parametrize("P", [1, 3, 5])
def test_merge_attention_states_equals_whole(P):
    B, H, L, n = 2, 3, 10, 11
    pool, q_lat = torch.randn(n, L, dtype=F64), torch.randn(B, H, L, dtype=F64)
    whole, whole_lse = mla_decode_absorbed(q_lat, pool, torch.arange(n).repeat(B), torch.tensor([0, n, 2 * n]), 6, 0.4)
    cuts = sorted(torch.randint(0, n + 1, (P - 1,)).tolist())
    if P > 2:
        cuts[1] = cuts[0]  # force one empty partial
    edges = [0, *cuts, n]
    outs, lses = [], []
    for a, b in zip(edges[:-1], edges[1:]):
        ind = torch.cat([torch.arange(a, b)] * B)
        o, lse = mla_decode_absorbed(q_lat, pool, ind, torch.tensor([0, b - a, 2 * (b - a)]), 6, 0.4)
        outs.append(o)
        lses.append(lse)
    outs, lses = torch.stack(outs), torch.stack(lses)
    if P > 2:
        outs[1] = float("nan")  # an empty partial's output must be ignored
    o, lse = merge_attention_states(outs, lses)
    assert_close("o", whole, o, 1e-12)
    assert_close("lse", whole_lse, lse, 1e-12)


def test_merge_attention_states_all_empty():
    outs = torch.randn(3, 2, 2, 4)
    o, lse = merge_attention_states(outs, torch.full((3, 2, 2), float("-inf")))
    assert bool((o == 0).all()) and bool(torch.isneginf(lse).all())
    with pytest.raises(ValueError, match=r"lses \(3, 2\)"):
        merge_attention_states(outs, torch.zeros(3, 2))


def test_rms_norm():
    x, w = torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(16, dtype=torch.bfloat16)
    xf = x.float()
    expect = (xf / (xf.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()).to(torch.bfloat16) * w
    out = rms_norm(x, w, 1e-6)
    assert out.dtype == torch.bfloat16 and torch.equal(out, expect)
