"""The loader's manifest of K3 text tensors, and the model built on the meta device consuming it."""

from __future__ import annotations

import pytest
import torch

from k3_sglang.config import preset
from k3_sglang.loader.manifest import manifest_totals, text_manifest
from k3_sglang.loader.weights import EXPERT_RE, canonical_name


def test_k3_full_manifest_totals():
    specs = text_manifest(preset("k3-full"), prefix="language_model.")
    assert manifest_totals(specs) == (497_052, 1_559_965_606_912)
    # published checkpoint minus the vision tower's 168 tensors
    assert 497_220 - len(specs) == 168
    names = [s.name for s in specs]
    assert len(set(names)) == len(names)
    a_log = next(s for s in specs if s.name.endswith("layers.0.self_attn.A_log"))
    assert a_log.shape == (128,) and a_log.dtype == "f32"
    expert = [s for s in specs if ".layers.5.block_sparse_moe.experts.7." in s.name]
    assert sum(s.nbytes for s in expert) == 17_547_264


def _meta_model(cfg):
    from k3_sglang.model.decoder import K3Model

    with torch.device("meta"):
        model = K3Model(cfg)
        lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    params = {f"model.{n}": p for n, p in model.named_parameters()}
    params["lm_head.weight"] = lm_head.weight
    return params


@pytest.mark.parametrize("name", ["k3-tiny", "k3-full"])
def test_meta_model_consumes_every_manifest_entry(name):
    cfg = preset(name)
    params = _meta_model(cfg)
    assert all(p.device.type == "meta" for p in params.values())
    used: set[str] = set()
    for spec in text_manifest(cfg, prefix="language_model."):
        target = canonical_name(spec.name)
        match = EXPERT_RE.match(target)
        if match:
            param = params[f"{match.group(1)}.{match.group(3)}"]
            rows, cols = param.shape[1:]
            expected = (rows, cols // 2) if match.group(4) == "weight_packed" else (rows, cols // cfg.quant.group_size)
            assert spec.shape == expected, spec
            used.add(f"{match.group(1)}.{match.group(3)}")
            continue
        param = params[target]
        if target.endswith("A_log"):
            assert spec.shape[0] >= param.shape[0]
        else:
            assert tuple(param.shape) == spec.shape, spec
        used.add(target)
    assert used == set(params), sorted(set(params) - used)[:5]
