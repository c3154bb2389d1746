"""Unit tests of the pure placement code: policy, fleet ledger, TTL, prefix index, breaker."""

from __future__ import annotations

import math

import pytest

from k3_sglang.router.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.core import Capacity, RouterCore
from k3_sglang.router.cost_model import kv_barrier_s, kv_capacity_tokens, move_penalty_s, state_slots_from_bytes
from k3_sglang.router.health import HealthCounter
from k3_sglang.router.policy import MOVE, NEW, REJECT, STAY, UNAVAILABLE, RouteRequest
from k3_sglang.router.prefix import PrefixIndex, text_block_hashes, token_block_hashes

CFG = PolicyConfig(kv_headroom=0.0, kv_barrier_s=1.0, move_penalty_s=2.0, move_penalty_factor=1.0,
                   session_ttl_s=100.0, block_tokens=4)


def make_core(n: int = 2, kv: int = 100_000, slots: int = 8, tps: float = 10_000.0, cfg: PolicyConfig = CFG):
    core = RouterCore(cfg)
    for i in range(n):
        core.add_worker(f"w{i}", Capacity(kv, slots, tps))
    return core


def ledger_is_zero(core: RouterCore) -> bool:
    return all(w.inflight_requests == 0 and w.inflight_prefill_tokens == 0 and w.active_tokens == 0
               for w in core.fleet.workers.values())


def resident_sums_match(core: RouterCore) -> bool:
    for w in core.fleet.workers.values():
        records = [r for r in core.fleet.sessions.values() if r.worker_id == w.worker_id]
        if w.resident_sessions != len(records) or w.resident_tokens != sum(r.resident_tokens for r in records):
            return False
    return True


def turn(core, sid, context, now, growth=100, hashes=()):
    decision, ticket = core.route(RouteRequest(sid, context, growth), hashes, now)
    if ticket is not None:
        core.complete(ticket, now, ok=True, output_tokens=growth)
    return decision


def test_cost_model_formulas():
    assert kv_capacity_tokens(131_072, 8) == 1_048_576
    assert state_slots_from_bytes(449_000_000 * 48) == 48
    assert kv_barrier_s(0.5, 2.0) == pytest.approx(2.0)
    assert kv_barrier_s(1.0, 2.0) == math.inf
    assert move_penalty_s(20_000, 10_000, 2.0, 1.0) == pytest.approx(4.0)


def test_new_session_goes_to_lowest_predicted_ttft():
    core = make_core()
    core.fleet.workers["w0"].inflight_prefill_tokens = 50_000  # 5 s of queued prefill
    decision = turn(core, "a", 1_000, now=0)
    assert (decision.kind, decision.worker_id) == (NEW, "w1")


def test_follow_up_turns_stay_and_are_cheaper():
    core = make_core()
    first = turn(core, "a", 10_000, now=0)
    second = turn(core, "a", 10_500, now=1)
    assert second.kind == STAY and second.worker_id == first.worker_id
    assert second.uncached_tokens == 400  # 10,000 prompt + 100 output tokens of turn 1 are cached
    assert core.fleet.session("a").turns == 2


def test_migration_threshold_counts_the_reprefill():
    core = make_core()
    home = turn(core, "a", 20_000, now=0).worker_id
    other = "w1" if home == "w0" else "w0"
    # home queue 3 s: alternative pays 2 s re-prefill + 2 s base + 2 s factor*reprefill -> stay
    core.fleet.workers[home].inflight_prefill_tokens = 30_000
    assert turn(core, "a", 20_100, now=1).kind == STAY
    # home queue 20 s: beyond best + penalty -> move, counted
    core.fleet.workers[home].inflight_prefill_tokens = 200_000
    decision = turn(core, "a", 20_200, now=2)
    assert (decision.kind, decision.worker_id) == (MOVE, other)
    assert core.moves == 1 and core.fleet.session("a").moves == 1
    assert resident_sums_match(core)


def test_a_retained_session_stays_home_past_the_move_threshold_until_its_retention_runs_out():
    core = make_core()
    decision, ticket = core.route(RouteRequest("kept", 20_000, 100, retain_s=30.0), (), 0)
    core.complete(ticket, 0, ok=True, output_tokens=100)
    home = decision.worker_id
    core.fleet.workers[home].inflight_prefill_tokens = 200_000  # 20 s queued: an unretained session would move
    decision = turn(core, "kept", 20_200, now=1)
    assert (decision.kind, decision.worker_id, decision.reason) == (STAY, home, "retained on home")
    moved, ticket = core.route(RouteRequest("kept", 20_300, 100, retain_s=30.0), (), 100)  # retention ran out
    core.complete(ticket, 100, ok=True, output_tokens=100)  # ... and is granted again on the new home
    assert moved.kind == MOVE and moved.worker_id != home and core.fleet.session("kept").retain_until == 130
    core.fleet.workers[moved.worker_id].healthy = False  # a retained session still leaves an unhealthy home
    decision = turn(core, "kept", 20_400, now=101)
    assert decision.kind == MOVE and decision.worker_id == home


def test_unhealthy_home_moves_the_session():
    core = make_core()
    home = turn(core, "a", 5_000, now=0).worker_id
    core.fleet.workers[home].healthy = False
    decision = turn(core, "a", 5_100, now=1)
    assert decision.kind == MOVE and decision.worker_id != home


def test_admission_rejects_at_kv_ceiling():
    core = make_core(n=2, kv=10_000)
    _, t1 = core.route(RouteRequest("a", 8_000, 1_000), (), 0)
    _, t2 = core.route(RouteRequest("b", 8_000, 1_000), (), 0)
    decision, t3 = core.route(RouteRequest("c", 8_000, 1_000), (), 0)
    assert t1 and t2 and t3 is None
    assert decision.kind == REJECT and "kv" in decision.reason
    core.complete(t1, 1, ok=True)
    decision, t4 = core.route(RouteRequest("c", 8_000, 1_000), (), 2)
    assert decision.placed and t4 is not None  # idle session "a" was evicted to make room
    assert core.fleet.evictions == 1 and core.fleet.session("a").worker_id is None
    assert resident_sums_match(core)


def test_admission_rejects_at_state_slot_ceiling():
    core = make_core(n=1, kv=1_000_000, slots=2)
    tickets = [core.route(RouteRequest(s, 100, 10), (), 0)[1] for s in ("a", "b")]
    decision, ticket = core.route(RouteRequest("c", 100, 10), (), 0)
    assert all(tickets) and ticket is None
    assert decision.kind == REJECT and "state" in decision.reason


def test_session_too_big_for_any_worker_is_rejected_not_placed():
    core = make_core(n=2, kv=10_000)
    decision, ticket = core.route(RouteRequest("huge", 20_000, 0), (), 0)
    assert decision.kind == REJECT and ticket is None
    assert core.fleet.session("huge") is None


def test_no_eligible_worker_is_unavailable():
    core = make_core()
    for w in core.fleet.workers.values():
        w.healthy = False
    decision, ticket = core.route(RouteRequest("a", 10, 10), (), 0)
    assert decision.kind == UNAVAILABLE and ticket is None


def test_ledger_consistent_under_success_error_and_cancel():
    core = make_core(n=2, slots=64)
    outcomes = []
    for i in range(30):
        decision, ticket = core.route(RouteRequest(f"s{i % 7}", 1_000 + i, 50), (), i)
        outcomes.append(ticket)
    for i, ticket in enumerate(outcomes):
        if i % 3 == 0:
            core.complete(ticket, 40, ok=True, output_tokens=50)
        elif i % 3 == 1:
            core.complete(ticket, 40, ok=False)  # worker error
        else:
            core.fleet.first_byte(ticket)
            core.complete(ticket, 40, ok=False, worker_fault=False)  # client cancelled mid-stream
        core.complete(ticket, 41, ok=True)  # a second close must change nothing
    assert ledger_is_zero(core)
    assert resident_sums_match(core)


def test_closing_a_session_mid_flight_keeps_ledger_consistent():
    core = make_core()
    _, ticket = core.route(RouteRequest("a", 1_000, 10), (), 0)
    core.fleet.close_session("a")
    core.complete(ticket, 1, ok=True, output_tokens=10)
    assert ledger_is_zero(core) and resident_sums_match(core)
    assert all(w.resident_tokens == 0 for w in core.fleet.workers.values())


def test_ttl_expiry_frees_resident_capacity():
    core = make_core()
    turn(core, "a", 1_000, now=0)
    _, busy = core.route(RouteRequest("b", 1_000, 10), (), 0)
    assert core.expire_sessions(50) == 0
    assert core.expire_sessions(101) == 1  # "a" idle past the TTL; "b" in flight is kept
    assert core.fleet.session("a") is None and core.fleet.session("b") is not None
    core.complete(busy, 102, ok=True)
    assert core.expire_sessions(203) == 1
    assert all(w.resident_tokens == 0 and w.resident_sessions == 0 for w in core.fleet.workers.values())


def test_prefix_awareness_predicted_on_route():
    core = make_core()
    hashes = token_block_hashes(list(range(8_000)), 4)
    first = turn(core, "a", 8_000, now=0, hashes=hashes)
    # a different session sharing the 8,000-token prefix: predicted hit (0.8 s of prefill) where "a" went
    second = core.route(RouteRequest("b", 8_004, 10), token_block_hashes(list(range(8_004)), 4), 1)[0]
    assert second.worker_id == first.worker_id and second.cached_tokens == 8_000


def test_prefix_index_match_and_lru_bound():
    index = PrefixIndex(max_entries=4)
    a = [1, 2, 3]
    index.insert(a, 0)
    index.insert([1, 2, 9], 1)
    assert index.match([1, 2, 3], 0b11) == {0: 3, 1: 2}
    index.insert([7, 8], 1)  # 6 distinct hashes > 4: the two oldest are gone
    assert len(index) == 4 and (index.blocks_of(0), index.blocks_of(1)) == (1, 4)
    assert index.match([1, 2, 3], 0b11) == {}
    index.forget_worker(1)
    assert index.blocks_of(1) == 0


def test_text_hashes_are_chained_and_stable():
    text = "x" * 100 + "y" * 100
    h1 = text_block_hashes(text, 50)
    assert len(h1) == 4 and h1 == text_block_hashes(text, 50)
    assert text_block_hashes("z" + text[1:], 50)[3] != h1[3]  # block 3 depends on block 0


def test_circuit_breaker_opens_and_recovers_through_half_open():
    b = CircuitBreaker(failure_threshold=3, success_threshold=2, open_s=10, half_open_trials=2)
    for _ in range(3):
        assert b.can_dispatch(0)
        b.record_failure(0)
    assert b.state == OPEN and not b.can_dispatch(5)
    assert b.can_dispatch(10) and b.state == HALF_OPEN
    trials = [b.on_dispatch(), b.on_dispatch()]
    assert trials == [True, True] and not b.can_dispatch(10)  # two trials at a time, no more
    b.record_failure(11, trial=True)
    assert b.state == OPEN
    b.release_trial(trials[1])  # the other trial ends without a verdict
    assert b.can_dispatch(21) and b.trials_in_flight == 0
    for _ in range(2):
        b.record_success(trial=b.on_dispatch())
    assert b.state == CLOSED and b.times_opened == 2
    assert not b.on_dispatch()  # closed: nothing is a trial


def test_health_counter_uses_consecutive_thresholds():
    c = HealthCounter(fail_threshold=3, success_threshold=2)
    assert c.observe(False) and c.observe(False)  # two failures: still healthy
    assert not c.observe(False)
    assert not c.observe(True)
    assert c.observe(True)
