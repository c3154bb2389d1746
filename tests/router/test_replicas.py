"""Router replicas agree on a session's worker without sharing memory (replicas.py): a home derived from the KV
events every replica sees, else rendezvous hashing of the session id over the fleet."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from k3_sglang.router.config import ConfigError, PolicyConfig
from k3_sglang.router.core import Capacity, RouterCore
from k3_sglang.router.policy import NEW, STAY, RouteRequest
from k3_sglang.router.replicas import rendezvous_order
from k3_sglang.tooling.router.replay import summarize
from k3_sglang.tooling.router.replay_replicas import simulate_replicas
from k3_sglang.tooling.router.replay_sim import FleetSpec, load_trace
from tests.router.test_event_placement import checkpoint, publish, stored

DATA = Path(__file__).resolve().parents[1] / "data" / "router"
WORKERS = [f"http://127.0.0.1:{30000 + i}" for i in range(4)]


def make_core(session_home: str, n: int = 4) -> RouterCore:
    core = RouterCore(PolicyConfig(session_home=session_home, session_ttl_s=1e6))
    for url in WORKERS[:n]:
        core.add_worker(url, Capacity(1_000_000, 64, 8_000.0))
    return core


def test_rendezvous_order_is_the_same_in_every_process_and_moves_only_a_lost_workers_sessions():
    sessions = [f"agent-{i}" for i in range(200)]
    here = [rendezvous_order(s, WORKERS)[0] for s in sessions]
    code = ("import sys; from k3_sglang.router.replicas import rendezvous_order as r; "
            f"print(','.join(r(s, {WORKERS!r})[0] for s in {sessions!r}))")
    for seed in ("1", "2"):  # str hashes differ per process; ours must not
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()
        assert out.split(",") == here
    assert min(here.count(w) for w in WORKERS) > 25  # spread over the fleet
    without = [rendezvous_order(s, WORKERS[1:])[0] for s in sessions]
    assert all(a == b for a, b in zip(here, without) if a != WORKERS[0])  # only w0's sessions move


def test_rendezvous_replicas_place_every_turn_of_a_session_on_the_same_worker():
    """Two replicas with different in-flight loads (each sees only its own) agree turn after turn, whichever
    replica gets the turn; the first turn of each session is a new placement."""
    rng = random.Random(7)
    replicas = [make_core("rendezvous"), make_core("rendezvous")]
    # replica 1 carries extra in-flight work on one worker that replica 0 knows nothing about
    _, busy = replicas[1].route(RouteRequest("bulk", 6_000, 100), (), 0.0)
    homes: dict[str, str] = {}
    for step in range(160):
        sid = f"s{rng.randrange(40)}"
        replica = replicas[rng.randrange(2)]
        decision, ticket = replica.route(RouteRequest(sid, 1_000 + 10 * step, 64), (), float(step))
        assert ticket is not None
        if sid in homes:
            assert decision.worker_id == homes[sid], (step, sid, decision)
        else:
            assert decision.kind == NEW and decision.worker_id == rendezvous_order(sid, WORKERS)[0]
            homes[sid] = decision.worker_id
        replica.complete(ticket, float(step), ok=True, output_tokens=64)
    assert len(set(homes.values())) == 4
    replicas[1].complete(busy, 200.0, ok=True)


def test_a_second_turn_at_another_replica_finds_the_home_in_the_events():
    """Score placement (the default): replica A places turn 1 by its own view; the worker's events carry the
    session's KDA checkpoint to both replicas; replica B, which never saw the session, keeps it there."""
    a, b = make_core("score"), make_core("score")
    for core in (a, b):
        for url in WORKERS:
            publish(core, url, [])
    a.fleet.workers[WORKERS[0]].inflight_prefill_tokens = 50_000  # A avoids w0, B would not
    first, ticket = a.route(RouteRequest("agent-7", 3_000, 100), (), 0.0)
    a.complete(ticket, 0.0, ok=True, output_tokens=100)
    events = [stored([901, 902, 903], [5, 6, 7], session="agent-7", size=1),
              checkpoint(903, 3_000, session="agent-7")]
    for core in (a, b):
        publish(core, first.worker_id, events)
    second, ticket = b.route(RouteRequest("agent-7", 3_200, 100), (), 1.0)
    assert (second.kind, second.worker_id, second.cached_tokens) == (STAY, first.worker_id, 3_000)
    assert b.fleet.sessions["agent-7"].worker_id == first.worker_id  # adopted: later turns are plain follow-ups


def test_session_home_setting_is_checked():
    with pytest.raises(ConfigError, match="session_home"):
        PolicyConfig(session_home="random")


@pytest.mark.parametrize("trace", ["tool-agent-200.jsonl", "shared-prompt-300.jsonl"])
@pytest.mark.parametrize("kv_tokens", [262_144, 2_097_152])
def test_two_replicas_place_as_well_as_one_on_the_committed_traces(trace, kv_tokens):
    """Requests split round-robin over two replicas (sessions named, rendezvous homes, events to both): the cache
    hit share stays within 0.5 points of one replica's (figures in docs/router-bench.md)."""
    requests = load_trace(str(DATA / trace))
    cfg = PolicyConfig(session_home="rendezvous")
    one, two = (summarize(simulate_replicas(requests, FleetSpec(kv_tokens=kv_tokens), cfg, n, session_ids=True))
                for n in (1, 2))
    assert one["requests"] == two["requests"] and one["rejected"] == two["rejected"] == 0
    assert two["cache_hit_share"] >= one["cache_hit_share"] - 0.005, (one, two)


def test_replay_command_compares_one_replica_with_n(capsys):
    import json

    from k3_sglang import cli

    trace = str(DATA / "tool-agent-200.jsonl")
    assert cli.main(["router", "replay", trace, "--replicas", "2", "--json", "--limit", "200", "--no-write"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["k3_events_x1", "k3_events_x2", "k3_events_x1_ids_rendezvous",
                                           "k3_events_x2_ids_rendezvous"]
    assert all(r["requests"] == 200 for r in rows)
    assert cli.main(["router", "replay", trace, "--replicas", "1", "--no-write"]) == 2
