"""Pure tests: the backlog gate, back-pressure, breaker recovery, capacity resolution (DCP) and the
learned prefill rate."""

from __future__ import annotations

import random

import pytest

from k3_sglang.router.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from k3_sglang.router.capacity import parse_loads, parse_server_info, resolve_capacity
from k3_sglang.router.config import ConfigError, PolicyConfig, ReliabilityConfig, WorkerSpec
from k3_sglang.router.core import Capacity, RouterCore
from k3_sglang.router.policy import NEW, REJECT, STAY, UNAVAILABLE, RouteRequest
from k3_sglang.router.prefill_rate import PrefillRate

CFG = PolicyConfig(kv_headroom=0.0, max_predicted_ttft_s=10.0, max_waiting_requests=8, block_tokens=4)


def make_core(n: int = 2, cfg: PolicyConfig = CFG, reliability: ReliabilityConfig | None = None) -> RouterCore:
    core = RouterCore(cfg, reliability)
    for i in range(n):
        core.add_worker(f"w{i}", Capacity(1_000_000, 64, 10_000.0))
    return core


def test_engine_reported_backlog_steers_new_sessions_then_rejects():
    core = make_core()
    core.fleet.workers["w0"].reported_waiting_requests = 8
    decision, ticket = core.route(RouteRequest("a", 1_000, 10), (), 0)
    assert (decision.kind, decision.worker_id) == (NEW, "w1")
    core.complete(ticket, 0, ok=True)
    core.fleet.workers["w1"].reported_waiting_requests = 20
    decision, ticket = core.route(RouteRequest("b", 1_000, 10), (), 1)
    assert decision.kind == REJECT and ticket is None and "waiting requests" in decision.reason
    assert decision.retry_after_s == CFG.retry_after_s


def test_predicted_ttft_gate_gives_a_retry_after_of_the_drain_time():
    core = make_core()
    for w in core.fleet.workers.values():
        w.reported_waiting_tokens = 150_000  # 15 s of queued prefill at 10,000 tok/s
    decision, ticket = core.route(RouteRequest("a", 10_000, 10), (), 0)
    assert decision.kind == REJECT and ticket is None
    assert "predicted ttft 16.0s > 10s" in decision.reason and decision.retry_after_s == 6


def test_backlogged_home_moves_the_follow_up():
    core = make_core()
    _, ticket = core.route(RouteRequest("a", 1_000, 10), (), 0)
    core.complete(ticket, 0, ok=True, output_tokens=10)
    home = ticket.worker_id
    assert core.route(RouteRequest("a", 1_100, 10), (), 1)[0].kind == STAY
    core.fleet.workers[home].reported_waiting_tokens = 200_000
    decision, _ = core.route(RouteRequest("a", 1_200, 10), (), 2)
    assert decision.kind == "move" and decision.worker_id != home


def test_backpressured_worker_is_skipped_until_its_window_ends():
    core = make_core()
    core.backpressure("w0", until=5.0)
    assert [w.worker_id for w in core.eligible_workers(1.0)] == ["w1"]
    core.backpressure("w1", until=3.0)
    decision, ticket = core.route(RouteRequest("a", 100, 10), (), 1.0)
    assert decision.kind == UNAVAILABLE and "back-pressuring" in decision.reason and decision.retry_after_s == 2.0
    assert core.breakers["w0"].state == core.breakers["w1"].state == CLOSED  # not a failure
    assert core.route(RouteRequest("a", 100, 10), (), 5.0)[1] is not None


def test_unavailable_reasons_name_what_is_wrong():
    core = make_core(reliability=ReliabilityConfig(breaker_failure_threshold=1, breaker_open_s=10,
                                                   breaker_half_open_trials=1))
    for w in core.breakers.values():
        w.record_failure(0)
    assert core.unavailable_reason(1)[0] == "circuit open on every healthy worker"
    for w in core.breakers.values():
        assert w.can_dispatch(11) and w.on_dispatch()  # cool-down over: one trial each, in flight
    assert core.unavailable_reason(11) == ("workers recovering: half-open trial limit reached", 1.0)
    for w in core.fleet.workers.values():
        w.healthy = False
    assert core.unavailable_reason(12)[0] == "no healthy worker"


def test_breaker_half_open_admits_a_burst_and_probes_close_it():
    b = CircuitBreaker(failure_threshold=1, success_threshold=2, open_s=5, half_open_trials=4)
    b.record_failure(0)
    b.record_probe(True, 1)  # probes during the cool-down do not shorten it
    assert b.state == OPEN
    assert sum(b.can_dispatch(5) and b.on_dispatch() for _ in range(10)) == 4
    for _ in range(4):
        b.release_trial()
    assert b.state == HALF_OPEN
    b.record_probe(True, 6)
    b.record_probe(True, 7)  # no request went there, the probes still close it
    assert b.state == CLOSED


def test_reported_capacity_is_logical_and_file_capacity_is_per_rank():
    cfg = PolicyConfig()
    reported = parse_server_info({"max_total_num_tokens": 1_048_576, "dcp_size": 8, "max_mamba_cache_size": 48})
    assert resolve_capacity(WorkerSpec("http://h:1"), reported, cfg) == Capacity(1_048_576, 48, cfg.default_prefill_tokens_per_s)
    pinned = WorkerSpec("http://h:1", kv_tokens=131_072, dcp_size=8, prefill_tokens_per_s=12_000)
    assert resolve_capacity(pinned, reported, cfg).kv_tokens == 1_048_576  # 131,072 per rank x 8
    assert resolve_capacity(WorkerSpec("http://h:1", kv_tokens=131_072), reported, cfg).kv_tokens == 1_048_576
    assert resolve_capacity(WorkerSpec("http://h:1"), parse_server_info(None), cfg).kv_tokens == cfg.default_kv_tokens
    loads = parse_loads({"loads": [{"num_waiting_reqs": 3, "num_waiting_uncached_tokens": 10, "num_running_reqs": 2},
                                   {"num_waiting_reqs": 4, "num_running_reqs": True}]})
    assert (loads.waiting_requests, loads.waiting_uncached_tokens, loads.running_requests) == (7, 10, 2)


def test_prefill_rate_learns_the_true_speed_within_bounds():
    rng = random.Random(0)
    rate = PrefillRate(prior_tps=8_000.0)
    for _ in range(200):
        tokens = rng.randint(1_000, 60_000)
        rate.observe(tokens, 0.05 + tokens / 3_000.0 * rng.uniform(0.9, 1.1))  # 3,000 tok/s + 50 ms
    assert rate.tps == pytest.approx(3_000.0, rel=0.1)
    same_size = PrefillRate(prior_tps=8_000.0)
    for _ in range(50):
        same_size.observe(2_000, 0.2)
    assert same_size.tps == 8_000.0  # no spread in sizes: no slope, keep the prior
    fast = PrefillRate(prior_tps=1_000.0, max_ratio=4.0)
    for i in range(50):
        fast.observe(1_000 + 1_000 * (i % 5), 1e-4 * (1 + i % 5))
    assert fast.tps == 4_000.0  # clamped to prior x max_ratio


def test_core_learns_prefill_rate_from_first_bytes():
    core = make_core(n=1, cfg=PolicyConfig(block_tokens=4, default_prefill_tokens_per_s=8_000))
    rng, now = random.Random(1), 0.0
    for i in range(40):
        tokens = rng.randint(2_000, 40_000)
        _, ticket = core.route(RouteRequest(f"s{i}", tokens, 10), (), now)
        core.first_byte(ticket, now + tokens / 2_500.0)
        core.complete(ticket, now + tokens / 2_500.0 + 0.1, ok=True)
        now += 100.0
    assert core.fleet.workers["w0"].prefill_tps == pytest.approx(2_500.0, rel=0.15)
    core.add_worker("w0", Capacity(500_000, 32, 8_000.0))  # a capacity refresh keeps the learned rate
    assert core.fleet.workers["w0"].prefill_tps == pytest.approx(2_500.0, rel=0.15)
    assert core.fleet.workers["w0"].kv_capacity == 500_000


@pytest.mark.parametrize(("section", "values", "fragment"), [
    ("policy", {"max_predicted_ttft_s": 0}, "max_predicted_ttft_s must be positive"),
    ("policy", {"max_waiting_requests": -1}, "max_waiting_requests must be >= 0"),
    ("policy", {"backpressure_s": "2"}, "backpressure_s must be positive"),
    ("reliability", {"breaker_half_open_trials": 0}, "breaker_half_open_trials must be a positive number"),
    ("reliability", {"health_path": "v1/loads"}, "health_path must start with '/'"),
])
def test_new_config_keys_reject_bad_values(section, values, fragment):
    cls = PolicyConfig if section == "policy" else ReliabilityConfig
    with pytest.raises(ConfigError, match=None) as info:
        cls(**values)
    assert fragment in str(info.value)
