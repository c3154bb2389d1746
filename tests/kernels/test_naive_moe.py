"""MoE references: SiTU formula, routing vs brute force, latent MoE vs a per-token loop."""
import math

import pytest
import torch

from k3_sglang.kernels.moe import latent_moe, noaux_tc_route, situ, situ_mlp
from k3_sglang.kernels.norm import rms_norm
from tests.utils.numerics import assert_close


def test_situ_formula():
    g, u = torch.randn(50, dtype=torch.float64) * 10, torch.randn(50, dtype=torch.float64) * 40
    out = situ(g, u, 4.0, 25.0)
    for i in range(50):
        gi, ui = g[i].item(), u[i].item()
        expect = 4.0 * math.tanh(gi / 4.0) / (1 + math.exp(-gi)) * 25.0 * math.tanh(ui / 25.0)
        assert abs(out[i].item() - expect) <= 1e-12 * max(1.0, abs(expect))
    assert situ(g.bfloat16(), u.bfloat16(), 4.0, 25.0).dtype == torch.bfloat16


@pytest.mark.parametrize("renormalize,factor", [(True, 1.0), (False, 2.5)])
def test_noaux_tc_route_brute_force(renormalize, factor):
    T, E, k = 6, 11, 3
    logits, bias = torch.randn(T, E), torch.randn(E) * 0.3
    w, ids = noaux_tc_route(logits, bias, k, renormalize, factor)
    assert w.dtype == torch.float32 and ids.dtype == torch.int64
    for t in range(T):
        s = [1 / (1 + math.exp(-logits[t, e].item())) for e in range(E)]
        order = sorted(range(E), key=lambda e: -(s[e] + bias[e].item()))[:k]
        assert sorted(ids[t].tolist()) == sorted(order)
        total = sum(s[e] for e in order) + 1e-20 if renormalize else 1.0
        for j, e in enumerate(ids[t].tolist()):
            assert abs(w[t, j].item() - s[e] / total * factor) < 1e-6


def test_latent_moe_per_token_loop():
    T, D, Dl, E, I, k = 5, 12, 8, 6, 10, 2
    x = torch.randn(T, D, dtype=torch.float64)
    router_w, bias = torch.randn(E, D, dtype=torch.float64), torch.randn(E)
    down_w, up_w, norm_w = (torch.randn(Dl, D, dtype=torch.float64), torch.randn(D, Dl, dtype=torch.float64),
                            torch.randn(Dl, dtype=torch.float64))
    w1, w3, w2 = (torch.randn(E, I, Dl, dtype=torch.float64), torch.randn(E, I, Dl, dtype=torch.float64),
                  torch.randn(E, Dl, I, dtype=torch.float64))
    out = latent_moe(x, router_w, bias, down_w, up_w, norm_w, 1e-5, w1, w3, w2, k, True, 1.0, 4.0, 25.0)
    w, ids = noaux_tc_route(x.float() @ router_w.float().T, bias, k, True, 1.0)
    for t in range(T):
        z = x[t:t + 1] @ down_w.T
        r = sum(w[t, j].double() * situ_mlp(z, w1[e], w3[e], w2[e], 4.0, 25.0) for j, e in enumerate(ids[t].tolist()))
        assert_close(f"token {t}", rms_norm(r, norm_w, 1e-5) @ up_w.T, out[t:t + 1], 1e-12)
    with pytest.raises(ValueError, match=r"w2 \(6, 10, 8\)"):
        latent_moe(x, router_w, bias, down_w, up_w, norm_w, 1e-5, w1, w3, w2.transpose(1, 2), k, True, 1.0, 4.0, 25.0)
