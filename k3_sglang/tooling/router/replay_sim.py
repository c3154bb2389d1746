"""Trace replay against a simulated fleet. Pure; no HTTP, no threads.

Trace format (Mooncake FAST'25: conversation, tool&agent and synthetic traces alike): one JSON
object per line with `timestamp` (ms, int or float), `input_length`, `output_length` and
`hash_ids` (ids of 512-token prefix blocks: equal ids mean a reusable prefix). An optional
`session_id` is used as an explicit session key, like `X-Session-Id` on the live router.
Without one, our policy finds sessions exactly as the live router does (`RouterCore.identify`,
prefix keys = the ids of the request's full blocks). Session moves are counted against one
labelling shared by every policy (`label_sessions`: the same session index, run once).

Engine model per worker (`SimEngine`):
- one FIFO prefill lane at `prefill_tps`; decode holds the request for `output_length * tpot_s`;
- a request starts only when its KV (input + output) and one KDA state slot fit next to the
  running ones, otherwise it waits (queueing, as the engine would);
- a prefix-block cache (LRU, `kv_tokens / 512` blocks) and a KDA state cache (LRU, `state_slots`
  entries, saved at each request's last full block): a prefix hit is usable only up to the
  deepest block that has both its KV blocks and a saved state, as in a hybrid radix cache;
- TTFT = wait + uncached prefill.
"""

from __future__ import annotations

import heapq
import json
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.core import Capacity, RouterCore
from k3_sglang.router.policy import RouteRequest
from k3_sglang.router.session_index import SessionIndex

BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One line of a Mooncake trace."""

    timestamp_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session_id: str | None = None

    @property
    def full_blocks(self) -> tuple[int, ...]:
        """Ids of the request's full 512-token blocks (the last id may name a partial block)."""
        return self.hash_ids[: self.input_length // BLOCK_TOKENS]

    @property
    def session_keys(self) -> tuple[int, ...]:
        """Prefix keys for the session index: the full blocks, or the lone (partial) block."""
        return self.full_blocks or self.hash_ids[:1]


@dataclass(frozen=True)
class FleetSpec:
    """The simulated fleet: identical workers."""

    workers: int = 4
    kv_tokens: int = 2_097_152
    state_slots: int = 64
    prefill_tps: float = 12_000.0
    tpot_s: float = 0.03


def load_trace(path: str, limit: int | None = None) -> list[TraceRequest]:
    """Read a Mooncake JSONL trace (ValueError with the line number on a bad line)."""
    out: list[TraceRequest] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append(parse_trace_line(json.loads(line)))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a Mooncake trace line ({exc})") from None
            if limit is not None and len(out) >= limit:
                break
    return out


def parse_trace_line(row: dict) -> TraceRequest:
    """One parsed JSONL object as a TraceRequest (KeyError/ValueError/TypeError when malformed)."""
    lengths = int(row["input_length"]), int(row["output_length"])
    if lengths[0] <= 0 or lengths[1] < 0:
        raise ValueError(f"input_length must be > 0 and output_length >= 0, got {lengths}")
    session = row.get("session_id")
    return TraceRequest(float(row["timestamp"]) / 1000.0, *lengths, tuple(int(h) for h in row["hash_ids"]),
                        None if session is None else str(session))


def label_sessions(trace: Iterable[TraceRequest], max_keys: int = 4_000_000) -> list[str]:
    """One session label per request (explicit, else the session index's answer), for counting moves."""
    index, labels, fresh = SessionIndex(max_keys), [], 0
    for req in trace:
        label = req.session_id or index.find(req.session_keys)
        if label is None:
            fresh += 1
            label = f"conv{fresh}"
        index.record(label, req.session_keys, move_tip=req.session_id is None)
        labels.append(label)
    return labels


@dataclass
class SimEngine:
    """One simulated worker: prefill lane, running set, block cache and state cache."""

    spec: FleetSpec
    prefill_free_at: float = 0.0
    running: list = field(default_factory=list)
    running_tokens: int = 0
    blocks: OrderedDict = field(default_factory=OrderedDict)
    states: OrderedDict = field(default_factory=OrderedDict)

    def usable_hit_blocks(self, hash_ids: Sequence[int], full_blocks: int) -> int:
        """Leading blocks that are cached and end at a saved state."""
        usable = 0
        for i in range(full_blocks):
            h = hash_ids[i]
            if h not in self.blocks:
                break
            if h in self.states:
                usable = i + 1
        return usable

    def resume(self, t: float, req: TraceRequest, full: int) -> tuple[int, float, float | None]:
        """(cached tokens, seconds to load them first, when that load may start: None = when the request starts)."""
        return min(req.input_length, self.usable_hit_blocks(req.hash_ids, full) * BLOCK_TOKENS), 0.0, None

    def admit(self, t: float, req: TraceRequest) -> tuple[float, float, int]:
        """Run one request; return (first-token time, finish time, cached tokens)."""
        full = min(len(req.hash_ids), req.input_length // BLOCK_TOKENS)
        cached, load_s, load_from = self.resume(t, req, full)
        need = min(req.input_length + req.output_length, self.spec.kv_tokens)
        start = max(t, self.prefill_free_at)
        while self.running and (self.running_tokens + need > self.spec.kv_tokens
                                or len(self.running) + 1 > self.spec.state_slots):
            end, tokens = heapq.heappop(self.running)
            self.running_tokens -= tokens
            start = max(start, end)
        ready = (start if load_from is None else load_from) + load_s
        first_token = max(start, ready) + (req.input_length - cached) / self.spec.prefill_tps
        self.prefill_free_at = first_token
        finish = first_token + req.output_length * self.spec.tpot_s
        heapq.heappush(self.running, (finish, need))
        self.running_tokens += need
        self._remember(req.hash_ids, full)
        return first_token, finish, cached

    def release(self, now: float) -> None:
        """Drop running requests that have finished by `now`."""
        while self.running and self.running[0][0] <= now:
            _, tokens = heapq.heappop(self.running)
            self.running_tokens -= tokens

    def _remember(self, hash_ids: Sequence[int], full: int) -> None:
        for h in hash_ids[:full]:
            self.blocks.pop(h, None)
            self.blocks[h] = None
        while len(self.blocks) > self.spec.kv_tokens // BLOCK_TOKENS:
            self.blocks.popitem(last=False)
        if full:
            last = hash_ids[full - 1]
            self.states.pop(last, None)
            self.states[last] = None
            while len(self.states) > self.spec.state_slots:
                self.states.popitem(last=False)


class SessionPolicy:
    """Our placement policy (RouterCore, the code the live router runs) as a replay policy."""

    name = "k3_session"

    def __init__(self, spec: FleetSpec, policy: PolicyConfig) -> None:
        self.core = RouterCore(policy)
        capacity = Capacity(spec.kv_tokens, spec.state_slots, spec.prefill_tps)
        self.ids = [f"w{i}" for i in range(spec.workers)]
        for worker_id in self.ids:
            self.core.add_worker(worker_id, capacity)
        self.index = {worker_id: i for i, worker_id in enumerate(self.ids)}
        self._last_expiry = 0.0

    def route(self, req: TraceRequest, now: float):
        """(worker index or None if rejected, ticket)."""
        if now - self._last_expiry > 10.0:
            self.core.expire_sessions(now)
            self._last_expiry = now
        session_id = req.session_id or self.core.identify(req.session_keys)[0]
        decision, ticket = self.core.route(self.request_for(req, session_id), req.full_blocks, now)
        return (self.index[decision.worker_id] if ticket else None), ticket

    def request_for(self, req: TraceRequest, session_id: str) -> RouteRequest:
        """What placement is told about a trace request."""
        return RouteRequest(session_id, req.input_length, req.output_length, req.session_keys, req.session_id is None)

    def first_byte(self, ticket, now: float) -> None:
        """The simulated worker produced its first token."""
        self.core.first_byte(ticket, now)

    def finish(self, ticket, now: float) -> None:
        """The simulated request finished."""
        self.core.complete(ticket, now, ok=True, output_tokens=ticket.active_tokens - ticket.context_tokens)


@dataclass
class ReplayResult:
    """Per-policy outcome of one replay."""

    policy: str
    requests: int = 0
    rejected: int = 0
    input_tokens: int = 0
    cache_hit_tokens: int = 0
    reprefilled_tokens: int = 0
    session_moves: int = 0
    ttfts: list = field(default_factory=list)


def simulate(trace: Sequence[TraceRequest], spec: FleetSpec, policy, labels: Sequence[str] | None = None) -> ReplayResult:
    """Replay `trace` through `policy` on a fresh simulated fleet (`labels`: from `label_sessions`)."""
    labels = label_sessions(trace) if labels is None else labels
    make_engine = getattr(policy, "make_engine", None)  # event-fed policies bring engines that publish events
    engines = [make_engine(i) if make_engine else SimEngine(spec) for i in range(spec.workers)]
    result = ReplayResult(policy.name)
    events: list = []  # (time, seq, kind, ticket)
    seen_blocks: set[int] = set()
    home: dict[str, int] = {}
    seq = 0
    for req, label in zip(trace, labels):
        t = req.timestamp_s
        while events and events[0][0] <= t:
            when, _, kind, ticket = heapq.heappop(events)
            (policy.first_byte if kind == 0 else policy.finish)(ticket, when)
        result.requests += 1
        result.input_tokens += req.input_length
        worker, ticket = policy.route(req, t)
        if worker is None:
            result.rejected += 1
            continue
        previous = home.get(label)
        if previous is not None and previous != worker:
            result.session_moves += 1
        home[label] = worker
        engine = engines[worker]
        engine.release(t)
        first_token, finish, cached = engine.admit(t, req)
        result.cache_hit_tokens += cached
        result.reprefilled_tokens += _reprefilled(req, cached, seen_blocks)
        result.ttfts.append(first_token - t)
        heapq.heappush(events, (first_token, seq, 0, ticket))
        heapq.heappush(events, (finish, seq + 1, 1, ticket))
        seq += 2
    return result


def _reprefilled(req: TraceRequest, cached: int, seen_blocks: set[int]) -> int:
    """Uncached tokens of full blocks the fleet had already computed before (recomputation)."""
    full = min(len(req.hash_ids), req.input_length // BLOCK_TOKENS)
    first_uncached = cached // BLOCK_TOKENS
    again = sum(1 for h in req.hash_ids[first_uncached:full] if h in seen_blocks)
    seen_blocks.update(req.hash_ids[:full])
    return again * BLOCK_TOKENS
