"""Trace replay on the committed synthetic traces: they are reproducible from the generator, the
session index recovers their conversations, and our policy holds its ground against cache-aware."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from k3_sglang.router.config import PolicyConfig
from k3_sglang.tooling.router.replay import run_replay
from k3_sglang.tooling.router.replay_sim import FleetSpec, label_sessions, load_trace, parse_trace_line
from k3_sglang.tooling.router.trace_gen import default_shape, generate, write_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "router"
COMMITTED = {"shared-prompt": ("shared-prompt-300.jsonl", 300), "tool-agent": ("tool-agent-200.jsonl", 200)}


@pytest.mark.parametrize("kind", sorted(COMMITTED))
def test_committed_traces_are_what_the_generator_writes(kind, tmp_path):
    name, sessions = COMMITTED[kind]
    out = tmp_path / name
    write_trace(str(out), generate(kind, default_shape(kind, sessions)))
    assert out.read_bytes() == (DATA / name).read_bytes(), f"regenerate with: k3 router make-trace {kind} " \
        f"--sessions {sessions} --out tests/data/router/{name}"


@pytest.mark.parametrize("kind", sorted(COMMITTED))
def test_session_index_recovers_the_conversations(kind):
    rows = generate(kind, default_shape(kind, COMMITTED[kind][1]), with_sessions=True)
    truth = [row.pop("session_id") for row in rows]
    labels = label_sessions([parse_trace_line(row) for row in rows])
    # purity: each recovered session is (almost) one true conversation, and vice versa
    by_label: dict[str, Counter] = {}
    for label, true in zip(labels, truth):
        by_label.setdefault(label, Counter())[true] += 1
    pure = sum(c.most_common(1)[0][1] for c in by_label.values())
    assert pure / len(rows) > 0.97  # (almost) never two conversations under one label
    # A first request whose own words all sit in its last, partial block ends on a shared full block:
    # by block ids alone it cannot be told apart, so its second turn starts a new label (one split at
    # most). Agent tasks are short, so that is common there; chat (exact message keys) has no such case.
    assert len(set(labels)) <= (1.1 if kind == "shared-prompt" else 2.0) * len(set(truth))
    opening_keys = {row["hash_ids"][0] for row in rows}
    assert len(opening_keys) <= 6  # the old identity (the opening block) would have merged them all


def test_explicit_session_ids_in_a_trace_are_used_as_keys():
    rows = generate("shared-prompt", default_shape("shared-prompt", 20), with_sessions=True)
    trace = [parse_trace_line(row) for row in rows]
    assert label_sessions(trace) == [row["session_id"] for row in rows]


def test_our_policy_beats_cache_aware_on_the_shared_prompt_trace():
    trace = load_trace(str(DATA / COMMITTED["shared-prompt"][0]))
    rows, _ = run_replay(trace, FleetSpec(), PolicyConfig(), names=("k3_session", "cache_aware"))
    ours, smg = rows
    assert ours["requests"] == smg["requests"] == len(trace) and ours["rejected"] == 0
    assert ours["cache_hit_share"] >= smg["cache_hit_share"]
    assert ours["ttft_p50_s"] <= smg["ttft_p50_s"] and ours["ttft_p99_s"] <= smg["ttft_p99_s"]
    assert ours["session_moves"] < smg["session_moves"]


def test_tool_agent_trace_replays_under_every_policy():
    trace = load_trace(str(DATA / COMMITTED["tool-agent"][0]), limit=600)
    rows, samples = run_replay(trace, FleetSpec(), PolicyConfig())
    assert [r["policy"] for r in rows] == ["k3_session", "round_robin", "least_load", "cache_aware"]
    assert all(r["served"] == 600 and len(samples[r["policy"]]) == 600 for r in rows)
    ours = rows[0]
    assert ours["cache_hit_share"] > max(r["cache_hit_share"] for r in rows[1:3])  # beats the cache-blind ones
