"""`k3 bench pp-prefill`'s report from hand-made runs: the ratios it prints are the medians' ratios, the goals are
judged from them, and the chart is written beside the Markdown."""
from __future__ import annotations

import argparse
import datetime

from k3_sglang.tooling.bench.pp_prefill import CONFIGS, Run, ServerNotes
from k3_sglang.tooling.bench.pp_prefill_report import write_report
from k3_sglang.tooling.bench.pp_stages import PipelineTiming


def _run(config: str, seconds: float, stages: int) -> Run:
    timing = PipelineTiming(tuple([seconds * 0.8] * stages), seconds * 0.95, tuple([0.01] * (stages - 1)), (1024,) * 4)
    spans = [[(0.2 * k + 0.2 * s, 0.2 * k + 0.2 * s + 0.19) for k in range(4)] for s in range(stages)]
    return Run(config, seconds, seconds * stages, 1.0, timing, "", spans)


def test_report_ratios_goals_and_chart(tmp_path):
    configs = list(CONFIGS)
    runs = []
    for seconds in ([20.0, 12.0, 10.0, 10.5, 9.5], [22.0, 11.0, 10.4, 10.2, 9.9], [21.0, 13.0, 10.2, 10.4, 9.7]):
        runs += [_run(c.name, t, c.pp_size) for c, t in zip(configs, seconds)]
    notes = {c.name: ServerNotes() for c in configs}
    notes["pp2-dynamic"] = ServerNotes("[ChunkSizePredictor] Fitted coefficients: a=1e-06", True, [[2048, 1024]])
    out = tmp_path / "bench-pp-prefill.md"
    args = argparse.Namespace(length=16384, chunked_prefill_size=1024, dynamic_base_chunk=2048, repeats=3,
                              dtype="float32", out=out)
    now = datetime.datetime(2026, 12, 3, tzinfo=datetime.timezone.utc)
    write_report(args, now, (1.0, 1.0, 1.0), (2.0, 2.0, 2.0), configs, runs, notes)
    text = out.read_text()
    # medians: pp1-1core 21, pp1-2core 12, pp2 10.2, fixed 10.4, dynamic 9.7
    assert "PP2 vs PP1 on one core: **2.06x** (goal >= 1.8x: met" in text
    assert "PP2 vs PP1 on two cores: **1.18x** (goal > 1x: met)" in text
    assert "dynamic chunking on): 1.07x" in text
    assert "| pp2 | 8.16 / 8.16 |" in text  # median busy per stage
    png = out.with_suffix(".png")
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({png.name})" in text
