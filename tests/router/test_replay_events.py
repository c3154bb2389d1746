"""The event-fed replay arms: the simulated workers' events keep the router's index equal to their caches (host
tier and retention pins included), and on the committed traces event-fed placement is at least as good as text
inference."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.event_feed import SYNCED
from k3_sglang.tooling.router.replay import run_replay
from k3_sglang.tooling.router.replay_events import EventArm, EventSimEngine, event_arms
from k3_sglang.tooling.router.replay_sim import BLOCK_TOKENS, FleetSpec, TraceRequest, load_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "router"


@pytest.mark.parametrize("host_factor,retain_s", [(0.0, 0.0), (1.0, 0.0), (2.0, 50.0)])
def test_sim_worker_events_keep_the_index_equal_to_its_caches(host_factor, retain_s):
    rng = random.Random(int(host_factor * 10 + retain_s))
    spec = FleetSpec(workers=1, kv_tokens=40 * BLOCK_TOKENS, state_slots=6)
    engine = EventSimEngine(spec, arm=EventArm("t", host_factor=host_factor, retain_s=retain_s))
    paths: list[list[int]] = []
    next_id = iter(range(10**6))
    for step in range(400):
        if paths and rng.random() < 0.6:
            base = rng.choice(paths)
            ids = base[: rng.randint(1, len(base))] + [next(next_id) for _ in range(rng.randint(0, 6))]
        else:
            ids = [next(next_id) for _ in range(rng.randint(1, 12))]
        paths.append(ids)
        req = TraceRequest(float(step), len(ids) * BLOCK_TOKENS + rng.randint(0, 100), 10, tuple(ids))
        full = len(ids)
        device, anywhere = engine.resumable_blocks(req.hash_ids, full)
        found = engine.feed.index.match_tokens((*req.hash_ids, -1), full)
        assert (found.device_tokens, found.tokens) == (device, anywhere), step  # unit 1 in a bare engine
        engine.session_next = f"s{rng.randrange(5)}"
        engine.release(float(step))
        engine.admit(float(step), req)
    assert engine.feed.state == SYNCED and engine.feed.counts["resyncs"] == 0
    assert len(engine.blocks) <= 40 and len(engine.states) <= 6


@pytest.mark.parametrize("trace", ["tool-agent-200.jsonl", "shared-prompt-300.jsonl"])
@pytest.mark.parametrize("kv_tokens", [262_144, 2_097_152])
def test_event_fed_cache_hits_at_least_match_text_inference_on_the_committed_traces(trace, kv_tokens):
    """The committed traces, both fleet sizes of docs/router-bench.md: event-fed placement reuses at least as much
    cache as text inference (TTFT p50/p99 are reported there; they differ by placement noise both ways)."""
    arms = event_arms()
    rows, _ = run_replay(load_trace(str(DATA / trace)), FleetSpec(kv_tokens=kv_tokens), PolicyConfig(),
                         names=list(arms), arms=arms)
    text, events, full = rows
    assert text["requests"] == events["requests"] == full["requests"] and events["rejected"] == text["rejected"] == 0
    assert events["cache_hit_share"] >= text["cache_hit_share"]
    assert full["cache_hit_share"] >= text["cache_hit_share"]


def test_replay_command_with_events_writes_its_own_section(tmp_path, capsys):
    import json

    from k3_sglang import cli

    trace = str(DATA / "tool-agent-200.jsonl")
    code = cli.main(["router", "replay", trace, "--events", "--json", "--limit", "300", "--docs-dir", str(tmp_path)])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["k3_text", "k3_events", "k3_events_retain_prefetch"]
    text = (tmp_path / "router-bench.md").read_text()
    assert "<!-- replay:events-tool-agent-200:begin -->" in text and "--events" in text
    assert cli.main(["router", "replay", trace, "--events", "--host-factor", "-1", "--no-write"]) == 2
