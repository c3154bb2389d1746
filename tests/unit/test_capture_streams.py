"""The portable model's hidden-state capture for a draft model (K3Model.layers_to_capture, set through the entry
class's `set_dspark_layers_to_capture`, SGLang's DSpark seam) against the float64 reference walk.

The tiny K3 (float32, the checkpoint `k3 serve` uses) prefills one request in two chunks (the second continues from
the cached prefix and KDA state) with capture on: the streams after layers (0, 4, 8) as their next reader mixes them
must match ReferenceK3.captured_streams over the whole sequence, and capturing must leave the final hidden states
bit-identical to a run without it. About 10 s.
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from k3_sglang.config import K3Config
from k3_sglang.model.reference import ReferenceK3, load_reference_tensors
from k3_sglang.parallel.pipeline import stage_ranges
from tests.unit.pp_stage_harness import StagePipeline
from tests.utils.numerics import assert_close

LAYERS = (0, 4, 8)  # block starts and ends (block size 4) and the last layer (the output read)
STEPS = [([0], [0], [70]), ([0], [70], [45])]


@pytest.fixture(scope="module")
def tiny():
    from k3_sglang.serving.cli import ensure_tiny_checkpoint
    from k3_sglang.serving.settings import ServeSettings

    path = ensure_tiny_checkpoint(ServeSettings.from_env())
    return K3Config.from_json(path), path


def _prefill(cfg, state, ids, capture: tuple[int, ...], monkeypatch):
    pipeline = StagePipeline(cfg, stage_ranges(cfg.num_layers, 1), state)
    pipeline.holders[0].model.layers_to_capture = capture
    outs = []
    for reqs, prefix, new in STEPS:
        chunk = torch.cat([ids[p: p + n] for p, n in zip(prefix, new)])
        outs.append(pipeline.extend(monkeypatch, chunk, reqs, prefix, new))
    return outs


def test_captured_streams_match_the_reference(tiny, monkeypatch):
    torch.set_num_threads(1)
    cfg, path = tiny
    state = load_file(str(path / "model.safetensors"))
    ids = torch.randint(0, 760, (115,), generator=torch.Generator().manual_seed(5))
    captured = _prefill(cfg, state, ids, LAYERS, monkeypatch)
    plain = _prefill(cfg, state, ids, (), monkeypatch)
    for (hidden, streams), want in zip(captured, plain):
        assert torch.equal(hidden, want), "capturing changed the final hidden states"
        assert streams.shape == (hidden.shape[0], len(LAYERS) * cfg.hidden_size)
    got = torch.cat([streams for _, streams in captured])
    ref = ReferenceK3(cfg, load_reference_tensors(path)).captured_streams(ids.tolist(), LAYERS)
    for j, layer in enumerate(LAYERS):
        cols = slice(j * cfg.hidden_size, (j + 1) * cfg.hidden_size)
        assert_close(f"stream after layer {layer}", ref[:, cols], got[:, cols], 2e-5)
    # the layers differ: a capture at the wrong layer would not match another's reference
    assert not torch.allclose(ref[:, : cfg.hidden_size], ref[:, -cfg.hidden_size:], rtol=0.1)


def test_entry_class_refuses_bad_layer_ids():
    from types import SimpleNamespace

    from k3_sglang.models.kimi_k3 import KimiK3ForConditionalGeneration
    from k3_sglang.parallel.pipeline import StageRange

    stub = SimpleNamespace(stage=StageRange.whole(9), k3=SimpleNamespace(num_layers=9),
                           model=SimpleNamespace(layers_to_capture=()))
    KimiK3ForConditionalGeneration.set_dspark_layers_to_capture(stub, [1, 8])
    assert stub.model.layers_to_capture == (1, 8)
    for bad in ([], [3, 1], [2, 9], [-1]):
        with pytest.raises(ValueError, match="increasing layer ids in 0..8"):
            KimiK3ForConditionalGeneration.set_dspark_layers_to_capture(stub, bad)
    stub.stage = StageRange(0, 4, 9)
    with pytest.raises(RuntimeError, match="whole model"):
        KimiK3ForConditionalGeneration.set_dspark_layers_to_capture(stub, [1])
