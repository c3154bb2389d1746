"""KDA references against each other and against their formulas."""
import pytest
import torch
import torch.nn.functional as F

from k3_sglang.kernels.kda import (
    chunk_kda,
    gated_rms_norm,
    kda_gate,
    kda_recurrent_step,
    l2_normalize,
    naive_recurrent_kda,
    short_conv_silu,
)
from tests.utils.numerics import assert_bit_exact, assert_close


def make_kda_inputs(T, H, K, V, dtype=torch.float64, lower_bound=-5.0):
    q = l2_normalize(torch.randn(T, H, K, dtype=dtype))
    k = l2_normalize(torch.randn(T, H, K, dtype=dtype))
    v = torch.randn(T, H, V, dtype=dtype)
    g = kda_gate(torch.randn(T, H, K, dtype=dtype), torch.randn(H + 3, dtype=dtype), torch.randn(H * K, dtype=dtype),
                 lower_bound)
    beta = torch.rand(T, H, dtype=dtype)
    return q, k, v, g, beta


@pytest.mark.parametrize("T,H,K,V,with_state,chunk", [
    (1, 1, 8, 8, False, 64), (67, 2, 16, 12, True, 64), (150, 3, 20, 24, False, 64), (100, 2, 16, 16, True, 16),
    (45, 2, 12, 8, True, 7),
], ids=lambda x: str(x))
def test_naive_chunk(T, H, K, V, with_state, chunk):
    q, k, v, g, beta = make_kda_inputs(T, H, K, V)
    s0 = torch.randn(H, K, V, dtype=torch.float64) if with_state else None
    o_ref, s_ref = naive_recurrent_kda(q, k, v, g, beta, K ** -0.5, s0)
    o, s = chunk_kda(q, k, v, g, beta, K ** -0.5, s0, chunk_size=chunk)
    assert_close("o", o_ref, o, 1e-10)
    assert_close("state", s_ref, s, 1e-10)
    assert s.dtype == torch.float64


def test_naive_chunk_fp32_and_steep_decay():
    q, k, v, g, beta = make_kda_inputs(130, 2, 16, 16)
    o_ref, s_ref = naive_recurrent_kda(q, k, v, g * 40, beta, 0.25)  # g down to -200 per step: no overflow allowed
    o, s = chunk_kda(q, k, v, g * 40, beta, 0.25)
    assert_close("o steep", o_ref, o, 1e-10)
    o32, s32 = chunk_kda(*(t.float() for t in (q, k, v, g, beta)), 0.25)
    o_ref, s_ref = naive_recurrent_kda(q, k, v, g, beta, 0.25)
    o32r, _ = naive_recurrent_kda(*(t.float() for t in (q, k, v, g, beta)), 0.25)
    assert o32.dtype == torch.float32 and s32.dtype == torch.float32
    assert_close("o fp32", o32r.double(), o32, 1e-5)
    assert_close("state fp32", s_ref, s32, 1e-5)


def test_kda_recurrent_step_formula_and_no_inplace():
    B, H, K, V = 3, 2, 5, 7
    q, k, v, g = (torch.randn(B, H, d, dtype=torch.float64) for d in (K, K, V, K))
    beta, state = torch.rand(B, H, dtype=torch.float64), torch.randn(B, H, K, V, dtype=torch.float64)
    saved = [t.clone() for t in (q, k, v, g, beta, state)]
    o, s = kda_recurrent_step(q, k, v, g, beta, 0.5, state)
    for b in range(B):
        for h in range(H):
            S = g[b, h].exp()[:, None] * state[b, h]
            S = S + beta[b, h] * torch.outer(k[b, h], v[b, h] - S.T @ k[b, h])
            assert_close("S", S, s[b, h], 1e-12)
            assert_close("o", S.T @ (0.5 * q[b, h]), o[b, h], 1e-12)
    for before, after in zip(saved, (q, k, v, g, beta, state)):
        assert_bit_exact("input untouched", before, after)


def test_kda_gate_formula():
    f, A_log, dt_bias = torch.randn(4, 3, 6), torch.randn(8), torch.randn(18)
    g = kda_gate(f, A_log, dt_bias, -5.0)
    expect = -5.0 * torch.sigmoid(A_log[:3].exp()[:, None] * (f + dt_bias.view(3, 6)))
    assert g.dtype == torch.float32 and bool((g < 0).all() and (g > -5).all())
    assert_close("g", expect, g, 1e-6)
    with pytest.raises(ValueError, match=r"A_log \(2,\)"):
        kda_gate(f, torch.randn(2), dt_bias, -5.0)


@pytest.mark.parametrize("T", [1, 2, 9])
def test_short_conv_silu(T):
    D, W = 5, 4
    x, weight, window = torch.randn(T, D), torch.randn(D, W), torch.randn(W - 1, D)
    y, new_window = short_conv_silu(x, weight, window)
    full = torch.cat([window, x])
    expect = torch.stack([F.silu((full[t:t + W].T * weight).sum(-1)) for t in range(T)])
    assert_close("y", expect, y, 1e-6)
    assert_bit_exact("window", full[-(W - 1):], new_window)
    y0, _ = short_conv_silu(x, weight)  # None window == zeros
    assert_bit_exact("zero window", short_conv_silu(x, weight, torch.zeros(W - 1, D))[0], y0)
    # streaming: split the sequence and carry the window
    ya, wa = short_conv_silu(x[:1], weight, window)
    yb, wb = short_conv_silu(x[1:], weight, wa)
    assert_close("streamed", y, torch.cat([ya, yb]), 1e-6)
    assert_bit_exact("streamed window", new_window, wb)


def test_gated_rms_norm_formula():
    o, gate, w = torch.randn(3, 2, 8, dtype=torch.bfloat16), torch.randn(3, 2, 8, dtype=torch.bfloat16), torch.randn(8)
    out = gated_rms_norm(o, gate, w, 1e-5)
    of = o.float()
    expect = of / (of.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * w * torch.sigmoid(gate.float())
    assert out.dtype == torch.bfloat16
    assert_close("gated_rms_norm", expect, out.float(), 8e-3)


def test_l2_normalize():
    x = torch.randn(4, 3, 16, dtype=torch.float64)
    assert_close("norm", torch.ones(4, 3, dtype=torch.float64), l2_normalize(x).norm(dim=-1), 1e-6)


def test_kda_invalid_args():
    q, k, v, g, beta = make_kda_inputs(5, 2, 4, 4)
    with pytest.raises(ValueError, match=r"beta \(5, 3\)"):
        chunk_kda(q, k, v, g, torch.rand(5, 3, dtype=torch.float64), 0.5)
    with pytest.raises(ValueError, match=r"initial_state \(2, 4, 5\)"):
        naive_recurrent_kda(q, k, v, g, beta, 0.5, torch.zeros(2, 4, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"state \(1, 2, 4, 4\)"):
        kda_recurrent_step(q[:2], k[:2], v[:2], g[:2], beta[:2], 0.5, torch.zeros(1, 2, 4, 4))
    with pytest.raises(ValueError, match=r"window \(2, 5\)"):
        short_conv_silu(torch.randn(3, 5), torch.randn(5, 4), torch.zeros(2, 5))
