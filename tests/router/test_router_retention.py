"""Session retention on the router: bad values refused naming the field, large ones clamped and forwarded, and a
retained session kept in the router's ledger (evicted last, never expired) until its retention ends."""

from __future__ import annotations

import httpx
import pytest

from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.core import Capacity, RouterCore
from k3_sglang.router.policy import RouteRequest


def _chat(fleet, headers=None, **extra):
    body = {"model": "mock-k3", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, **extra}
    return httpx.post(fleet.router.url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=10)


@pytest.mark.parametrize("headers,extra,field", [
    ({"X-Session-Retain-S": "-5"}, {}, "X-Session-Retain-S"),
    ({"X-Session-Retain-S": "later"}, {}, "X-Session-Retain-S"),
    ({}, {"session_retain_s": "x"}, "session_retain_s"),
    ({}, {"session_retain_s": -1}, "session_retain_s"),
    ({}, {"session_retain_s": False}, "session_retain_s"),
])
def test_bad_retention_is_a_400_naming_the_field(make_fleet, headers, extra, field):
    fleet = make_fleet(1)
    response = _chat(fleet, headers, **extra)
    assert response.status_code == 400
    error = response.json()["error"]
    assert field in error["message"] and error["code"] == "invalid_request"
    assert _chat(fleet).status_code == 200  # the router stays up
    assert fleet.states[0].requests == 1


def test_retention_is_clamped_and_forwarded_with_the_session(make_fleet):
    fleet = make_fleet(1, policy=PolicyConfig(max_retain_s=900))
    assert _chat(fleet, {"X-Session-Id": "agent-1"}, session_retain_s=10**9).status_code == 200
    seen = {k.lower(): v for k, v in fleet.states[0].last_headers.items()}
    assert seen["x-session-retain-s"] == "900" and seen["x-session-id"] == "agent-1"
    assert b'"session_retain_s":1000000000' in fleet.states[0].last_body.replace(b" ", b"")  # body untouched
    assert _chat(fleet, {"X-Session-Retain-S": "30"}).status_code == 200
    seen = {k.lower(): v for k, v in fleet.states[0].last_headers.items()}
    assert seen["x-session-retain-s"] == "30" and seen["x-session-id"].startswith("auto-")
    record = fleet.core.fleet.sessions["agent-1"]
    assert record.retain_s == 900 and record.retain_until > 0


def test_retained_session_is_evicted_last_and_never_expires_while_retained():
    core = RouterCore(PolicyConfig(kv_headroom=0.0, session_ttl_s=10.0))
    core.add_worker("w0", Capacity(10_000, 8, 1_000.0))

    def turn(sid, context, now, retain=0.0):
        _, ticket = core.route(RouteRequest(sid, context, 0, retain_s=retain), (), now)
        core.complete(ticket, now, ok=True, output_tokens=0)

    turn("kept", 4_000, 0.0, retain=100.0)
    turn("old", 3_000, 1.0)
    turn("new", 6_000, 2.0)  # needs 3,000 more than is free: "old" goes although "kept" is older
    bound = {sid for sid, r in core.fleet.sessions.items() if r.worker_id == "w0"}
    assert bound == {"kept", "new"}
    assert core.expire_sessions(50.0) == 2 and set(core.fleet.sessions) == {"kept"}  # the others passed their TTL
    assert core.expire_sessions(120.0) == 1 and not core.fleet.sessions  # retention over: expires as usual


def test_make_room_order_against_a_brute_force_model():
    """Random idle sessions, some retained: evicted are the least recently used unretained ones first, then the
    least recently used retained ones, exactly as many as needed."""
    import random

    from k3_sglang.router.fleet import Fleet

    rng = random.Random(3)
    for _ in range(200):
        fleet = Fleet(1e9)
        fleet.add_worker("w", 10_000, 1_000, 1.0)
        order = []
        for i in range(rng.randint(1, 30)):
            sid, tokens = f"s{i}", rng.randint(1, 300)
            record = fleet.bind(sid, "w", tokens, float(i))
            record.retain_until = 50.0 if rng.random() < 0.3 else 0.0
            fleet.workers["w"].idle_sessions[sid] = None
            order.append((sid, tokens, record.retain_until > 10.0))
        used = sum(t for _, t, _ in order)
        need = rng.randint(0, 100)
        capacity = used + need - rng.randint(0, used)  # up to every idle session must go
        evicted = fleet.make_room("w", need, False, capacity, now=10.0)
        gone = [sid for sid, _, _ in order if fleet.sessions[sid].worker_id is None]
        truth, left = [], used
        for sid, tokens, _ in [o for o in order if not o[2]] + [o for o in order if o[2]]:
            if left + need <= capacity:
                break
            truth.append(sid)
            left -= tokens
        assert sorted(gone) == sorted(truth) and evicted == len(truth)
        remaining = list(fleet.workers["w"].idle_sessions)
        assert remaining == [sid for sid, _, _ in order if sid not in truth]  # the rest keep their LRU order
