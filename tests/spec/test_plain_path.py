"""The plain path (k3_sglang/spec/plain_path.py) on stand-in batches: who takes it, the step decision taken before
SGLang prepares the batch and used once by the worker's plan, the KV reserve given back, and the switch both ways.
The e2e proof (token identity with a no-spec server while steps switch paths) is tests/e2e/test_spec_serve.py's
SGLang K3 test."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from k3_sglang.spec import plain_path
from k3_sglang.spec.policy import PROBE_AFTER, StepPolicy
from k3_sglang.spec.settings import SpecSettings
from tests.spec.test_step_policy import _batch, _counting_drafter, _req


def _args(**kw):
    base = dict(tp_size=1, pp_size=1, dp_size=1, disaggregation_mode="null", page_size=None,
                disable_overlap_schedule=True)
    base.update(kw)
    return SimpleNamespace(**base)


def test_refusals_name_what_keeps_plain_steps_on_the_speculative_path():
    ok = SpecSettings()
    assert plain_path.plain_path_refusal(_args(), ok) is None
    assert plain_path.plain_path_refusal(_args(page_size=1), ok) is None
    assert "K3_SPEC_PLAIN_PATH" in plain_path.plain_path_refusal(_args(), SpecSettings(plain_path=False))
    assert "--tp-size" in plain_path.plain_path_refusal(_args(tp_size=2), ok)
    assert "--pp-size" in plain_path.plain_path_refusal(_args(pp_size=2), ok)
    assert "PD" in plain_path.plain_path_refusal(_args(disaggregation_mode="decode"), ok)
    assert "--page-size" in plain_path.plain_path_refusal(_args(page_size=16), ok)
    assert "overlap" in plain_path.plain_path_refusal(_args(disable_overlap_schedule=False), ok)
    assert "checkpoint" in plain_path.plain_path_refusal(_args(), SpecSettings(drafter="checkpoint"))
    assert "FORCE" in plain_path.plain_path_refusal(_args(), SpecSettings(force_verify_len=3))


def test_plain_ahead_decides_once_and_the_plan_uses_that_decision():
    """decode mode and unverifiable batches are plain ahead; a settled compact policy is plain between probes, and
    the probe decision taken before SGLang prepared the step is the one its plan uses (the skip counter moves once
    per step, whichever of the two asks)."""
    reqs = [_req("a", [1, 2, 3], [4], max_new=10_000)]
    assert StepPolicy(SpecSettings(verify_mode="decode"), 3, 100).plain_ahead(_batch(reqs))
    logprob = _batch(reqs)
    logprob.return_logprob = True
    assert StepPolicy(SpecSettings(), 3, 100).plain_ahead(logprob)
    assert not StepPolicy(SpecSettings(force_verify_len=2), 3, 100).plain_ahead(_batch(reqs))
    assert not StepPolicy(SpecSettings(verify_mode="static"), 3, 100).plain_ahead(_batch(reqs))

    Drafter = _counting_drafter()
    policy = StepPolicy(SpecSettings(verify_mode="compact"), gamma=3, vocab_size=100)
    policy._drafter = Drafter()
    policy.clock = lambda: 0.0
    for _ in range(PROBE_AFTER):  # unsettled: every step is planned (on the speculative path)
        assert not policy.plain_ahead(_batch(reqs))
        assert policy._plan_local(_batch(reqs), 4, 100_000)[0] == [1]
    decisions, calls = [], []
    for _ in range(12):
        plain = policy.plain_ahead(_batch(reqs))
        decisions.append(plain)
        before = Drafter.calls
        if not plain:  # a probe: the worker plans it and the drafter is asked exactly then
            assert policy._plan_local(_batch(reqs), 4, 100_000)[0] == [1]
        calls.append(Drafter.calls - before)
    assert decisions == [True, True, True, False] * 3  # PROBE_EVERY = 4
    assert calls == [0, 0, 0, 1] * 3


class _Row:
    """A request's kv record over one req_to_token row."""

    def __init__(self, committed, allocated, idx=0):
        self.kv_committed_len, self.kv_allocated_len, self.req_pool_idx = committed, allocated, idx

    @property
    def holds_kv(self):
        return self.req_pool_idx is not None


def _kv_batch(rows, finished=()):
    freed = []
    cache = SimpleNamespace(free_kv_row=lambda kv, ranges: freed.append((kv.req_pool_idx, ranges)))
    reqs = [SimpleNamespace(kv=r, finished=(lambda i=i: i in finished)) for i, r in enumerate(rows)]
    batch = SimpleNamespace(reqs=reqs, tree_cache=cache, spec_algorithm=SpeculativeAlgorithm.from_string("K3_CSV"),
                            spec_info=object(), seq_lens=torch.tensor([r.kv_committed_len for r in rows]),
                            orig_seq_lens=torch.zeros(len(rows), dtype=torch.int64), is_empty=lambda: not reqs)
    return batch, freed


@pytest.fixture(autouse=True)
def _k3_csv_registered():
    from k3_sglang.spec.plugin import register

    register()
    yield
    plain_path.take_plain_path(None)


def test_switching_to_plain_gives_back_the_reserve_and_switching_back_restores_k3_csv():
    rows = [_Row(40, 56, 0), _Row(10, 10, 1), _Row(7, 23, 2), _Row(5, 21, None)]
    batch, freed = _kv_batch(rows, finished={2})
    k3_csv = batch.spec_algorithm
    worker = SimpleNamespace(spec_algorithm=None)
    plain_path.to_plain(batch, worker)
    assert batch.spec_algorithm.is_none() and batch.spec_info is None and worker.spec_algorithm is k3_csv
    assert freed == [(0, [(40, 56)])]  # finished (2) and rowless (3) requests are not touched; 1 had no reserve
    assert (rows[0].kv_allocated_len, rows[1].kv_allocated_len, rows[2].kv_allocated_len) == (40, 10, 23)
    assert torch.equal(batch.orig_seq_lens, batch.seq_lens)
    plain_path.to_plain(batch, worker)  # already plain: nothing more is freed
    assert len(freed) == 1
    plain_path.to_speculative(batch, worker)
    assert batch.spec_algorithm is k3_csv and batch.spec_info is None
    plain_path.to_speculative(batch, worker)  # already speculative: unchanged
    assert batch.spec_algorithm is k3_csv


def test_the_hook_switches_before_sglang_prepares_and_is_inert_without_an_owner():
    """...and a plain step is counted as the speculative path counted it (one forward, one token per request)."""
    batch, _ = _kv_batch([_Row(40, 56, 0), _Row(9, 9, 1)])
    for req in batch.reqs:
        req.spec_verify_ct = 0
    counted = []
    scheduler = SimpleNamespace(metrics_reporter=SimpleNamespace(
        update_spec_metrics=lambda n, correct, num_accept_tokens: counted.append((n, correct, num_accept_tokens))))
    seen = []
    original = lambda scheduler, b: seen.append(b.spec_algorithm.is_none()) or b  # noqa: E731
    plain_path.update_running_batch(original, scheduler, batch)  # no owner: untouched
    assert seen == [False] and not batch.spec_algorithm.is_none() and not counted
    answers = iter([True, True, False, True])
    worker = SimpleNamespace(spec_algorithm=None, policy=SimpleNamespace(plain_ahead=lambda b: next(answers)))
    plain_path.take_plain_path(worker)
    for _ in range(4):
        assert plain_path.update_running_batch(original, scheduler, batch) is batch
    assert seen[1:] == [True, True, False, True]
    assert counted == [(2, 0, 2)] * 3 and [r.spec_verify_ct for r in batch.reqs] == [3, 3]
