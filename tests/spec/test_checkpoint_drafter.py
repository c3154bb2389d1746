"""K3_SPEC_DRAFTER=checkpoint without a server: the drafter over a tiny random draft (k3_sglang/tooling/spec/
tiny_draft.py), the planner reading its confidence head through StepPolicy, the verify root rows, and the start-up
refusals (bad checkpoint, one that does not fit the target, PP) at `k3 serve` (exit 2) and in SGLang's launcher."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch

from k3_sglang.cli import main
from k3_sglang.config import preset
from k3_sglang.spec.algo import validate_server_args
from k3_sglang.spec.contract import draft_refusals
from k3_sglang.spec.drafters import build_drafter
from k3_sglang.spec.drafters.base import DraftRequest
from k3_sglang.spec.drafters.checkpoint import TargetHeads
from k3_sglang.spec.policy import StepPolicy
from k3_sglang.spec.root_capture import verify_root_rows
from k3_sglang.spec.settings import SpecSettings
from k3_sglang.tooling.spec.tiny_draft import write_tiny_draft
from tests.spec.test_step_policy import _batch, _req

TINY = preset("k3-tiny")
H, V, C = TINY.hidden_size, TINY.vocab_size, 3  # the tiny draft reads target layers (2, 5, 8)


def _target(hidden=H, vocab=V, layers=TINY.num_layers) -> TargetHeads:
    gen = torch.Generator().manual_seed(1)
    return TargetHeads(torch.randn(vocab, hidden, generator=gen), torch.randn(vocab, hidden, generator=gen) / 11,
                       hidden, vocab, layers)


def _feed(drafter, reqs, seed=3):
    """Fresh root features for stand-in requests (as the worker's capture leaves them after a forward)."""
    gen = torch.Generator().manual_seed(seed)
    drafter.put_roots([r.rid for r in reqs], [len(r.origin_input_ids) + len(r.output_ids) for r in reqs],
                      torch.randn(len(reqs), C * H, generator=gen))


def test_drafts_need_a_fresh_root_feature(tmp_path):
    drafter = build_drafter("checkpoint", draft_path=str(write_tiny_draft(tmp_path)), target=_target())
    assert drafter.target_layer_ids == (2, 5, 8) and drafter.feature_width == C * H
    drafter.put_roots(["a", "b"], [5, 9], torch.randn(2, C * H))
    reqs = [DraftRequest("a", [1, 2, 3], [4, 5]), DraftRequest("b", [1, 2], [3]), DraftRequest("c", [1], [2])]
    block = drafter.propose(reqs, 7)
    assert block.n_drafted.tolist() == [7, 0, 0]  # b's feature is for a longer context (stale), c has none
    assert ((block.tokens[0] >= 0) & (block.tokens[0] < V)).all()
    assert ((block.conf[0] > 0) & (block.conf[0] < 1)).all() and (block.conf[1:] == 0).all()
    assert drafter.propose(reqs, 3).n_drafted.tolist() == [3, 0, 0]  # gamma below the draft's block
    wide = drafter.propose(reqs, 9)  # above it: the draft's 7, padding after
    assert wide.n_drafted.tolist() == [7, 0, 0] and (wide.conf[0, 7:] == 0).all()
    drafter.observe("a", 3, 1)
    with pytest.raises(ValueError, match="n_verified"):
        drafter.observe("a", 8, 1)
    drafter.release("a")
    assert drafter.propose(reqs, 7).n_drafted.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="put_roots"):
        drafter.put_roots(["a"], [5], torch.randn(1, H))


def _plan(tmp_path, bias: float, n_reqs: int = 4) -> list[int]:
    """Verify lengths the compact planner picks for the tiny draft with confidence-head bias `bias` (measured CPU
    cost model, the default)."""
    path = write_tiny_draft(tmp_path / f"bias{bias}", confidence_bias=bias)
    policy = StepPolicy(SpecSettings(drafter="checkpoint", draft_path=str(path), verify_mode="compact"), gamma=7,
                        vocab_size=V, target=_target())
    reqs = [_req(f"r{i}", list(range(10 + i)), [7 + i]) for i in range(n_reqs)]
    _feed(policy.drafter, reqs)
    lens, drafts = policy._plan_local(_batch(reqs), width=8, context_len=4096)
    for n, d in zip(lens, drafts):
        assert len(d) == n - 1
    return lens


def test_the_planner_reads_the_confidence_head(tmp_path):
    low, half, mid, high = (_plan(tmp_path, b) for b in (-8.0, 0.0, 1.5, 8.0))
    assert low == [1, 1, 1, 1]  # confidence ~3e-4: a plain decode step
    assert high == [8, 8, 8, 8]  # confidence ~1: every draft verified
    budgets = [sum(lens) - 4 for lens in (low, half, mid, high)]
    assert budgets[0] < budgets[1] < budgets[2] < budgets[3], (half, mid)  # ~0.5 and ~0.8: some drafts, not all


def test_verify_root_rows():
    assert verify_root_rows([3, 1, 4], [2, 1, 4]) == [1, 3, 7]
    with pytest.raises(ValueError, match="commit length 0"):
        verify_root_rows([2], [0])


def test_bad_or_mismatched_checkpoints_are_clear_errors(tmp_path):
    good = write_tiny_draft(tmp_path / "good")
    with pytest.raises(ValueError, match="hidden_size 128 != the target's 64"):
        build_drafter("checkpoint", draft_path=str(good), target=_target(hidden=64))
    with pytest.raises(ValueError, match="vocab_size 1024 != the target's 2048"):
        build_drafter("checkpoint", draft_path=str(good), target=_target(vocab=2048))
    with pytest.raises(ValueError, match=r"target_layer_ids \[2, 5, 8\] must be increasing layer ids .*0..5"):
        build_drafter("checkpoint", draft_path=str(good), target=_target(layers=6))
    with pytest.raises(ValueError, match="K3_SPEC_DRAFT_PATH"):
        build_drafter("checkpoint", target=_target())
    with pytest.raises(ValueError, match="no config.json"):
        build_drafter("checkpoint", draft_path=str(tmp_path), target=_target())
    with pytest.raises(ValueError, match="K3_SPEC_DRAFT_PATH"):
        SpecSettings(drafter="checkpoint").ready()
    with pytest.raises(ValueError, match="no such directory"):
        SpecSettings(drafter="checkpoint", draft_path=str(tmp_path / "nope")).ready()


def _args(model_path, **kw):
    base = dict(model_path=str(model_path), pp_size=1, speculative_num_draft_tokens=8, speculative_eagle_topk=1,
                attention_backend=None, decode_attention_backend=None)
    return SimpleNamespace(**{**base, **kw})


@pytest.fixture
def k3_dir(tmp_path):
    folder = tmp_path / "k3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY.to_hf()))
    return folder


def test_draft_refusals_name_the_reason(tmp_path, k3_dir):
    good = write_tiny_draft(tmp_path / "good")
    env = {"K3_SPEC_DRAFTER": "checkpoint", "K3_SPEC_DRAFT_PATH": str(good)}
    assert draft_refusals(_args(k3_dir), env) == []
    assert any("--pp-size 2" in r for r in draft_refusals(_args(k3_dir, pp_size=2), env))
    wide = write_tiny_draft(tmp_path / "wide", target_layer_ids=(2, 9))
    reasons = draft_refusals(_args(k3_dir), {**env, "K3_SPEC_DRAFT_PATH": str(wide)})
    assert len(reasons) == 1 and "target_layer_ids [2, 9]" in reasons[0]
    broken = write_tiny_draft(tmp_path / "broken")
    os.remove(broken / "model.safetensors")
    assert "no *.safetensors" in draft_refusals(_args(k3_dir), {**env, "K3_SPEC_DRAFT_PATH": str(broken)})[0]
    assert draft_refusals(_args(k3_dir), {"K3_SPEC_DRAFT_PATH": str(wide)}) == []  # another drafter: not read


@pytest.fixture
def launched(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "execvpe", lambda file, command, env: calls.append(list(command)))
    for name in ("SGLANG_PLATFORM", "K3_MODEL_IMPL", "SGLANG_EXTERNAL_MODEL_PACKAGE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("k3_sglang.platform.cuda_available", lambda: False)
    return calls


def test_k3_serve_exits_2_for_a_draft_that_does_not_fit(tmp_path, k3_dir, monkeypatch, launched, capsys):
    monkeypatch.setenv("K3_SPEC_DRAFTER", "checkpoint")
    argv = ["serve", "--model-path", str(k3_dir), "--speculative-algorithm", "K3_CSV"]
    assert main(argv) == 2 and "K3_SPEC_DRAFT_PATH" in capsys.readouterr().err  # no path given
    monkeypatch.setenv("K3_SPEC_DRAFT_PATH", str(write_tiny_draft(tmp_path / "small", target_preset="k3-tiny",
                                                                  target_layer_ids=(1, 12))))
    assert main(argv) == 2 and "target_layer_ids [1, 12]" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"target_layer_ids \[1, 12\]"):
        validate_server_args(_args(k3_dir))
    assert not launched
    monkeypatch.setenv("K3_SPEC_DRAFT_PATH", str(write_tiny_draft(tmp_path / "good")))
    assert main(argv) == 0 and len(launched) == 1


def test_a_sharded_target_head_needs_the_drafts_own(tmp_path):
    shard = _target()
    shard = TargetHeads(shard.embed_weight[: V // 2], shard.lm_head_weight, H, V, TINY.num_layers)
    with pytest.raises(ValueError, match="embed_tokens.weight is neither .* shards it over TP"):
        build_drafter("checkpoint", draft_path=str(write_tiny_draft(tmp_path)), target=shard)


def test_the_sglang_seams_the_capture_uses_exist():
    """Drift check of what spec/root_capture.py relies on in the installed SGLang (no hook: public seams of its
    draft-model workers): the target worker's capture_hidden_mode override, the LogitsProcessor's aux hidden states,
    the modes, and SGLang's K3 `set_dspark_layers_to_capture`."""
    import inspect

    from sglang.srt.layers.logits_processor import LogitsProcessor
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.models.kimi_k3 import KimiK3ForConditionalGeneration, KimiK3LinearForCausalLM

    assert "capture_hidden_mode" in inspect.signature(TpModelWorker.forward_batch_generation).parameters
    assert "aux_hidden_states" in inspect.signature(LogitsProcessor.forward).parameters
    assert CaptureHiddenMode.LAST.is_last() and CaptureHiddenMode.FULL.is_full()
    for cls in (KimiK3ForConditionalGeneration, KimiK3LinearForCausalLM):
        assert list(inspect.signature(cls.set_dspark_layers_to_capture).parameters) == ["self", "layer_ids"]


def test_root_capture_keeps_the_row_that_chose_each_root(tmp_path):
    from k3_sglang.spec.root_capture import RootCapture

    drafter = build_drafter("checkpoint", draft_path=str(write_tiny_draft(tmp_path)), target=_target())
    asked = []
    capture = RootCapture(SimpleNamespace(set_dspark_layers_to_capture=asked.append), lambda: drafter)
    assert asked == [[2, 5, 8]]
    reqs = [_req("a", [1, 2, 3], [4]), _req("b", [5, 6], [7, 8])]
    rows = torch.randn(7, C * H, generator=torch.Generator().manual_seed(9))  # chains of 3 and 4 tokens
    capture.after_verify(reqs, SimpleNamespace(hidden_states=rows), [3, 4], [2, 4])

    def drafted(rid, prompt, output):
        return drafter.propose([DraftRequest(rid, prompt, output)], 7)

    # a committed 2 tokens (root: its second), b all 4: each drafts from its last accepted row, once its context is
    # that long, and from nothing else
    def same(block, row, anchor):  # tokens and confidence are what the draft makes of that row (and no other)
        tokens, conf = drafter.draft(rows[row: row + 1], torch.tensor([anchor]))
        other = drafter.draft(rows[row - 1: row], torch.tensor([anchor]))[1]
        assert not torch.allclose(conf, other), "rows indistinguishable: the check would not catch a wrong row"
        return block.tokens[0].tolist() == tokens[0].tolist() and torch.allclose(
            torch.from_numpy(block.conf[0]), conf[0].double())

    block = drafted("a", [1, 2, 3], [4, 10, 11])
    assert block.n_drafted[0] == 7 and same(block, 1, 11)
    assert drafted("a", [1, 2, 3], [4, 10]).n_drafted[0] == 0
    assert same(drafted("b", [5, 6], [7, 8, 1, 2, 3, 4]), 6, 4)
    capture.after_one_token(reqs, SimpleNamespace(hidden_states=rows[:2]))  # a plain decode: one row each
    assert drafted("a", [1, 2, 3], [4, 12]).n_drafted[0] == 7
    capture.after_one_token(reqs, SimpleNamespace(hidden_states=None))  # nothing captured: the old rows stay
    assert drafted("a", [1, 2, 3], [4, 12]).n_drafted[0] == 7
