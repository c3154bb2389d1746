"""RouterCore: fleet + prefix index + session index + breakers + policy, wired together. No I/O;
`now` passed in.

The HTTP layer and the trace replay both identify sessions through `RouterCore.identify`, place
requests through `RouterCore.route` and close them through `RouterCore.complete`, so the replay
measures exactly the code that serves.

Under PD each request is routed twice, once per role: `route(..., role=DECODE)` places the session
on its decode server (the session's home, found by the session index), `route(..., role=PREFILL)`
on a prefill server, under the prefill leg's own session key so the prefill radix cache keeps its
affinity independently (SMG namespaces its sticky keys per leg the same way). Decode servers run
without a radix cache, so the prefix index is neither consulted nor fed for them.

Workers that publish KV events (`event_feeds`, fed by event_subscriber.py) are placed by what their events
say they can resume (event_placement.py), with the text inference as the fall-back; PD legs use inference only.

A session this process has no record of (its earlier turns went to another router replica, or this one restarted)
gets a derived home (replicas.py): where the events show its checkpoints, else (`session_home: rendezvous`) its
rendezvous-hashing worker; the policy weighs that home as a follow-up turn's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from k3_sglang.router.breaker import CircuitBreaker
from k3_sglang.router.config import PolicyConfig, ReliabilityConfig
from k3_sglang.router.event_feed import WorkerEventFeed
from k3_sglang.router.event_index import WorkerEventIndex
from k3_sglang.router.event_placement import event_views
from k3_sglang.router.fleet import DECODE, MIXED, PREFILL, Fleet, SessionRecord, Ticket, WorkerState, leg_session_id
from k3_sglang.router.policy import MOVE, NEW, UNAVAILABLE, Decision, RouteRequest, decide
from k3_sglang.router.prefill_rate import PrefillRate, informative
from k3_sglang.router.prefix import PrefixIndex
from k3_sglang.router.replicas import RENDEZVOUS, derived_home
from k3_sglang.router.session_index import SessionIndex

log = logging.getLogger("k3.router")


@dataclass(frozen=True, slots=True)
class Capacity:
    """A worker's capacities as the policy uses them (kv_tokens: logical, DCP included)."""

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
        self.sessions = SessionIndex(policy.session_index_keys)
        self.breakers: dict[str, CircuitBreaker] = {}
        self.prefill_rates: dict[str, PrefillRate] = {}
        self.event_feeds: dict[str, WorkerEventFeed] = {}  # workers that publish KV events (event_feed.py)
        self.placements: Counter[str] = Counter()
        self._new_sessions = 0

    # ---- workers -------------------------------------------------------------------------
    def add_worker(self, worker_id: str, capacity: Capacity, role: str = MIXED) -> WorkerState:
        """Register a worker, or update the capacities of a known one (a learned prefill rate is kept)."""
        known = worker_id in self.fleet.workers
        tps = self.fleet.workers[worker_id].prefill_tps if known and worker_id in self.prefill_rates else None
        state = self.fleet.add_worker(worker_id, capacity.kv_tokens, capacity.state_slots,
                                      tps if tps is not None else capacity.prefill_tps, role)
        if not known:
            r = self.reliability
            self.breakers[worker_id] = CircuitBreaker(r.breaker_failure_threshold, r.breaker_success_threshold,
                                                      r.breaker_open_s, r.breaker_half_open_trials)
        return state

    def remove_worker(self, worker_id: str) -> None:
        """Forget a worker, its prefix blocks, breaker and learned rate; its sessions will be re-placed."""
        state = self.fleet.remove_worker(worker_id)
        self.prefix.forget_worker(state.bit)
        self.breakers.pop(worker_id, None)
        self.prefill_rates.pop(worker_id, None)
        self.event_feeds.pop(worker_id, None)

    def event_feed(self, worker_id: str) -> WorkerEventFeed:
        """The KV-event feed of a worker (created empty, state `none`, on first use)."""
        feed = self.event_feeds.get(worker_id)
        if feed is None:
            feed = self.event_feeds[worker_id] = WorkerEventFeed(WorkerEventIndex(self.policy.event_index_blocks))
        return feed

    def eligible_workers(self, now: float, exclude: Sequence[str] = (), role: str = MIXED) -> list[WorkerState]:
        """Workers of `role` a request may go to now: healthy, not refused, not back-pressuring, breaker
        allowing, not excluded."""
        return [
            w for w in self.fleet.workers.values()
            if w.healthy and w.role == role and not w.refusal and w.worker_id not in exclude
            and w.backpressure_until <= now and self.breakers[w.worker_id].can_dispatch(now)
        ]

    def unavailable_reason(self, now: float, exclude: Sequence[str] = (), role: str = MIXED) -> tuple[str, float]:
        """Why no worker of `role` is eligible, and the seconds after which a retry may succeed."""
        of_role = [w for w in self.fleet.workers.values() if w.role == role]
        what = "worker" if role == MIXED else f"{role} worker"
        refused = [w for w in of_role if w.refusal]
        if refused and len(refused) == len(of_role):
            return f"no usable {what}: " + "; ".join(w.refusal for w in refused), float(self.policy.retry_after_s)
        workers = [w for w in of_role if w.worker_id not in exclude and not w.refusal]
        if exclude and not workers:
            return f"all {what}s failed for this request", float(self.policy.retry_after_s)
        healthy = [w for w in workers if w.healthy]
        if not healthy:
            return f"no healthy {what}", float(self.policy.retry_after_s)
        pressured = [w.backpressure_until - now for w in healthy if w.backpressure_until > now]
        if len(pressured) == len(healthy):
            return f"every healthy {what} is back-pressuring (429)", max(1.0, min(pressured))
        states = {self.breakers[w.worker_id].state for w in healthy}
        if states == {"open"}:
            return f"circuit open on every healthy {what}", float(self.policy.retry_after_s)
        return f"{what}s recovering: half-open trial limit reached", 1.0

    def backpressure(self, worker_id: str, until: float) -> None:
        """A worker answered 429: keep new requests off it until `until` (not a breaker failure)."""
        worker = self.fleet.workers.get(worker_id)
        if worker is not None:
            worker.backpressure_until = max(worker.backpressure_until, until)

    # ---- sessions ------------------------------------------------------------------------
    def identify(self, session_keys: Sequence[int]) -> tuple[str, str]:
        """(session id, source) of a keyless request: the live session it continues, or a new one."""
        found = self.sessions.find(session_keys)
        if found is not None and found in self.fleet.sessions:
            return found, "prefix"
        self._new_sessions += 1
        tail = session_keys[-1] & 0xFFFFFFFFFFFF if session_keys else 0
        return f"auto-{tail:012x}-{self._new_sessions:x}", "new"

    def close_session(self, session_id: str) -> bool:
        """Forget a session, both PD legs (admin close); in-flight tickets still close cleanly afterwards."""
        self.sessions.forget(session_id)
        prefill_leg = self.fleet.close_session(leg_session_id(session_id, PREFILL)) is not None
        return self.fleet.close_session(session_id) is not None or prefill_leg

    def expire_sessions(self, now: float) -> int:
        """Expire idle sessions past the TTL; return how many expired."""
        expired = self.fleet.expire(now)
        for session_id in expired:
            self.sessions.forget(session_id)
        return len(expired)

    # ---- requests ------------------------------------------------------------------------
    def route(
        self,
        request: RouteRequest,
        prefix_hashes: Sequence[int],
        now: float,
        exclude: Sequence[str] = (),
        role: str = MIXED,
    ) -> tuple[Decision, Ticket | None]:
        """Decide where a request goes among the workers of `role` and, if placed, bind its session (that
        leg's record) and open its ticket."""
        if role == PREFILL:
            request = dataclasses.replace(request, session_id=leg_session_id(request.session_id, PREFILL))
        record = self.fleet.session(request.session_id)
        workers = self.eligible_workers(now, exclude, role)
        if not workers:
            reason, retry_after = self.unavailable_reason(now, exclude, role)
            self.placements[UNAVAILABLE] += 1
            return Decision(UNAVAILABLE, None, float("inf"), 0, request.context_tokens, reason, retry_after), None
        if role == DECODE:
            prefix_hashes = ()  # no radix cache on a PD decode server: nothing to predict or match
        derived = ""
        if record is None and role == MIXED:
            record, derived = self._derived_record(request, workers)
        mask = 0
        for w in workers:
            mask |= 1 << w.bit
        matched = self.prefix.match(prefix_hashes, mask) if prefix_hashes else {}
        views = event_views(self.event_feeds, workers, request.session_id, request.token_ids,
                            record.worker_id if record is not None else None) if self.event_feeds and role == MIXED else None
        retained = record is not None and record.retain_until > now
        decision = decide(request, record, workers, matched, self.policy, views, retained)
        if derived == RENDEZVOUS and decision.placed:  # a new session after all: its home was only a hash
            decision = dataclasses.replace(decision, kind=NEW, reason=f"{decision.reason} (rendezvous home)")
        self.placements[decision.kind] += 1
        if not decision.placed:
            return decision, None
        return decision, self._admit(decision, request, prefix_hashes, now, record_identity=role != PREFILL)

    def _derived_record(self, request: RouteRequest, workers: Sequence[WorkerState]) -> tuple[SessionRecord | None, str]:
        """A stand-in record (never stored) for a session this replica has no record of, whose home is derived
        (replicas.py): decide() then weighs that home as a follow-up turn's. (None, "") when nothing names one."""
        if not self.event_feeds and self.policy.session_home != RENDEZVOUS:
            return None, ""
        # rendezvous only for an explicit session id: a keyless session's id is this replica's own invention
        session_home = self.policy.session_home if not request.derived else "score"
        home_id, tokens, derived = derived_home(request.session_id, self.event_feeds,
                                                [w.worker_id for w in workers], session_home)
        if home_id is None:
            return None, ""
        return SessionRecord(request.session_id, worker_id=home_id, context_tokens=tokens), derived

    def _admit(self, decision: Decision, request: RouteRequest, prefix_hashes: Sequence[int], now: float,
               record_identity: bool = True) -> Ticket:
        worker = self.fleet.workers[decision.worker_id]
        record = self.fleet.session(request.session_id)
        is_home = record is not None and record.worker_id == worker.worker_id
        need = request.context_tokens + request.growth_tokens
        own = record.resident_tokens if is_home else 0
        cap = int(worker.kv_capacity * (1.0 - self.policy.kv_headroom))
        if is_home:
            worker.idle_sessions.pop(request.session_id, None)  # never evict the session being placed
        self.fleet.make_room(worker.worker_id, need - own, not is_home, cap, now)
        if decision.kind == MOVE:
            log.info("session %s moves to %s: %s", request.session_id, worker.worker_id, decision.reason)
        record = self.fleet.bind(request.session_id, worker.worker_id, need, now)
        record.context_tokens = request.context_tokens
        record.retain_s = request.retain_s
        self.prefix.insert(prefix_hashes, worker.bit)
        if record_identity:
            self.sessions.record(request.session_id, request.session_keys, move_tip=request.derived)
        ticket = self.fleet.open_ticket(record, decision.uncached_tokens, need, request.context_tokens, now)
        ticket.trial = self.breakers[worker.worker_id].on_dispatch()
        return ticket

    def first_byte(self, ticket: Ticket, now: float) -> None:
        """The worker's first byte: release the ticket's prefill and learn the worker's prefill rate."""
        if not self.fleet.first_byte(ticket) or not self.policy.learn_prefill_tps:
            return
        worker = self.fleet.workers.get(ticket.worker_id)
        if worker is None or not informative(ticket.prefill_tokens, ticket.work_tokens):
            return
        rate = self.prefill_rates.get(worker.worker_id)
        if rate is None:
            rate = self.prefill_rates[worker.worker_id] = PrefillRate(worker.prefill_tps)
        worker.prefill_tps = rate.observe(ticket.work_tokens, now - ticket.dispatched_at)

    def complete(self, ticket: Ticket, now: float, ok: bool, output_tokens: int | None = None,
                 worker_fault: bool = True) -> None:
        """Close a ticket and tell the worker's breaker how it went (`worker_fault=False`: no verdict)."""
        if ticket.closed:
            return
        self.fleet.finish(ticket, now, output_tokens)
        breaker = self.breakers.get(ticket.worker_id)
        if breaker is None:
            return
        if ok:
            breaker.record_success(ticket.trial)
        elif worker_fault:
            breaker.record_failure(now, ticket.trial)
        else:
            breaker.release_trial(ticket.trial)

    @property
    def moves(self) -> int:
        """Session moves decided so far."""
        return self.placements[MOVE]
