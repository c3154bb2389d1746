"""Stage spans -> bubble, imbalance and exposed hand-off (k3_sglang.parallel.pipeline_trace), on hand-built
timelines whose figures are known, and the span files the stages write."""
from __future__ import annotations

import pytest

from k3_sglang.model.settings import WorkerSettings
from k3_sglang.parallel.pipeline_trace import Span, StageTrace, pipeline_timing, read_spans

MS = 1_000_000


def _spans(start: int, times: list[tuple[int, int]], mode: str = "extend") -> list[Span]:
    return [Span(start, a * MS, b * MS, 64, mode) for a, b in times]


def test_perfect_two_stage_pipeline():
    """4 chunks of 10 ms, hand-off instant: span 50 ms, busy 40 + 40, bubble 1 - 80/100 = (P-1)/(N+P-1) = 20%."""
    spans = {0: _spans(0, [(0, 10), (10, 20), (20, 30), (30, 40)]),
             8: _spans(8, [(10, 20), (20, 30), (30, 40), (40, 50)])}
    t = pipeline_timing(spans, 0, 100 * MS)
    assert t.busy_s == pytest.approx((0.04, 0.04)) and t.span_s == pytest.approx(0.05)
    assert t.bubble == pytest.approx(0.2) and t.exposed_handoff_s == (0.0,) and t.imbalance == pytest.approx(1.0)
    assert t.chunks == (64, 64, 64, 64)


def test_exposed_handoff_counts_only_waits_after_both_sides_are_ready():
    # chunk 1 reaches stage 1 3 ms after stage 0 finished it (stage 1 idle since 20): 3 ms exposed;
    # chunk 2 leaves stage 0 at 30 but stage 1 is busy until 33 and starts at 34: 1 ms exposed.
    spans = {0: _spans(0, [(0, 10), (10, 20), (20, 30)]),
             4: _spans(4, [(11, 20), (23, 33), (34, 44)])}
    t = pipeline_timing(spans, 0, 100 * MS)
    assert t.exposed_handoff_s == pytest.approx((0.001 + 0.003 + 0.001,))


def test_window_filters_and_mismatched_chunk_counts_fail():
    spans = {0: _spans(0, [(0, 10), (200, 210)]) + _spans(0, [(20, 21)], "decode"), 4: _spans(4, [(10, 20)])}
    t = pipeline_timing(spans, 0, 100 * MS)  # the decode and the later prefill are outside what is timed
    assert t.busy_s == pytest.approx((0.01, 0.01))
    with pytest.raises(ValueError, match="different numbers"):
        pipeline_timing(spans, 0, 300 * MS)


def test_stage_files_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_STAGE_TRACE", str(tmp_path / "trace"))
    directory = WorkerSettings.from_env().stage_trace
    StageTrace(directory, 4).record(5, 9, 100, "extend")
    StageTrace(directory, 0).record(1, 4, 100, "extend")
    assert read_spans(directory) == {0: [Span(0, 1, 4, 100, "extend")], 4: [Span(4, 5, 9, 100, "extend")]}
    monkeypatch.setenv("K3_STAGE_TRACE", "")
    assert WorkerSettings.from_env().stage_trace is None
