"""k3_sglang.parallel.pipeline: stage partitions (against SGLang's own get_pp_indices), the per-stage weight
filter and strict per-stage loading, the wire format and bytes per hop."""
from __future__ import annotations

import pytest
import torch

from k3_sglang.config import preset
from k3_sglang.kernels import dispatch
from k3_sglang.loader.weights import K3WeightLoader, WeightLoadError, canonical_name
from k3_sglang.parallel.pipeline import (
    BANK_KEY,
    LIVE_KEY,
    StageRange,
    describe_stage,
    hop_bytes_per_token,
    pack_carry,
    stage_ranges,
    unpack_carry,
)
from k3_sglang.tiny.checkpoint import tiny_state_dict
from tests.unit.pp_stage_harness import _Holder

TINY = preset("k3-tiny")


@pytest.fixture(scope="module")
def state():
    return tiny_state_dict(TINY)


@pytest.mark.parametrize("num_layers,pp_size,partition", [
    (9, 1, None), (9, 2, None), (9, 3, None), (9, 4, None), (9, 9, None), (93, 2, None), (93, 4, None),
    (93, 8, None), (16, 4, None), (9, 2, "7,2"), (9, 3, "3,1,5"), (93, 2, "48,45"), (9, 1, "3,6"),
])
def test_stage_ranges_match_sglang_get_pp_indices(monkeypatch, num_layers, pp_size, partition):
    from sglang.srt.distributed.utils import get_pp_indices

    if partition is None:
        monkeypatch.delenv("SGLANG_PP_LAYER_PARTITION", raising=False)
    else:
        monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", partition)
    ours = [(s.start, s.end) for s in stage_ranges(num_layers, pp_size, partition)]
    assert ours == [get_pp_indices(num_layers, r, pp_size) for r in range(pp_size)]


def test_the_model_takes_its_stage_from_sglang(monkeypatch):
    """The SGLang entry module asks get_pp_indices (so SGLANG_PP_LAYER_PARTITION applies) for this rank."""
    from types import SimpleNamespace

    import sglang.srt.runtime_context as runtime_context

    from k3_sglang.models.kimi_k3 import _pipeline_stage

    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "7,2")
    for rank, want in [(0, (0, 7)), (1, (7, 9))]:
        monkeypatch.setattr(runtime_context, "get_parallel", lambda r=rank: SimpleNamespace(pp_rank=r, pp_size=2))
        stage = _pipeline_stage(9)
        assert (stage.start, stage.end) == want and stage.is_first == (rank == 0) and stage.is_last == (rank == 1)


@pytest.mark.parametrize("bad", ["4,4", "3,x", "9,0"])
def test_bad_partitions_are_refused(bad):
    with pytest.raises(ValueError, match="SGLANG_PP_LAYER_PARTITION|non-empty"):
        stage_ranges(9, 2, bad)
    with pytest.raises(ValueError, match="non-empty layer range"):
        stage_ranges(9, 10)  # more stages than layers


@pytest.mark.parametrize("pp_size", [2, 4])
def test_every_checkpoint_tensor_belongs_to_exactly_one_stage(state, pp_size):
    stages = stage_ranges(TINY.num_layers, pp_size)
    for raw in state:
        name = canonical_name(raw)
        owners = [i for i, s in enumerate(stages) if s.owns(name)]
        assert len(owners) == 1, (name, owners)
        if name.startswith("model.embed_tokens."):
            assert owners == [0]
        if name.startswith(("lm_head.", "model.norm.", "model.output_attn_res_")):
            assert owners == [pp_size - 1]


def test_unknown_names_stay_owned_so_the_loader_still_refuses_them():
    for stage in stage_ranges(9, 4):
        assert stage.owns("model.layers.999.self_attn.q_proj.weight")  # beyond the model: every stage errors
        assert stage.owns("model.rotary_emb.inv_freq")


def test_stage_loads_only_its_tensors_and_dequantises_only_its_experts(monkeypatch, state):
    calls = []
    real = dispatch.dequant_mxfp4
    monkeypatch.setattr(dispatch, "dequant_mxfp4", lambda *a, **k: calls.append(1) or real(*a, **k))
    stage = stage_ranges(9, 2)[0]  # [0, 4): layer 0 dense, layers 1-3 MoE
    holder = _Holder(TINY, stage)
    loader = K3WeightLoader(holder, owns=stage.owns)
    loader.load(state.items())
    loader.finish()
    assert len(calls) == 3 * TINY.moe.num_experts * 3  # w1, w2, w3 of 8 experts in layers 1, 2, 3 only
    names = {n for n, _ in holder.named_parameters()}
    assert "model.embed_tokens.weight" in names and not any(n.startswith("lm_head") for n in names)
    assert not any(n.startswith(("model.layers.4.", "model.layers.8.", "model.norm.")) for n in names)


def test_a_stage_missing_one_of_its_tensors_fails_by_name(state):
    stage = stage_ranges(9, 2)[1]
    dropped = "language_model.model.layers.7.self_attn.kv_b_proj.weight"
    loader = K3WeightLoader(_Holder(TINY, stage), owns=stage.owns)
    loader.load((n, t) for n, t in state.items() if n != dropped)
    with pytest.raises(WeightLoadError, match="kv_b_proj"):
        loader.finish()
    other = stage_ranges(9, 2)[0]  # the same tensor is not stage 0's business
    loader = K3WeightLoader(_Holder(TINY, other), owns=other.owns)
    loader.load((n, t) for n, t in state.items() if n != dropped)
    loader.finish()


def test_a_stage_refuses_a_tensor_of_its_own_layer_with_no_parameter(state):
    stage = stage_ranges(9, 2)[1]
    loader = K3WeightLoader(_Holder(TINY, stage), owns=stage.owns)
    with pytest.raises(WeightLoadError, match="no matching model parameter"):
        loader.load([("model.layers.5.self_attn.not_a_weight", torch.zeros(1))])


def test_pack_unpack_round_trip_is_contiguous_token_major():
    t, h = 7, 16
    live = torch.randn(h, t).T  # a non-contiguous view: the wire copy must be contiguous
    bank = [torch.randn(t, h) for _ in range(3)]
    wire = pack_carry(live, bank)
    assert set(wire) == {LIVE_KEY, BANK_KEY} == {"hidden_states", "attn_res_bank"}  # SGLang's K3 keys
    assert wire[BANK_KEY].shape == (t, 3, h) and all(v.is_contiguous() for v in wire.values())
    got_live, got_bank = unpack_carry({**wire, "__msg_type__": "proxy"}, t, 3, h)
    assert torch.equal(got_live, live) and all(torch.equal(a, b) for a, b in zip(got_bank, bank))


@pytest.mark.parametrize("tensors,match", [
    ({LIVE_KEY: torch.zeros(5, 8)}, "lacks"),
    ({LIVE_KEY: torch.zeros(4, 8), BANK_KEY: torch.zeros(5, 1, 8)}, "hidden_states is"),
    ({LIVE_KEY: torch.zeros(5, 8), BANK_KEY: torch.zeros(5, 2, 8)}, "same layer partition"),
    ({LIVE_KEY: torch.zeros(5, 8), BANK_KEY: torch.zeros(1, 5, 8)}, "attn_res_bank is"),
])
def test_unpack_refuses_a_carry_that_does_not_fit_the_stage(tensors, match):
    with pytest.raises(ValueError, match=match):
        unpack_carry(tensors, 5, 1, 8)


def test_hop_bytes_per_token_table():
    """(1 + ceil(cut / bs)) x H x dtype bytes: the numbers of the design note's table."""
    assert hop_bytes_per_token(4, 4, 128, 4) == 1024 and hop_bytes_per_token(5, 4, 128, 4) == 1536
    assert hop_bytes_per_token(46, 12, 7168, 2) == 71_680 and hop_bytes_per_token(36, 12, 7168, 2) == 57_344
    pp8 = stage_ranges(93, 8)
    assert sum(hop_bytes_per_token(s.end, 12, 7168, 2) for s in pp8[:-1]) == 501_760
    carried = [s.sent_blocks(12) for s in pp8[:-1]]
    assert carried == [1, 2, 3, 4, 5, 6, 7]


def test_describe_stage_names_the_layers():
    text = describe_stage(StageRange(4, 9, 9), TINY)
    assert text == ("layers [4, 9) of 9 (KDA 4, 5, 6; MLA 7, 8); receives hidden_states + 1 AttnRes block; "
                    "last stage (output read, norm, lm_head)")
    assert "no MLA" in describe_stage(StageRange(0, 2, 9), TINY)
    assert "no KDA" in describe_stage(StageRange(7, 9, 9), TINY)
