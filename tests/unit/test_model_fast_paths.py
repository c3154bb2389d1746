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
def test_dense_moe_matches_grouped_reference(tokens):
    torch.manual_seed(tokens)
    moe = LatentMoE(preset("k3-tiny"))
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.2)
        x = torch.randn(tokens, 128)
        assert _rel(moe._routed_dense(x), moe._routed_grouped(x)) < 1e-5


def test_fused_weight_cache_rebuilds_after_in_place_update():
    a, b = torch.randn(3, 4), torch.randn(2, 4)
    cache = FusedWeightCache()
    first = cache.get([a, b])
    assert torch.equal(first, torch.cat([a, b]))
    assert cache.get([a, b]) is first
    a.add_(1.0)
    assert torch.equal(cache.get([a, b]), torch.cat([a, b]))
