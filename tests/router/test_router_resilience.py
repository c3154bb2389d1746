"""Loopback tests of back-pressure, breaker recovery, the backlog gate, capacity refresh and broken
streams: the router in front of mock SGLang workers with injected faults."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time

import httpx
import pytest

from k3_sglang.router.config import PolicyConfig
from k3_sglang.tooling.router.mock_worker import MockState

pytestmark = pytest.mark.timeout(60)
MODEL = "mock-k3"
CHAT = "/v1/chat/completions"


def body(text: str = "hi", **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


def wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_worker_429_is_backpressure_not_failure(make_fleet):
    fleet = make_fleet(2)
    fleet.set_fault(0, mode="overloaded", delay_s=3, count=-1)
    with httpx.Client(base_url=fleet.router.url, timeout=10) as http:
        for i in range(6):  # whatever the placement, every request is served
            r = http.post(CHAT, json=body(f"s{i}"), headers={"X-Session-Id": f"s{i}"})
            assert r.status_code == 200 and r.headers["x-k3-worker"] == fleet.workers[1].url
        fleet.set_fault(1, mode="overloaded", delay_s=2, count=-1)
        fleet.core.fleet.workers[fleet.workers[1].url].backpressure_until = 0.0  # forget w1's quiet window
        r = http.post(CHAT, json=body("all busy"))
        assert r.status_code == 429 and r.json()["error"]["code"] == "worker_backpressure"
        assert 1 <= int(r.headers["retry-after"]) <= 3
        metrics = http.get("/metrics").text
    assert all(b.state == "closed" and b.failures == 0 for b in fleet.core.breakers.values())
    assert fleet.states[0].requests <= 2  # w0 is skipped for its Retry-After after the first 429
    assert 'k3_router_worker_backpressure_total{worker="' + fleet.workers[0].url + '"}' in metrics


def test_burst_after_an_outage_is_not_cut_to_one_request_per_worker(make_fleet, fast_reliability):
    reliability = dataclasses.replace(fast_reliability, breaker_failure_threshold=1, breaker_success_threshold=3,
                                      breaker_open_s=0.3, breaker_half_open_trials=4, health_interval_s=30)
    fleet = make_fleet(3, reliability=reliability)
    for i in range(3):
        fleet.set_fault(i, mode="error", count=-1)
    with httpx.Client(base_url=fleet.router.url, timeout=10) as http:
        assert http.post(CHAT, json=body("down")).status_code == 502
        assert {b.state for b in fleet.core.breakers.values()} == {"open"}
        for i in range(3):
            fleet.set_fault(i, mode="slow", delay_s=0.5, count=-1)
        time.sleep(0.35)
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            statuses = list(pool.map(lambda i: http.post(CHAT, json=body(f"burst {i}")).status_code, range(10)))
    assert statuses == [200] * 10  # 3 half-open workers x 4 trials hold a burst of 10


def test_half_open_worker_without_traffic_closes_on_health_probes(make_fleet, fast_reliability):
    reliability = dataclasses.replace(fast_reliability, breaker_failure_threshold=1, breaker_success_threshold=2,
                                      breaker_open_s=0.2, health_interval_s=0.1)
    fleet = make_fleet(1, reliability=reliability)
    fleet.set_fault(0, mode="error", count=1)
    url = fleet.workers[0].url
    with httpx.Client(base_url=fleet.router.url, timeout=10) as http:
        assert http.post(CHAT, json=body()).status_code == 502
        seen = fleet.states[0].requests
        assert wait_for(lambda: fleet.core.breakers[url].state == "closed", 3.0)
        assert fleet.states[0].requests == seen  # closed by probes alone, no request was sent
        assert http.post(CHAT, json=body()).status_code == 200


def test_engine_backlog_gate_answers_429_with_retry_after(make_fleet):
    fleet = make_fleet(2, policy=PolicyConfig(max_waiting_requests=16))
    httpx.post(fleet.workers[0].url + "/_load", json={"num_waiting_reqs": 40}).raise_for_status()
    assert wait_for(lambda: fleet.core.fleet.workers[fleet.workers[0].url].reported_waiting_requests == 40)
    with httpx.Client(base_url=fleet.router.url, timeout=10) as http:
        for i in range(4):
            assert http.post(CHAT, json=body(f"q{i}")).headers["x-k3-worker"] == fleet.workers[1].url
        httpx.post(fleet.workers[1].url + "/_load", json={"num_waiting_reqs": 16}).raise_for_status()
        assert wait_for(lambda: fleet.core.fleet.workers[fleet.workers[1].url].reported_waiting_requests == 16)
        r = http.post(CHAT, json=body("rejected"))
        assert r.status_code == 429 and r.json()["error"]["code"] == "backlog"
        assert r.headers["retry-after"] == "5" and "waiting requests" in r.json()["error"]["message"]


def test_capacity_is_refreshed_from_the_workers_and_dcp_is_not_counted_twice(make_fleet, fast_reliability):
    reliability = dataclasses.replace(fast_reliability, capacity_refresh_s=0.2)
    fleet = make_fleet(1, reliability=reliability)
    state: MockState = fleet.states[0]
    worker = fleet.core.fleet.workers[fleet.workers[0].url]
    assert (worker.kv_capacity, worker.state_slots) == (65_536, 16)
    state.max_total_num_tokens, state.dcp_size, state.max_running_requests = 524_288, 8, 48
    assert wait_for(lambda: (worker.kv_capacity, worker.state_slots) == (524_288, 48), 5.0)


def test_broken_stream_ends_with_an_error_event_then_done(make_fleet):
    fleet = make_fleet(1)
    fleet.set_fault(0, mode="die_mid_stream", chunks_before_death=2, count=1)
    with httpx.Client(timeout=10) as http:
        with http.stream("POST", fleet.router.url + CHAT, json=body(stream=True)) as r:
            events = [line for line in r.iter_lines() if line.startswith("data:")]
    assert len(events) == 4 and '"code":"upstream_stream_broken"' in events[2] and events[3] == "data: [DONE]"
    fleet.wait_idle()
    assert fleet.core.breakers[fleet.workers[0].url].failures == 1
