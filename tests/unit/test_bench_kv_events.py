"""The pure parts of `k3 bench kv-events`: the workload is the same in every arm, and the summary and table."""

from __future__ import annotations

import argparse

from k3_sglang.tooling.bench import kv_events


def _args(**kw):
    parser = argparse.ArgumentParser()
    kv_events.add_arguments(parser)
    return parser.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in kw.items()])


def test_workload_is_seeded_and_scaled_to_the_pool():
    args = _args(pool_tokens=2000, sessions=3, turns=2, burst=4)
    first, again = kv_events._workload(args), kv_events._workload(args)
    assert first == again
    openings, rounds, bursts = first
    assert [len(o) for o in openings] == [250, 250, 250] and openings[0][:200] == openings[2][:200]
    assert [len(r) for r in rounds[0]] == [40] * 3 and [len(b) for b in bursts[1]] == [500] * 4


def test_summary_and_table():
    turns = [{"turn": 0, "cached": 0, "prompt": 100, "ttft": 2.0}, {"turn": 1, "cached": 90, "prompt": 120, "ttft": 0.5},
             {"turn": 1, "cached": 0, "prompt": 120, "ttft": 3.0}]
    s = kv_events.summarize(turns)
    assert s["cache_hit_share"] == 90 / 340 and s["resumed_hit_share"] == 90 / 240
    assert (s["resumed_ttft_p50_s"], s["resumed_ttft_p99_s"], s["ttft_p99_s"]) == (0.5, 3.0, 3.0)
    better = dict(s, resumed_ttft_p99_s=1.5)
    table = kv_events.report_table({kv_events.ARMS[0]: s, kv_events.ARMS[2]: better})
    assert "| 1.00x |" in table and "| 0.50x |" in table
