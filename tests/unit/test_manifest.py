"""The tiny checkpoint builder's manifest of K3 text tensors (k3_sglang/tiny/manifest.py) against the published K3's
tensor count and sizes (that SGLang's K3 consumes every tensor of it is checked by loading the tiny checkpoint, end
to end: tests/e2e)."""

from __future__ import annotations

from k3_sglang.config import preset
from k3_sglang.tiny.manifest import manifest_totals, text_manifest


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
