"""RouterCore: fleet + prefix index + breakers + policy, wired together. No I/O; `now` passed in.

The HTTP layer and the trace replay both place requests through `RouterCore.route` and close
them through `RouterCore.complete`, so the replay measures exactly the code that serves.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from k3_sglang.router.breaker import CircuitBreaker
from k3_sglang.router.config import PolicyConfig, ReliabilityConfig
from k3_sglang.router.fleet import Fleet, Ticket, WorkerState
from k3_sglang.router.policy import MOVE, Decision, RouteRequest, decide
from k3_sglang.router.prefix import PrefixIndex

log = logging.getLogger("k3.router")


@dataclass(frozen=True, slots=True)
class Capacity:
    """A worker's capacities as the policy uses them (DCP already applied to kv_tokens)."""

    kv_tokens: int
    state_slots: int
    prefill_tps: float


class RouterCore:
    """Placement state of one router process."""

    def __init__(self, policy: PolicyConfig, reliability: ReliabilityConfig | None = None) -> None:
        self.policy = policy
        self.reliability = reliability or ReliabilityConfig()
        self.fleet = Fleet(policy.session_ttl_s)
        self.prefix = PrefixIndex(policy.prefix_index_entries)
        self.breakers: dict[str, CircuitBreaker] = {}
        self.placements: Counter[str] = Counter()

    # ---- workers -------------------------------------------------------------------------
    def add_worker(self, worker_id: str, capacity: Capacity) -> WorkerState:
        """Register (or update) a worker with its capacities."""
        state = self.fleet.add_worker(worker_id, capacity.kv_tokens, capacity.state_slots, capacity.prefill_tps)
        if worker_id not in self.breakers:
            r = self.reliability
            self.breakers[worker_id] = CircuitBreaker(
                r.breaker_failure_threshold, r.breaker_success_threshold, r.breaker_open_s
            )
        return state

    def remove_worker(self, worker_id: str) -> None:
        """Forget a worker, its prefix blocks and its breaker; its sessions will be re-placed."""
        state = self.fleet.remove_worker(worker_id)
        self.prefix.forget_worker(state.bit)
        self.breakers.pop(worker_id, None)

    def eligible_workers(self, now: float, exclude: Sequence[str] = ()) -> list[WorkerState]:
        """Workers a request may go to now: healthy, breaker allowing, not excluded."""
        return [
            w for w in self.fleet.workers.values()
            if w.healthy and w.worker_id not in exclude and self.breakers[w.worker_id].can_dispatch(now)
        ]

    # ---- requests ------------------------------------------------------------------------
    def route(
        self,
        request: RouteRequest,
        prefix_hashes: Sequence[int],
        now: float,
        exclude: Sequence[str] = (),
    ) -> tuple[Decision, Ticket | None]:
        """Decide where a request goes and, if placed, bind its session and open its ticket."""
        record = self.fleet.session(request.session_id)
        workers = self.eligible_workers(now, exclude)
        mask = 0
        for w in workers:
            mask |= 1 << w.bit
        matched = self.prefix.match(prefix_hashes, mask) if prefix_hashes and mask else {}
        decision = decide(request, record, workers, matched, self.policy)
        self.placements[decision.kind] += 1
        if not decision.placed:
            return decision, None
        return decision, self._admit(decision, request, prefix_hashes, now)

    def _admit(self, decision: Decision, request: RouteRequest, prefix_hashes: Sequence[int], now: float) -> Ticket:
        worker = self.fleet.workers[decision.worker_id]
        record = self.fleet.session(request.session_id)
        is_home = record is not None and record.worker_id == worker.worker_id
        need = request.context_tokens + request.growth_tokens
        own = record.resident_tokens if is_home else 0
        cap = int(worker.kv_capacity * (1.0 - self.policy.kv_headroom))
        if is_home:
            worker.idle_sessions.pop(request.session_id, None)  # never evict the session being placed
        self.fleet.make_room(worker.worker_id, need - own, not is_home, cap)
        if decision.kind == MOVE:
            log.info("session %s moves to %s: %s", request.session_id, worker.worker_id, decision.reason)
        record = self.fleet.bind(request.session_id, worker.worker_id, need, now)
        record.context_tokens = request.context_tokens
        self.prefix.insert(prefix_hashes, worker.bit)
        self.breakers[worker.worker_id].on_dispatch()
        return self.fleet.open_ticket(record, decision.uncached_tokens, need, request.context_tokens)

    def complete(self, ticket: Ticket, now: float, ok: bool, output_tokens: int | None = None,
                 worker_fault: bool = True) -> None:
        """Close a ticket and tell the worker's breaker how it went (`worker_fault=False`: no verdict)."""
        self.fleet.finish(ticket, now, output_tokens)
        breaker = self.breakers.get(ticket.worker_id)
        if breaker is None:
            return
        if ok:
            breaker.record_success()
        elif worker_fault:
            breaker.record_failure(now)
        else:
            breaker.release_trial()

    def expire_sessions(self, now: float) -> int:
        """Expire idle sessions past the TTL."""
        return self.fleet.expire(now)

    @property
    def moves(self) -> int:
        """Session moves decided so far."""
        return self.placements[MOVE]
