"""The benches' output-identity classifier (tooling/bench/output_identity.py) without servers: first differing
position, the near-tie verdict in bf16 and float32, the mismatch search, report lines."""
from __future__ import annotations

import math

import pytest

from k3_sglang.tooling.bench import output_identity as oi


def _row(logits: dict[int, float], vocab: int = 16, rest: float = 0.0) -> list[float]:
    """A log-softmax row ([vocab]) over logits that are `rest` except where given."""
    z = [logits.get(t, rest) for t in range(vocab)]
    lse = math.log(sum(math.exp(x) for x in z))
    return [x - lse for x in z]


@pytest.mark.parametrize("ref, other, want", [
    ((1, 2, 3), (1, 2, 3), None), ((1, 2, 3), (1, 5, 3), 1), ((4,), (5,), 0), ((1, 2), (1, 2, 3), 2),
    ((1, 2, 3), (1, 2), 2), ((), (), None)])
def test_first_difference(ref, other, want):
    assert oi.first_difference(ref, other) == want


def test_a_top_two_gap_under_the_bf16_rounding_is_a_near_tie():
    # the two tokens' logits sit ~8 above a row centred near 0: bf16 rounds them by ~8 x 2^-8 = 0.031
    row = _row({3: 8.0, 7: 8.0 - 0.02})
    v = oi.classify(3, 7, row, "bfloat16")
    assert v.near_tie and v.gap == pytest.approx(0.02, rel=1e-6)
    mean = sum(row) / len(row)
    assert v.tolerance == pytest.approx((row[3] - mean) * 2 ** -8, rel=1e-9)
    assert 0.02 < v.tolerance < 0.04
    assert oi.classify(7, 3, row, "bfloat16").near_tie  # symmetric in which arm picked which


def test_a_gap_above_the_rounding_is_not_a_near_tie():
    v = oi.classify(3, 7, _row({3: 8.0, 7: 8.0 - 0.05}), "bfloat16")
    assert not v.near_tie and v.gap == pytest.approx(0.05, rel=1e-6) and v.tolerance < 0.05
    assert "above" in v.why


def test_the_tolerance_scales_with_the_row_not_with_the_softmax_shift():
    """Log-probabilities are logits minus a shift; the same logits shifted by 100 classify the same, while the same
    gap on logits four times smaller (measured from the row's mean) is no longer a tie."""
    base = oi.classify(3, 7, _row({3: 8.0, 7: 7.98}), "bfloat16")
    shifted = oi.classify(3, 7, _row({3: 108.0, 7: 107.98}, rest=100.0), "bfloat16")
    assert base.near_tie and shifted.near_tie
    assert shifted.tolerance == pytest.approx(base.tolerance, rel=1e-6)
    assert not oi.classify(3, 7, _row({3: 2.0, 7: 1.98}), "bfloat16").near_tie


def test_a_token_outside_the_top_two_is_never_a_near_tie():
    row = _row({3: 8.0, 5: 8.005, 7: 7.99})  # the arms picked 3 and 7, but 5 is above both
    v = oi.classify(3, 7, row, "bfloat16")
    assert not v.near_tie and "not the top two" in v.why and "ranks 2 and 3" in v.why


def test_float32_excuses_nothing_and_bad_rows_fail():
    tie = _row({3: 8.0, 7: 8.0 - 1e-6})
    assert not oi.classify(3, 7, tie, "float32").near_tie
    assert "token identity" in oi.classify(3, 7, tie, "float32").why
    poisoned = list(tie)
    poisoned[9] = float("nan")
    assert not oi.classify(3, 7, poisoned, "bfloat16").near_tie
    assert not oi.classify(3, 7, None, "bfloat16").near_tie
    assert not oi.classify(3, 99, tie, "bfloat16").near_tie
    assert not oi.classify(None, 7, tie, "bfloat16").near_tie  # one output ended first


def test_unreported_tokens_do_not_shift_the_mean():
    """A probe row holds -inf where the server reported nothing; the mean is over the finite entries."""
    row = _row({3: 8.0, 7: 7.98})
    holed = list(row)
    holed[12] = float("-inf")
    v, w = oi.classify(3, 7, row, "bfloat16"), oi.classify(3, 7, holed, "bfloat16")
    assert w.near_tie and math.isfinite(w.tolerance)
    assert w.tolerance != pytest.approx(v.tolerance, rel=1e-12)


def test_find_mismatches_against_a_and_explain_in_float32_needs_no_server():
    outputs = {"k/0": {"A": (1, 2, 3), "B": (1, 2, 3), "C": (1, 9, 3)},
               "k/1": {"A": (4, 5), "oracle": (4, 6)},
               "k/2": {"B": (1,), "C": (2,)}}  # no A: nothing to compare against
    assert oi.find_mismatches(outputs) == [("k/0", "C", 1), ("k/1", "oracle", 1)]
    found = oi.explain(outputs, {"k/0": [7], "k/1": [8]}, None, "float32", 16)
    assert [(m.key, m.arm, m.position, m.ref_token, m.other_token) for m in found] == [
        ("k/0", "C", 1, 2, 9), ("k/1", "oracle", 1, 5, 6)]
    assert oi.failed(found) == found


def test_explain_probes_a_with_the_common_prefix(monkeypatch):
    seen = []

    def probe(url, context, vocab, http=None):
        seen.append((url, context, vocab))
        return _row({2: 8.0, 9: 7.99}) if context[-1] == 1 else _row({5: 8.0, 6: 7.0})

    monkeypatch.setattr(oi, "probe_row", probe)
    outputs = {"k/0": {"A": (1, 2, 3), "C": (1, 9, 3)}, "k/1": {"A": (4, 5), "D": (4, 6)}}
    found = {m.key: m for m in oi.explain(outputs, {"k/0": [70, 71], "k/1": [80]}, "http://a", "bfloat16", 16)}
    assert sorted(seen) == [("http://a", [70, 71, 1], 16), ("http://a", [80, 4], 16)]
    assert found["k/0"].verdict.near_tie and not found["k/1"].verdict.near_tie
    assert oi.failed(list(found.values())) == [found["k/1"]]
    lines = oi.summary_lines(list(found.values()), "bfloat16")
    assert lines[0].startswith("- first differing tokens: 1 / 2 near ties") and "**FAIL**" in lines[0]
    assert "D k/1 @1: 5 vs 6, gap 1" in lines[1]


def test_summary_of_only_near_ties_passes_and_names_the_closest():
    ok = [oi.Mismatch("k/0", "C", 4, 1, 2, oi.Verdict(True, 0.01, 0.03, "near tie")),
          oi.Mismatch("k/1", "D", 2, 1, 2, oi.Verdict(True, 0.02, 0.03, "near tie"))]
    lines = oi.summary_lines(ok, "bfloat16")
    assert "2 / 2 near ties" in lines[0] and "FAIL" not in lines[0]
    assert "closest to the bar: D k/1 @2" in lines[1]
    assert oi.summary_lines([], "bfloat16") == []
    assert "every one fails" in oi.summary_lines(ok[:1], "float32")[0]
