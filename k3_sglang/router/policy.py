"""The placement decision for one request. Pure: reads worker/session state, returns a Decision.

Cost model (docs/router.md has the full derivation):
    cap_w      = kv_capacity_w * (1 - headroom)                  KV tokens we allow ourselves to fill
    need       = context + expected_growth                       KV the session holds after this turn
    feasible_w = active_tokens_w + need <= cap_w                 in-flight work cannot be evicted
                 and inflight_requests_w + 1 <= state_slots_w    one KDA state slot per running request
    cached_w   = context of the session if it lives on w, else matched prefix blocks * block_tokens;
                 where w's KV events answer, their resumable prefix instead (event_placement.py)
    R_w, N_w   = resident tokens / sessions: the ledger's, or where w's events are synced what they say w holds
    ttft_w     = (queued_tokens_w + context - cached_w) / prefill_tps_w
    score_w    = ttft_w + B(k_kv) + B(k_slot),  B(k) = kv_barrier_s * k / (1 - k)
    backlog_w  = ttft_w > max_predicted_ttft_s  or  reported_waiting_requests_w >= max_waiting_requests
A new session goes to argmin score among the feasible workers without a backlog. A follow-up turn
stays home unless home is unhealthy, infeasible or backlogged, or
score_home > score_best + move_penalty_s + move_penalty_factor * cached_home / tps_best;
a retained session's turn (its retention not yet run out) moves only when home is unhealthy, infeasible or
backlogged: its worker holds the cache for it, whatever else fills that worker's pool.
No feasible worker: reject (capacity). Feasible ones but all backlogged: reject (backlog), with a
Retry-After of the time the best one needs to drain below the limit. The HTTP layer answers 429
with Retry-After, or queues.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.cost_model import kv_barrier_s, move_penalty_s, predicted_ttft_s
from k3_sglang.router.event_placement import EventView, cached_tokens, residency
from k3_sglang.router.fleet import SessionRecord, WorkerState

NEW, STAY, MOVE, REJECT, UNAVAILABLE = "new", "stay", "move", "reject", "unavailable"


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What placement needs to know about one request.

    `session_keys` are the request's prefix keys (see session_index); `derived` is True when the
    session was found or named from them (no explicit key), so the request moves the session's tip.
    """

    session_id: str
    context_tokens: int
    growth_tokens: int
    session_keys: tuple[int, ...] = ()
    derived: bool = False
    token_ids: Sequence[int] | None = None  # the prompt's token ids when the request carries them
    retain_s: float = 0.0  # the session asked its worker to keep its cache this long after the turn


@dataclass(frozen=True, slots=True)
class Candidate:
    """One worker's predicted cost for this request (feasible or with the ceiling it hits)."""

    worker: WorkerState
    feasible: bool
    blocked_by: str
    cached_tokens: int
    uncached_tokens: int
    ttft_s: float
    score_s: float


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes (`worker_id`), or why it does not (`kind` reject/unavailable)."""

    kind: str
    worker_id: str | None
    ttft_s: float
    cached_tokens: int
    uncached_tokens: int
    reason: str
    retry_after_s: float = 0.0

    @property
    def placed(self) -> bool:
        """True when the request has a worker."""
        return self.worker_id is not None


def evaluate(
    worker: WorkerState,
    request: RouteRequest,
    record: SessionRecord | None,
    matched_blocks: int,
    cfg: PolicyConfig,
    view: EventView | None = None,
) -> Candidate:
    """Predict TTFT and score of `request` on `worker` and check both capacity ceilings (`view`: what the
    worker's KV events say it can resume, see event_placement)."""
    is_home = record is not None and record.worker_id == worker.worker_id
    need = request.context_tokens + request.growth_tokens
    cap = worker.kv_capacity * (1.0 - cfg.kv_headroom)
    blocked = ""
    if worker.active_tokens + need > cap:
        blocked = "kv"
    elif worker.inflight_requests + 1 > worker.state_slots:
        blocked = "state"
    if is_home:
        cached = min(request.context_tokens, record.context_tokens)
    else:
        cached = min(request.context_tokens, matched_blocks * cfg.block_tokens)
    cached = cached_tokens(view, cached, request.context_tokens)
    uncached = request.context_tokens - cached
    ttft = predicted_ttft_s(worker.queued_tokens, uncached, worker.prefill_tps)
    resident_tokens, resident_sessions, own_tokens = residency(view, worker, record.resident_tokens if is_home else 0)
    k_kv = min(resident_tokens - own_tokens + need, cap) / worker.kv_capacity
    slots_cap = worker.state_slots * (1.0 - cfg.kv_headroom)
    k_slot = min(resident_sessions + (0 if is_home else 1), slots_cap) / worker.state_slots
    score = ttft + kv_barrier_s(k_kv, cfg.kv_barrier_s) + kv_barrier_s(k_slot, cfg.kv_barrier_s)
    return Candidate(worker, not blocked, blocked, cached, uncached, ttft, score)


def decide(
    request: RouteRequest,
    record: SessionRecord | None,
    workers: Iterable[WorkerState],
    matched_blocks: Mapping[int, int],
    cfg: PolicyConfig,
    views: Mapping[int, EventView] | None = None,
    retained: bool = False,
) -> Decision:
    """Place a request: lowest score for new sessions, stickiness with a move penalty for follow-ups, and home for
    a follow-up of a session whose retention is running (`retained`) while home can take it.

    `workers` are the eligible ones (healthy, breaker closed, not excluded by a retry);
    `matched_blocks` maps worker bit -> leading prefix blocks that worker is predicted to hold; `views` maps
    worker bit -> what its KV events say it can resume (workers without one: inference only).
    """
    views = views or {}
    candidates = [evaluate(w, request, record, matched_blocks.get(w.bit, 0), cfg, views.get(w.bit))
                  for w in workers]
    if not candidates:
        return Decision(UNAVAILABLE, None, math.inf, 0, request.context_tokens, "no healthy worker")
    feasible = [c for c in candidates if c.feasible]
    if not feasible:
        ceilings = sorted({c.blocked_by for c in candidates})
        return Decision(REJECT, None, math.inf, 0, request.context_tokens, "capacity: " + "+".join(ceilings))
    admissible = [c for c in feasible if not backlogged(c, cfg)]
    if not admissible:
        return _backlog_rejection(feasible, cfg)
    best = min(admissible, key=lambda c: c.score_s)
    home_id = record.worker_id if record is not None else None
    if home_id is None:
        return _placed(NEW, best, "lowest predicted ttft")
    home = next((c for c in admissible if c.worker.worker_id == home_id), None)
    if home is None:
        return _placed(MOVE, best, "home worker unhealthy, full or backlogged")
    if home is best:
        return _placed(STAY, home, "home is best")
    if retained:
        return _placed(STAY, home, "retained on home")
    penalty = move_penalty_s(home.cached_tokens, best.worker.prefill_tps, cfg.move_penalty_s, cfg.move_penalty_factor)
    if home.score_s > best.score_s + penalty:
        return _placed(MOVE, best, f"home score {home.score_s:.2f}s > best {best.score_s:.2f}s + penalty {penalty:.2f}s")
    return _placed(STAY, home, "within move penalty")


def backlogged(c: Candidate, cfg: PolicyConfig) -> bool:
    """Whether a worker's queue is past the admission gate (predicted TTFT or engine-reported waiting)."""
    waiting_gate = cfg.max_waiting_requests and c.worker.reported_waiting_requests >= cfg.max_waiting_requests
    return c.ttft_s > cfg.max_predicted_ttft_s or bool(waiting_gate)


def _backlog_rejection(feasible: list[Candidate], cfg: PolicyConfig) -> Decision:
    best = min(feasible, key=lambda c: c.ttft_s)
    drain_s = best.ttft_s - cfg.max_predicted_ttft_s
    retry_after = min(60.0, max(1.0, math.ceil(drain_s))) if drain_s > 0 else float(cfg.retry_after_s)
    reason = (f"backlog: predicted ttft {best.ttft_s:.1f}s > {cfg.max_predicted_ttft_s:.0f}s" if drain_s > 0
              else f"backlog: worker reports {best.worker.reported_waiting_requests} waiting requests")
    return Decision(REJECT, None, best.ttft_s, 0, best.uncached_tokens, reason, retry_after)


def _placed(kind: str, c: Candidate, reason: str) -> Decision:
    return Decision(kind, c.worker.worker_id, c.ttft_s, c.cached_tokens, c.uncached_tokens, reason)
