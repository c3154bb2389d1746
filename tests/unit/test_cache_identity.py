"""The rules that excuse a flip between answers of a cached history and a recomputed one (bench/cache_identity.py), on
made-up probe rows and records; no server. About 1 s."""
from __future__ import annotations

import math

import pytest

from k3_sglang.tooling.bench.cache_identity import Probe, classify, first_flips
from k3_sglang.tooling.bench.session_traffic import SessionTraffic, TurnRecord, plan_session_prompts, turn_prompt


def _row(top=(-1.0, -1.00001), vocab=8):
    row = [-9.0 - i for i in range(vocab)]
    row[3], row[5] = top
    return row


def _pair(delta=6e-6, top=(-1.0, -1.00001), cached_tokens=100):
    a = _row(top)
    b = [x + (delta if i % 2 else -delta) for i, x in enumerate(a)]
    return Probe(tuple(a), 0), Probe(tuple(b), cached_tokens)


def test_a_flip_inside_the_measured_rounding_is_a_excused():
    recomputed, cached = _pair()
    v = classify(3, 5, recomputed, cached)
    assert v.excused and v.gap == pytest.approx(1e-5) and v.delta == pytest.approx(6e-6), v


@pytest.mark.parametrize("case, why", [
    (dict(delta=1e-7), "above 2 x delta"),  # the rows agree far closer than the gap: not rounding's doing
    (dict(delta=0.05), "more than rounding"),  # caching moves the row: a wrong state, not rounding
    (dict(top=(-1.0, -3.0)), "above 2 x delta"),
    (dict(cached_tokens=0), "nothing cached"),
])
def test_anything_else_is_not(case, why):
    recomputed, cached = _pair(**case)
    v = classify(3, 5, recomputed, cached)
    assert not v.excused and why in v.why, v


def test_tokens_outside_the_top_two_nan_and_a_cached_recompute_fail():
    recomputed, cached = _pair()
    assert "top two" in classify(3, 0, recomputed, cached).why
    nan = Probe(tuple(math.nan if i == 1 else x for i, x in enumerate(recomputed.row)), 0)
    assert classify(3, 5, nan, cached).why == "NaN in a probe row"
    assert "found 7 tokens cached" in classify(3, 5, Probe(recomputed.row, 7), cached).why
    assert classify(3, 99, recomputed, cached).why == "token outside the probe row"
    hole = Probe(tuple(-math.inf if i == 5 else x for i, x in enumerate(recomputed.row)), 0)
    assert classify(3, 5, hole, cached).why == "a token missing from a probe row"


def _rec(session, turn, out):
    return TurnRecord(session, turn, 10, 0, {}, 0.1, 0.2, tuple(out))


def test_first_flips_judge_each_sessions_first_difference_only():
    ref = [_rec(0, 0, (1, 2)), _rec(1, 0, (3, 4)), _rec(0, 1, (5, 6)), _rec(1, 1, (7, 8))]
    other = [_rec(0, 0, (1, 2)), _rec(1, 0, (3, 9)), _rec(0, 1, (5, 6)), _rec(1, 1, (0, 0))]
    assert first_flips(ref, other) == [(1, 1)]  # session 1's turn 1 follows its flip: not comparable
    assert first_flips(ref, ref) == []
    with pytest.raises(ValueError, match="same traffic"):
        first_flips(ref, other[::-1])


def test_turn_prompt_rebuilds_what_the_session_sent():
    traffic = SessionTraffic(sessions=2, first_tokens=5, tool_tokens=2, output_tokens=1, turns=3)
    openings, tools = plan_session_prompts(traffic)
    recs = [_rec(s, t, (100 + 10 * s + t,)) for t in range(3) for s in range(2)]
    assert turn_prompt(traffic, recs, 1, 0) == openings[1]
    assert turn_prompt(traffic, recs, 1, 2) == openings[1] + [110] + tools[1][0] + [111] + tools[1][1]


def test_the_float64_reference_excuses_a_recompute_that_strayed():
    from k3_sglang.tooling.bench.cache_identity import reference_verdict

    row = [-5.0] * 8
    row[5], row[3] = -0.5, -0.56  # the cached arm's token 5 is the exact model's argmax
    v = reference_verdict(row, 3, 5)
    assert v.excused and "strayed" in v.why and v.gap == pytest.approx(0.06)
    assert not reference_verdict(row, 5, 3).excused  # the cached arm picked the reference's second
    assert not reference_verdict(row, 1, 2).excused  # neither is the argmax
    assert reference_verdict([math.nan] * 8, 3, 5).why == "no usable reference row"
