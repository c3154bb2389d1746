"""Pipeline stages of the portable model against the whole model, in one process (tests/unit/pp_stage_harness.py).

The tiny K3 (float32, real checkpoint weights loaded strictly per stage) prefills the same requests in chunks,
once whole and once split into stages that hand `hidden_states` + `attn_res_bank` on through the wire format.
Same ops on the same thread count, so everything must be bit-identical: the final hidden states of every
chunk, every KDA layer's conv windows and recurrent states, every MLA pool row. Partitions cover the defaults
(PP2 4,5; PP4 2,2,2,3), a cut inside a block (5,4: two blocks on the wire), a stage with no MLA layer and a
stage with no KDA layer.
"""
from __future__ import annotations

import pytest
import torch

from k3_sglang.config import preset
from k3_sglang.parallel.pipeline import hop_bytes_per_token, stage_ranges
from k3_sglang.tiny.checkpoint import tiny_state_dict
from tests.unit.pp_stage_harness import StagePipeline

CFG = preset("k3-tiny")
# (pp_size, SGLANG_PP_LAYER_PARTITION or None for SGLang's default) -> what the case exercises
PARTITIONS = {
    (2, None): "default PP2: [0,4) [4,9), one block on the wire",
    (2, "5,4"): "cut inside a block: two blocks on the wire",
    (4, None): "default PP4: [0,2) and [4,6) have no MLA layer; blocks 1, 1, 2",
    (2, "7,2"): "[7,9) has no KDA layer (MLA 7, 8 only)",
    (3, "3,1,5"): "[0,3) no MLA, [3,4) a single MLA layer and no KDA",
}
# Two requests prefilled together in uneven chunks (a later chunk continues from the cached prefix and the
# KDA state of the earlier ones), the first one longer than the other.
STEPS = [([0, 1], [0, 0], [150, 40]), ([0, 1], [150, 40], [96, 64]), ([0], [246], [61])]


@pytest.fixture(scope="module")
def state():
    return tiny_state_dict(CFG)


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(11)
    return {0: torch.randint(0, 760, (307,), generator=gen), 1: torch.randint(0, 760, (104,), generator=gen)}


def _run(pipeline: StagePipeline, monkeypatch, prompts) -> list[torch.Tensor]:
    outs = []
    for reqs, prefix, new in STEPS:
        ids = torch.cat([prompts[r][p: p + n] for r, p, n in zip(reqs, prefix, new)])
        outs.append(pipeline.extend(monkeypatch, ids, reqs, prefix, new))
    return outs


@pytest.fixture(scope="module")
def whole(state, prompts):
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        pipeline = StagePipeline(CFG, stage_ranges(CFG.num_layers, 1), state)
        outs = _run(pipeline, mp, prompts)
    return pipeline, outs


@pytest.mark.parametrize("pp_size,partition", list(PARTITIONS), ids=[f"pp{p}-{q or 'default'}" for p, q in PARTITIONS])
def test_stages_are_bit_identical_to_the_whole_model(monkeypatch, state, prompts, whole, pp_size, partition):
    torch.set_num_threads(1)
    ref, ref_outs = whole
    stages = stage_ranges(CFG.num_layers, pp_size, partition)
    pipeline = StagePipeline(CFG, stages, state)
    outs = _run(pipeline, monkeypatch, prompts)
    for step, (got, want) in enumerate(zip(outs, ref_outs)):
        assert not torch.isnan(got).any() and got.abs().max() < 1e6, f"chunk {step}: poisoned or NaN output"
        assert torch.equal(got, want), f"chunk {step}: final hidden states differ"
    states, ref_states = pipeline.kda_states(), ref.kda_states()
    assert sorted(states) == sorted(ref_states) == list(CFG.kda.layer_ids)
    for lid, (conv, temporal) in states.items():
        assert temporal.dtype == torch.float32
        assert torch.equal(conv, ref_states[lid][0]), f"KDA layer {lid}: conv windows differ"
        assert torch.equal(temporal, ref_states[lid][1]), f"KDA layer {lid}: recurrent states differ"
    rows, ref_rows = pipeline.mla_rows(), ref.mla_rows()
    assert sorted(rows) == list(CFG.mla.layer_ids)
    for lid in rows:
        assert torch.equal(rows[lid], ref_rows[lid]), f"MLA layer {lid}: pool rows differ"
    # every hop carried (1 + ceil(cut / bs)) x H x 4 bytes per token, for every chunk
    tokens = [sum(new) for _, _, new in STEPS]
    for hop, sent in enumerate(pipeline.hop_bytes):
        per_token = hop_bytes_per_token(stages[hop].end, CFG.attn_res.block_size, CFG.hidden_size, 4)
        assert sent == [per_token * t for t in tokens], f"hop {hop} after layer {stages[hop].end}"


def test_stage_layer_kinds_of_the_partitions():
    """The partitions above really contain the stage shapes they claim (no MLA / no KDA / blocks on the wire)."""
    kinds = {}
    for (pp, part) in PARTITIONS:
        kinds[(pp, part)] = [(sum(i in s for i in CFG.mla.layer_ids), sum(i in s for i in CFG.kda.layer_ids))
                             for s in stage_ranges(CFG.num_layers, pp, part)]
    assert kinds[(4, None)] == [(0, 2), (1, 1), (0, 2), (2, 1)]
    assert kinds[(2, "7,2")][1] == (2, 0)
    assert kinds[(3, "3,1,5")][:2] == [(0, 3), (1, 0)]
    wire = [s.sent_blocks(CFG.attn_res.block_size) for s in stage_ranges(CFG.num_layers, 4)[:-1]]
    assert wire == [1, 1, 2]
