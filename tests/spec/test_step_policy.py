"""StepPolicy (k3_sglang/spec/policy.py) on stand-in batches: who may speculate, caps, forced lengths, cleanup."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from k3_sglang.spec.policy import StepPolicy, speculation_allowed
from k3_sglang.spec.settings import SpecSettings


def _info(**kw):
    base = dict(is_all_greedy=True, penalizer_orchestrator=SimpleNamespace(is_required=False), logit_bias=None,
                has_custom_logit_processor=False, grammars=None, has_watermark_candidates=False)
    base.update(kw)
    return SimpleNamespace(**base)


def _req(rid, prompt, output, max_new=64):
    return SimpleNamespace(rid=rid, origin_input_ids=prompt, output_ids=output,
                           sampling_params=SimpleNamespace(max_new_tokens=max_new))


def _batch(reqs, **info):
    seq = [len(r.origin_input_ids) + len(r.output_ids) - 1 for r in reqs]  # committed: the root's KV is not written
    return SimpleNamespace(reqs=reqs, return_logprob=False, has_grammar=False, sampling_info=_info(**info),
                           seq_lens_cpu=torch.tensor(seq))


def _counting_drafter():
    """A drafter class proposing gamma drafts at a settable class-wide confidence (`conf`), counting its calls."""
    from k3_sglang.spec.drafters.base import DraftBlock

    class Drafter:
        conf, calls = 0.01, 0

        def propose(self, requests, gamma):
            Drafter.calls += 1
            n = len(requests)
            return DraftBlock(np.full((n, gamma), 7, dtype=np.int64), np.full((n, gamma), Drafter.conf),
                              np.full(n, gamma, dtype=np.int64))

        def release(self, rid):
            pass

    return Drafter


def test_greedy_and_plainly_sampled_batches_speculate_the_rest_decode():
    reqs = [_req("a", [1, 2, 3], [4])]
    assert speculation_allowed(_batch(reqs))
    assert speculation_allowed(_batch(reqs, is_all_greedy=False))  # temperature/top-k/top-p/min-p: rejection sampling
    assert not speculation_allowed(_batch(reqs, is_all_greedy=False, sampling_seed=torch.tensor([42])))
    assert not speculation_allowed(_batch(reqs, is_all_greedy=False, sampling_mask_batch_indices=torch.tensor([0])))
    assert not speculation_allowed(_batch(reqs, has_custom_logit_processor=True))
    assert not speculation_allowed(_batch(reqs, has_watermark_candidates=True))
    assert not speculation_allowed(_batch(reqs, penalizer_orchestrator=SimpleNamespace(is_required=True)))
    assert not speculation_allowed(_batch(reqs, logit_bias=torch.zeros(1, 8)))
    b = _batch(reqs)
    b.return_logprob = True
    assert not speculation_allowed(b)


def test_forced_length_respects_remaining_tokens():
    policy = StepPolicy(SpecSettings(force_verify_len=4), gamma=7, vocab_size=100)
    reqs = [_req("a", [1, 2, 3], [9], max_new=10), _req("b", [5, 6], [7, 8], max_new=3)]
    lens, drafts = policy._plan_local(_batch(reqs), width=8, context_len=1000)
    assert lens == [4, 1]  # b may emit one more token: no draft
    assert drafts[0] == [9, 9, 9] and drafts[1] == []


def test_lookup_drafts_a_repeated_span_and_static_verifies_it():
    span = [11, 12, 13, 14, 15, 16, 17, 18]
    prompt = [1, 2] + span + [3, 4] + span[:3]
    policy = StepPolicy(SpecSettings(verify_mode="static"), gamma=3, vocab_size=100)
    reqs = [_req("a", prompt[:-1], [prompt[-1]]), _req("b", [50, 51, 52], [53])]
    lens, drafts = policy._plan_local(_batch(reqs), width=4, context_len=1000)
    assert lens[0] == 4 and drafts[0] == span[3:6]  # what followed the span's first three tokens before
    assert lens[1] == 1  # nothing to look up


def test_decode_mode_and_zero_confidence_never_verify():
    reqs = [_req("a", [1, 2, 3, 1, 2], [3])]
    assert StepPolicy(SpecSettings(verify_mode="decode"), 3, 100)._plan_local(_batch(reqs), 4, 1000)[0] == [1]
    policy = StepPolicy(SpecSettings(verify_mode="compact"), 3, 100)

    class Zero:
        def propose(self, requests, gamma):
            from k3_sglang.spec.drafters.base import DraftBlock

            n = len(requests)
            return DraftBlock(np.ones((n, gamma), np.int64), np.zeros((n, gamma)), np.full(n, gamma, np.int64))

        def release(self, rid):
            pass

    policy._drafter = Zero()
    assert policy._plan_local(_batch(reqs), 4, 1000)[0] == [1]


def test_departed_requests_are_released():
    released = []
    policy = StepPolicy(SpecSettings(verify_mode="decode"), 3, 100)
    policy._drafter = SimpleNamespace(release=released.append)
    policy._plan_local(_batch([_req("a", [1], [2]), _req("b", [1], [2])]), 4, 100)
    policy._plan_local(_batch([_req("b", [1], [2, 3])]), 4, 100)
    assert released == ["a"]


def test_measured_cpu_cost_verifies_alone_and_decodes_at_64():
    """With the built-in CPU fit, K3-chat-like confidence (q = 0.64) pays at batch 1 and not at batch 64."""
    from k3_sglang.spec.cost import AffineCost
    from k3_sglang.spec.planner import plan_step
    from k3_sglang.spec.policy import DEFAULT_CPU_COST

    cost = AffineCost(**DEFAULT_CPU_COST)
    survival = lambda n: np.cumprod(np.full((n, 7), 0.64), axis=1)  # noqa: E731
    assert plan_step(survival(1), np.array([8]), cost, "compact").mode == "verify"
    assert plan_step(survival(64), np.full(64, 8), cost, "compact").mode == "decode"


def test_settled_plain_decoding_probes_one_step_in_four_and_a_good_draft_ends_it():
    from k3_sglang.spec.policy import PROBE_AFTER, PROBE_EVERY

    Drafter = _counting_drafter()

    policy = StepPolicy(SpecSettings(verify_mode="compact"), gamma=3, vocab_size=100)
    policy._drafter = Drafter()
    policy.clock = lambda: 0.0  # probes that cost nothing: the shortest interval, PROBE_EVERY
    reqs = [_req("a", [1, 2, 3], [4], max_new=10_000)]
    asked = []
    for step in range(1, 25):
        before = Drafter.calls
        lens, _ = policy._plan_local(_batch(reqs), width=4, context_len=100_000)
        assert lens == [1]
        asked.append(Drafter.calls > before)
        reqs[0].output_ids.append(5)
    probes = [i + 1 for i, a in enumerate(asked) if a]
    assert probes[:PROBE_AFTER] == list(range(1, PROBE_AFTER + 1))  # every step until the streak settles
    assert all(b - a == PROBE_EVERY for a, b in zip(probes[PROBE_AFTER - 1:], probes[PROBE_AFTER:]))
    assert len(probes) == PROBE_AFTER + (24 - PROBE_AFTER) // PROBE_EVERY
    Drafter.conf = 0.99  # drafts worth verifying: the next probes (hysteresis) switch back to verify
    verified_at = None
    for step in range(1, 3 * PROBE_EVERY + 1):
        lens, _ = policy._plan_local(_batch(reqs), width=4, context_len=100_000)
        if lens[0] > 1:
            verified_at = step
            break
    assert verified_at is not None and verified_at <= 2 * PROBE_EVERY
    assert policy.group().plain_streak == 0
    assert policy._plan_local(_batch(reqs), width=4, context_len=100_000)[0][0] > 1  # and keeps verifying


def test_pipeline_microbatches_keep_their_own_mode():
    """Two request sets planned in turn (a PP2 first stage's microbatches): one with confident drafts, one whose
    drafts are not worth a verify. Each keeps its own hysteresis, so the second never verifies and the first
    never stops; one shared state would let the first's votes keep the second verifying."""
    from k3_sglang.spec.drafters.base import DraftBlock

    class Drafter:  # per-request confidence: rid "good" 0.99, "weak" 0.12 (a vote for decode, not an empty plan)
        def propose(self, requests, gamma):
            conf = np.array([[0.99 if r.rid == "good" else 0.12] * gamma for r in requests])
            n = len(requests)
            return DraftBlock(np.full((n, gamma), 7, dtype=np.int64), conf, np.full(n, gamma, dtype=np.int64))

        def release(self, rid):
            pass

    policy = StepPolicy(SpecSettings(verify_mode="compact"), gamma=3, vocab_size=100)
    policy._drafter = Drafter()
    good, weak = _req("good", [1, 2, 3], [4], max_new=10_000), _req("weak", [1, 2, 3], [4], max_new=10_000)
    for _ in range(12):
        assert policy._plan_local(_batch([good]), 4, 100_000, group=0)[0][0] > 1
        assert policy._plan_local(_batch([weak]), 4, 100_000, group=1)[0] == [1]
    assert policy.group(0).running == {"good"} and policy.group(1).running == {"weak"}


def test_probe_interval_keeps_the_probes_mean_cost_within_the_budget():
    from k3_sglang.spec.policy import PROBE_BUDGET, PROBE_EVERY, PROBE_MAX_EVERY, probe_interval

    decode = 0.040
    for probe in (1e-5, 1e-4, 2e-4, 5e-4, 1e-3, 3e-3):
        n = probe_interval(probe, decode)
        assert PROBE_EVERY <= n <= PROBE_MAX_EVERY
        if PROBE_EVERY < n < PROBE_MAX_EVERY:  # unclamped: the least interval within the budget
            assert probe / n <= PROBE_BUDGET * decode < probe / (n - 1)
    assert probe_interval(1e-6, decode) == PROBE_EVERY and probe_interval(1.0, decode) == PROBE_MAX_EVERY
    assert probe_interval(0.0, decode) == PROBE_EVERY and probe_interval(1e-3, 0.0) == PROBE_MAX_EVERY
    assert probe_interval(float("nan"), decode) == PROBE_EVERY


def test_settled_probes_are_priced_costly_probes_come_less_often_and_a_verify_resets_the_price():
    """A settled policy whose probes cost 8 ms against a 20 ms decode step (the cost model's) probes once in
    ceil(8 / (0.0025 x 20)) = 160 -> PROBE_MAX_EVERY steps; at 0.39 ms once in 8; the first verify plan resets it."""
    from k3_sglang.spec.cost import AffineCost
    from k3_sglang.spec.policy import PROBE_AFTER, PROBE_EVERY, PROBE_MAX_EVERY

    Drafter = _counting_drafter()

    class Clock:  # each probe reads it twice (before the drafter, after the planner): `cost` seconds apart
        now, cost, reads = 0.0, 0.008, 0

        def __call__(self):
            Clock.reads += 1
            if Clock.reads % 2 == 0:
                Clock.now += Clock.cost
            return Clock.now

    policy = StepPolicy(SpecSettings(verify_mode="compact"), gamma=3, vocab_size=100)
    policy._drafter, policy.clock, policy._cost = Drafter(), Clock(), AffineCost(0.05, 0.0, 0.0, 0.0, 0.02, 0.0)
    reqs = [_req("a", [1, 2, 3], [4], max_new=100_000)]

    def steps(n):
        asked = []
        for _ in range(n):
            before = Drafter.calls
            lens, _ = policy._plan_local(_batch(reqs), width=4, context_len=1_000_000)
            asked.append(Drafter.calls > before)
            reqs[0].output_ids.append(5)
        return [i for i, a in enumerate(asked) if a]

    probes = steps(PROBE_AFTER + 1 + 3 * PROBE_MAX_EVERY)
    assert policy.group().probe_every == PROBE_MAX_EVERY and policy.group().probe_s == 0.008
    gaps = [b - a for a, b in zip(probes[PROBE_AFTER - 1:], probes[PROBE_AFTER:])]
    assert gaps[0] == PROBE_EVERY and set(gaps[1:]) == {PROBE_MAX_EVERY}  # priced after the first settled probe
    Clock.cost = 0.00039
    steps(3 * PROBE_MAX_EVERY + 200)  # the moving average comes down over a few probes
    assert policy.group().probe_every == 8
    Drafter.conf = 0.99  # drafts worth verifying: the streak and the price reset
    for _ in range(3 * 8):
        if policy._plan_local(_batch(reqs), width=4, context_len=1_000_000)[0][0] > 1:
            break
        reqs[0].output_ids.append(5)
    assert policy.group().plain_streak == 0 and policy.group().probe_every == PROBE_EVERY
    assert policy.group().probe_s is None
