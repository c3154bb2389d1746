"""Fleet state: workers, sessions, the in-flight ledger and TTL expiry. Pure; callers pass `now`.

Accounting per worker (all in tokens unless named otherwise):
- `resident_tokens` / `resident_sessions`: every session bound to the worker (idle ones included);
- `active_tokens`: KV reserved by requests in flight (their sessions cannot be evicted);
- `inflight_prefill_tokens`: uncached prefill dispatched and not yet answered with a first byte;
- `inflight_requests`: requests dispatched and not yet finished; each runs with one KDA state slot,
  so this is also the count of state slots that cannot be freed;
- `reported_*`: the worker's own `/v1/loads` figures (summed over DP ranks), refreshed by probes.
A `Ticket` is opened per dispatched request and closed exactly once on every path.
A worker has a `role`: `mixed` (prefill and decode on one engine) or, under PD disaggregation,
`prefill` / `decode`; placement filters by it. A PD session has one record per leg (the prefill
leg's id carries `PREFILL_LEG`), so it sticks to its decode server and, independently, to the
prefill server whose radix cache holds its prefix. `refusal` names why a worker must not be used
(it reports another role than it was registered with); such a worker is never eligible.
A session whose turn asked for retention (`retain_s`) is kept bound until `retain_until`: TTL expiry skips it and
`make_room` evicts it only after every idle session without one (its worker keeps its cache, retention.py).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from k3_sglang.router.config import DECODE, MIXED, PREFILL, ROLES  # noqa: F401 - re-exported
from k3_sglang.router.pd import KVLayout

PREFILL_LEG = "#prefill"


def leg_session_id(session_id: str, role: str) -> str:
    """The ledger key of one leg of a session: the session id itself, or the prefill leg's own key."""
    return session_id + PREFILL_LEG if role == PREFILL else session_id


@dataclass(slots=True)
class WorkerState:
    """Live state of one worker as the router knows it."""

    worker_id: str
    bit: int
    kv_capacity: int
    state_slots: int
    prefill_tps: float
    resident_tokens: int = 0
    resident_sessions: int = 0
    active_tokens: int = 0
    inflight_prefill_tokens: int = 0
    inflight_requests: int = 0
    reported_waiting_tokens: int = 0
    reported_waiting_requests: int = 0
    reported_running_requests: int = 0
    backpressure_until: float = 0.0
    healthy: bool = True
    role: str = MIXED
    refusal: str = ""
    bootstrap_port: int | None = None  # prefill: where decode servers fetch this server's KV
    layout: KVLayout | None = None     # what the worker reports (PD peers must agree)
    idle_sessions: OrderedDict = field(default_factory=OrderedDict)

    @property
    def queued_tokens(self) -> int:
        """Prefill work ahead of a new request: the larger of our ledger and the worker's own report."""
        return max(self.inflight_prefill_tokens, self.reported_waiting_tokens)


@dataclass(slots=True)
class SessionRecord:
    """A session and where it lives."""

    session_id: str
    worker_id: str | None = None
    context_tokens: int = 0
    resident_tokens: int = 0
    last_seen: float = 0.0
    inflight: int = 0
    turns: int = 0
    moves: int = 0
    retain_s: float = 0.0      # retention the session's latest turn asked for
    retain_until: float = 0.0  # until then the worker keeps its cache: evicted last, never expired


@dataclass(slots=True)
class Ticket:
    """One dispatched request's share of the ledger; `Fleet.finish` closes it once."""

    session_id: str
    worker_id: str
    prefill_tokens: int
    active_tokens: int
    context_tokens: int
    dispatched_at: float = 0.0
    work_tokens: int = 0  # prefill ahead of it on the worker at dispatch, plus its own
    trial: bool = False   # sent as a half-open breaker trial
    first_byte: bool = False
    closed: bool = False


class Fleet:
    """Workers and sessions, with the bookkeeping every placement and completion goes through."""

    def __init__(self, session_ttl_s: float) -> None:
        self.session_ttl_s = session_ttl_s
        self.workers: dict[str, WorkerState] = {}
        self.sessions: OrderedDict[str, SessionRecord] = OrderedDict()
        self.evictions = 0
        self.expirations = 0

    # ---- workers -------------------------------------------------------------------------
    def add_worker(self, worker_id: str, kv_capacity: int, state_slots: int, prefill_tps: float,
                   role: str = MIXED) -> WorkerState:
        """Add a worker (or update capacities of an existing one) and return its state."""
        existing = self.workers.get(worker_id)
        if existing is not None:
            existing.kv_capacity, existing.state_slots, existing.prefill_tps = kv_capacity, state_slots, prefill_tps
            return existing
        used = {w.bit for w in self.workers.values()}
        bit = next(i for i in range(len(used) + 1) if i not in used)
        state = WorkerState(worker_id, bit, kv_capacity, state_slots, prefill_tps, role=role)
        self.workers[worker_id] = state
        return state

    def remove_worker(self, worker_id: str) -> WorkerState:
        """Remove a worker; its sessions become unbound (their next turn is placed anew)."""
        state = self.workers.pop(worker_id)
        for sid in list(state.idle_sessions):
            record = self.sessions.get(sid)
            if record is not None:
                record.worker_id, record.resident_tokens = None, 0
        for record in self.sessions.values():
            if record.worker_id == worker_id:
                record.worker_id, record.resident_tokens = None, 0
        return state

    # ---- sessions ------------------------------------------------------------------------
    def session(self, session_id: str) -> SessionRecord | None:
        """The session record, or None if unknown or expired."""
        return self.sessions.get(session_id)

    def bind(self, session_id: str, worker_id: str, reserve_tokens: int, now: float) -> SessionRecord:
        """Bind a session to a worker, reserving `reserve_tokens` of resident KV and one state slot."""
        record = self.sessions.get(session_id)
        if record is None:
            record = SessionRecord(session_id)
            self.sessions[session_id] = record
        else:
            self.sessions.move_to_end(session_id)
        if record.worker_id != worker_id:
            if record.worker_id is not None:
                record.moves += 1
            self._unbind(record)
            target = self.workers[worker_id]
            target.resident_sessions += 1
            record.worker_id = worker_id
        target = self.workers[worker_id]
        target.resident_tokens += reserve_tokens - record.resident_tokens
        record.resident_tokens = reserve_tokens
        record.last_seen = now
        target.idle_sessions.pop(session_id, None)
        return record

    def close_session(self, session_id: str) -> SessionRecord | None:
        """Forget a session (admin close); in-flight tickets still close cleanly afterwards."""
        record = self.sessions.pop(session_id, None)
        if record is not None:
            self._unbind(record)
        return record

    def make_room(self, worker_id: str, need_tokens: int, need_slot: bool, capacity_tokens: int,
                  now: float = 0.0) -> int:
        """Evict idle sessions on a worker (least recently used first, sessions retained at `now` last) until
        `need` fits; return count."""
        worker = self.workers[worker_id]
        idle = worker.idle_sessions

        def full() -> bool:
            return (worker.resident_tokens + need_tokens > capacity_tokens
                    or (need_slot and worker.resident_sessions + 1 > worker.state_slots))

        evicted, retained = 0, []
        for spare_retained in (True, False):  # retained sessions go last (their worker keeps their cache)
            while idle and full():
                sid, _ = idle.popitem(last=False)
                record = self.sessions.get(sid)
                if record is None:
                    continue
                if spare_retained and record.retain_until > now:
                    retained.append(sid)
                    continue
                self._unbind(record)
                evicted += 1
            for sid in reversed(retained):  # back at the front, in their order
                idle[sid] = None
                idle.move_to_end(sid, last=False)
            retained = []
        self.evictions += evicted
        return evicted

    def expire(self, now: float) -> list[str]:
        """Drop sessions idle for longer than the TTL; return their ids."""
        expired: list[str] = []
        while self.sessions:
            sid, record = next(iter(self.sessions.items()))
            if record.last_seen + self.session_ttl_s > now:
                break
            if record.inflight or record.retain_until > now:
                record.last_seen = now
                self.sessions.move_to_end(sid)
                continue
            self.sessions.popitem(last=False)
            self._unbind(record)
            expired.append(sid)
        self.expirations += len(expired)
        return expired

    def _unbind(self, record: SessionRecord) -> None:
        worker = self.workers.get(record.worker_id) if record.worker_id else None
        if worker is not None:
            worker.resident_tokens -= record.resident_tokens
            worker.resident_sessions -= 1
            worker.idle_sessions.pop(record.session_id, None)
        record.worker_id, record.resident_tokens = None, 0

    # ---- ledger --------------------------------------------------------------------------
    def open_ticket(self, record: SessionRecord, prefill_tokens: int, active_tokens: int, context_tokens: int,
                    now: float = 0.0) -> Ticket:
        """Credit a dispatch to the session's worker: in-flight prefill, request and active KV."""
        worker = self.workers[record.worker_id]
        work = worker.queued_tokens + prefill_tokens
        worker.inflight_prefill_tokens += prefill_tokens
        worker.inflight_requests += 1
        worker.active_tokens += active_tokens
        record.inflight += 1
        record.turns += 1
        return Ticket(record.session_id, worker.worker_id, prefill_tokens, active_tokens, context_tokens, now, work)

    def first_byte(self, ticket: Ticket) -> bool:
        """The worker answered: its prefill for this request is done (True the first time only)."""
        if ticket.first_byte or ticket.closed:
            return False
        ticket.first_byte = True
        worker = self.workers.get(ticket.worker_id)
        if worker is not None:
            worker.inflight_prefill_tokens -= ticket.prefill_tokens
        return True

    def finish(self, ticket: Ticket, now: float, output_tokens: int | None = None) -> None:
        """Close a ticket (success, error, cancel or stream end). Idempotent."""
        if ticket.closed:
            return
        self.first_byte(ticket)
        ticket.closed = True
        worker = self.workers.get(ticket.worker_id)
        record = self.sessions.get(ticket.session_id)
        if worker is not None:
            worker.inflight_requests -= 1
            worker.active_tokens -= ticket.active_tokens
        if record is None:
            return
        record.inflight -= 1
        record.last_seen = now
        if record.retain_s:
            record.retain_until = max(record.retain_until, now + record.retain_s)
        if output_tokens is not None and record.worker_id == ticket.worker_id:
            record.context_tokens = max(record.context_tokens, ticket.context_tokens + output_tokens)
        self._settle_idle(record)

    def _settle_idle(self, record: SessionRecord) -> None:
        """An idle session's reservation shrinks to its actual context and it becomes evictable."""
        worker = self.workers.get(record.worker_id) if record.worker_id else None
        if worker is None or record.inflight:
            return
        actual = max(record.context_tokens, 0)
        if actual < record.resident_tokens:
            worker.resident_tokens -= record.resident_tokens - actual
            record.resident_tokens = actual
        worker.idle_sessions[record.session_id] = None
        worker.idle_sessions.move_to_end(record.session_id)
