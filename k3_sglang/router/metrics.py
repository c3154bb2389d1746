"""Prometheus metrics of one router (own registry, so several routers can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from k3_sglang.router.breaker import STATE_CODES
from k3_sglang.router.core import RouterCore

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120, 600)
_WORKER_GAUGES = (
    ("kv_capacity_tokens", "KV token capacity (logical, DCP included)"),
    ("state_slots", "KDA state slots"),
    ("prefill_tokens_per_second", "Prefill throughput the policy uses (configured or learned from TTFT)"),
    ("resident_tokens", "KV tokens of sessions bound to the worker"),
    ("resident_sessions", "Sessions bound to the worker"),
    ("active_tokens", "KV tokens reserved by in-flight requests"),
    ("inflight_prefill_tokens", "Uncached prefill tokens dispatched, no first byte yet"),
    ("inflight_requests", "Requests in flight"),
    ("reported_waiting_requests", "Waiting requests the worker reports (/v1/loads)"),
    ("reported_waiting_tokens", "Waiting uncached tokens the worker reports (/v1/loads)"),
    ("healthy", "1 when health probes pass"),
    ("breaker_state", "0 closed, 1 half-open, 2 open"),
)

_ROLE_GAUGES = (
    ("workers", "Registered workers"),
    ("healthy_workers", "Workers passing health probes and not refused"),
    ("kv_capacity_tokens", "KV token capacity of the usable workers"),
    ("state_slots", "KDA state slots (running-request ceiling) of the usable workers"),
    ("active_tokens", "KV tokens reserved by in-flight requests"),
    ("inflight_requests", "Requests in flight"),
    ("inflight_prefill_tokens", "Uncached prefill tokens dispatched, no first byte yet"),
    ("resident_sessions", "Sessions bound (a PD session has one per leg)"),
)


class RouterMetrics:
    """Counters updated on the request path, gauges filled from RouterCore at scrape time."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("k3_router_requests", "Client requests by route and status", ["route", "status"], registry=r)
        self.placements = Counter("k3_router_placements", "Placement decisions by kind", ["kind"], registry=r)
        self.session_moves = Counter("k3_router_session_moves", "Sessions moved to another worker", registry=r)
        self.sessions_found = Counter("k3_router_session_identity", "Session identity by source "
                                      "(x-session-id, x-smg-routing-key, user, prefix, new)", ["source"], registry=r)
        self.rejections = Counter("k3_router_rejections", "Requests refused by admission", ["reason"], registry=r)
        self.retries = Counter("k3_router_retries", "Upstream attempts retried before the first byte", registry=r)
        self.upstream_errors = Counter("k3_router_upstream_errors", "Upstream failures", ["worker", "kind"], registry=r)
        self.backpressure = Counter("k3_router_worker_backpressure", "429 answers from a worker", ["worker"], registry=r)
        self.decision_seconds = Histogram("k3_router_decision_seconds", "Placement decision time",
                                          buckets=_LATENCY_BUCKETS, registry=r)
        self.first_byte_seconds = Histogram("k3_router_first_byte_seconds", "Time to first upstream byte",
                                            buckets=_LATENCY_BUCKETS, registry=r)
        self.predicted_ttft_seconds = Histogram("k3_router_predicted_ttft_seconds", "Policy-predicted TTFT",
                                                buckets=_LATENCY_BUCKETS, registry=r)
        self.worker_gauges = {name: Gauge(f"k3_router_worker_{name}", doc, ["worker"], registry=r)
                              for name, doc in _WORKER_GAUGES}
        self.sessions = Gauge("k3_router_sessions", "Live sessions", registry=r)
        # PD disaggregation: both roles side by side
        self.pd_pairs = Counter("k3_router_pd_pairs", "Requests sent to a (prefill, decode) pair",
                                ["prefill", "decode"], registry=r)
        self.pd_leg_failures = Counter("k3_router_pd_leg_failures", "PD attempts that failed on one leg before "
                                       "the first byte (then retried or answered 502)", ["role"], registry=r)
        self.pd_repairs = Counter("k3_router_pd_repairs", "Requests re-paired on another decode server after "
                                  "their decode leg failed", registry=r)
        self.worker_role = Gauge("k3_router_worker_role", "1 for the role each worker serves (mixed, prefill, "
                                 "decode); 0 with refused=1 when it reports another role", ["worker", "role"],
                                 registry=r)
        self.role_gauges = {name: Gauge(f"k3_router_role_{name}", f"{doc}, summed over the workers of a role",
                                        ["role"], registry=r) for name, doc in _ROLE_GAUGES}
        self.event_state = Gauge("k3_router_worker_kv_events_state", "1 for the state of a worker's KV-event feed "
                                 "(none, synced, partial)", ["worker", "state"], registry=r)
        self.event_counts = Gauge("k3_router_worker_kv_events", "Counters of a worker's KV-event feed (batches, "
                                  "events, gaps, replays, resyncs, malformed, restarts, ...)", ["worker", "counter"],
                                  registry=r)
        self.prefetches = Counter("k3_router_prefetches", "Prefetch requests sent ahead of a turn whose prefix is "
                                  "in the host/L3 tier", ["worker"], registry=r)
        self._children: dict[tuple, object] = {}

    def count(self, counter: Counter, *labels: str) -> None:
        """Increment a labelled counter (label children cached: this runs on every request)."""
        key = (id(counter), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = counter.labels(*labels)
        child.inc()

    def render(self, core: RouterCore) -> bytes:
        """Refresh gauges from the core and return the exposition text."""
        for gauge in self.worker_gauges.values():
            gauge.clear()
        for w in core.fleet.workers.values():
            values = {
                "kv_capacity_tokens": w.kv_capacity, "state_slots": w.state_slots,
                "prefill_tokens_per_second": w.prefill_tps,
                "resident_tokens": w.resident_tokens, "resident_sessions": w.resident_sessions,
                "active_tokens": w.active_tokens, "inflight_prefill_tokens": w.inflight_prefill_tokens,
                "inflight_requests": w.inflight_requests, "reported_waiting_requests": w.reported_waiting_requests,
                "reported_waiting_tokens": w.reported_waiting_tokens, "healthy": int(w.healthy),
                "breaker_state": STATE_CODES[core.breakers[w.worker_id].state],
            }
            for name, value in values.items():
                self.worker_gauges[name].labels(w.worker_id).set(value)
        self.sessions.set(len(core.fleet.sessions))
        self._render_roles(core)
        self._render_events(core)
        return generate_latest(self.registry)

    def _render_roles(self, core: RouterCore) -> None:
        self.worker_role.clear()
        for gauge in self.role_gauges.values():
            gauge.clear()
        totals: dict[str, dict[str, float]] = {}
        for w in core.fleet.workers.values():
            self.worker_role.labels(w.worker_id, w.role).set(0 if w.refusal else 1)
            row = totals.setdefault(w.role, dict.fromkeys((name for name, _ in _ROLE_GAUGES), 0.0))
            usable = w.healthy and not w.refusal
            row["workers"] += 1
            row["healthy_workers"] += usable
            row["kv_capacity_tokens"] += w.kv_capacity if usable else 0
            row["state_slots"] += w.state_slots if usable else 0
            row["active_tokens"] += w.active_tokens
            row["inflight_requests"] += w.inflight_requests
            row["inflight_prefill_tokens"] += w.inflight_prefill_tokens
            row["resident_sessions"] += w.resident_sessions
        for role, row in totals.items():
            for name, value in row.items():
                self.role_gauges[name].labels(role).set(value)

    def _render_events(self, core: RouterCore) -> None:
        self.event_state.clear()
        self.event_counts.clear()
        for worker_id, feed in core.event_feeds.items():
            self.event_state.labels(worker_id, feed.state).set(1)
            for name, value in feed.counts.items():
                self.event_counts.labels(worker_id, name).set(value)
