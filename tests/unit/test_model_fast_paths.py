"""The model's CPU fast paths against the kernel references on fresh random inputs."""

from __future__ import annotations

import pytest
import torch

from k3_sglang.config import preset
from k3_sglang.model.common import FusedWeightCache
from k3_sglang.model.ffn import LatentMoE


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert not torch.isnan(a).any()
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("tokens", [1, 5, 33])
def test_moe_dense_and_grouped_paths_match_reference(tokens):
    from k3_sglang.kernels.moe.naive import latent_moe

    torch.manual_seed(tokens)
    moe = LatentMoE(preset("k3-tiny"))
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.2)
        x = torch.randn(tokens, 128)
        m, s = moe.moe, moe.situ
        want = latent_moe(x.double(), moe.gate.weight.double(), moe.gate.e_score_correction_bias.double(),
                          moe.routed_expert_down_proj.weight.double(), moe.routed_expert_up_proj.weight.double(),
                          moe.routed_expert_norm.weight.double(), moe.routed_expert_norm.eps,
                          moe.experts.w1.double(), moe.experts.w3.double(), moe.experts.w2.double(),
                          m.num_experts_per_token, m.renormalize, m.routed_scaling_factor, s.beta, s.linear_beta)
        want = want + moe.shared_experts(x.double())
        assert _rel(moe(x), want) < 1e-5  # the dense small-model path
        import k3_sglang.model.ffn as ffn

        saved, ffn.DENSE_MOE_MAX_MACS = ffn.DENSE_MOE_MAX_MACS, 0
        try:
            assert _rel(moe(x), want) < 1e-5  # the grouped path
        finally:
            ffn.DENSE_MOE_MAX_MACS = saved


def test_fused_weight_cache_rebuilds_after_in_place_update():
    a, b = torch.randn(3, 4), torch.randn(2, 4)
    cache = FusedWeightCache()
    first = cache.get([a, b])
    assert torch.equal(first, torch.cat([a, b]))
    assert cache.get([a, b]) is first
    a.add_(1.0)
    assert torch.equal(cache.get([a, b]), torch.cat([a, b]))
