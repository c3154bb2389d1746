"""Worker registration and the admin API (behind `--admin-key`): list/add/remove workers,
inspect/close sessions.

Without an admin key configured the admin API is disabled (403), so an exposed router cannot be
reconfigured by anyone who can reach it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
from typing import Any

import orjson
from aiohttp import web

from k3_sglang.router.capacity import WorkerReport, fetch_models, fetch_worker_report, resolve_capacity
from k3_sglang.router.config import ConfigError, WorkerSpec, normalize_worker_url
from k3_sglang.router.errors import RouterHTTPError
from k3_sglang.router.event_feed import event_status
from k3_sglang.router.fleet import leg_session_id
from k3_sglang.router.health import HealthCounter
from k3_sglang.router.pd import layout_mismatch
from k3_sglang.router.proxy import RouterState

log = logging.getLogger("k3.router.admin")
MAX_ADMIN_BODY = 64 * 1024


async def register_worker(state: RouterState, spec: WorkerSpec) -> dict[str, Any]:
    """Discover a worker's capacities (file values win) and add it to the fleet."""
    await refresh_capacity(state, spec)
    r = state.config.reliability
    state.health.setdefault(spec.url, HealthCounter(r.health_fail_threshold, r.health_success_threshold))
    return describe_worker(state, spec.url)


async def refresh_capacity(state: RouterState, spec: WorkerSpec) -> bool:
    """(Re)read a worker's reported capacities and PD facts and apply them; True when something changed."""
    report = await fetch_worker_report(state.control, spec.url, state.config.reliability.health_timeout_s)
    reported = report.capacity
    known = state.core.fleet.workers.get(spec.url)
    if known is not None and not any(reported.values()):
        return False  # the worker did not answer: keep what we have
    capacity = resolve_capacity(spec, reported, state.config.policy)
    changed = apply_pd_facts(state, spec, report)
    if known is not None and (known.kv_capacity, known.state_slots) == (capacity.kv_tokens, capacity.state_slots):
        return changed
    state.specs[spec.url] = spec
    worker = state.core.add_worker(spec.url, capacity, spec.role)
    if known is None:
        apply_pd_facts(state, spec, report)
    log.info("worker %s (%s): kv_tokens=%d state_slots=%d prefill_tps=%.0f (reported %s)",
             spec.url, worker.role, capacity.kv_tokens, capacity.state_slots, capacity.prefill_tps, reported)
    return True


def apply_pd_facts(state: RouterState, spec: WorkerSpec, report: WorkerReport) -> bool:
    """Record a worker's reported role, bootstrap port and KV layout; refuse a role that contradicts its
    registration, and log every decode/prefill pair whose KV layouts differ. True when something changed."""
    worker = state.core.fleet.workers.get(spec.url)
    if worker is None:
        return False
    refusal = ""
    if report.role is not None and report.role != spec.role:
        flag = {"mixed": "--worker", "prefill": "--prefill", "decode": "--decode"}[report.role]
        mode = "null" if report.role == "mixed" else report.role
        refusal = (f"{spec.url} is registered as {spec.role} but reports disaggregation_mode {mode}: "
                   f"pass it with {flag}")
    port = spec.bootstrap_port or report.bootstrap_port
    layout = report.layout or worker.layout
    if (worker.refusal, worker.bootstrap_port, worker.layout) == (refusal, port, layout):
        return False
    if refusal and refusal != worker.refusal:
        log.error("refusing worker: %s", refusal)
    worker.refusal, worker.bootstrap_port, worker.layout = refusal, port, layout
    for other in state.core.fleet.workers.values():
        if {worker.role, other.role} == {"prefill", "decode"}:
            p, d = (worker, other) if worker.role == "prefill" else (other, worker)
            why = layout_mismatch(p.worker_id, p.layout, d.worker_id, d.layout)
            if why:
                log.error("these PD servers cannot pair: %s", why)
    return True


async def refresh_models(state: RouterState) -> None:
    """Union of `/v1/models` over workers (first card seen per model id wins)."""
    timeout = state.config.reliability.health_timeout_s
    urls = list(state.core.fleet.workers)
    results = await asyncio.gather(*(fetch_models(state.control, url, timeout) for url in urls))
    models: dict[str, dict] = {}
    for cards in results:
        for card in cards:
            models.setdefault(card["id"], card)
    if models or not urls:
        state.models = models


def describe_worker(state: RouterState, worker_id: str) -> dict[str, Any]:
    """JSON view of one worker's state."""
    w = state.core.fleet.workers[worker_id]
    breaker = state.core.breakers[worker_id]
    pd = {"refusal": w.refusal or None, "bootstrap_port": w.bootstrap_port,
          "kv_layout": None if w.layout is None else dataclasses.asdict(w.layout)} if w.role != "mixed" else {}
    return {
        "url": w.worker_id, "role": w.role, **pd, "healthy": w.healthy, "breaker": breaker.state,
        "kv_capacity_tokens": w.kv_capacity, "state_slots": w.state_slots, "prefill_tokens_per_s": w.prefill_tps,
        "resident_tokens": w.resident_tokens, "resident_sessions": w.resident_sessions,
        "active_tokens": w.active_tokens, "inflight_prefill_tokens": w.inflight_prefill_tokens,
        "inflight_requests": w.inflight_requests, "reported_waiting_tokens": w.reported_waiting_tokens,
        "reported_waiting_requests": w.reported_waiting_requests,
        "backpressure_s": round(max(0.0, w.backpressure_until - state.now()), 3),
        "kv_events": event_status(state.core.event_feeds.get(worker_id)),
    }


def _require_admin(state: RouterState, request: web.Request) -> None:
    expected = state.config.admin_key
    if expected is None:
        raise RouterHTTPError(403, "admin API disabled: start the router with --admin-key", "admin_disabled")
    given = request.headers.get("x-admin-key", "")
    auth = request.headers.get("authorization", "")
    if not given and auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise RouterHTTPError(401, "missing or wrong admin key", "invalid_admin_key")


def _known_worker(state: RouterState, url: str) -> str:
    try:
        worker_id = normalize_worker_url(url)
    except ConfigError as exc:
        raise RouterHTTPError(400, str(exc), "invalid_worker_url") from None
    if worker_id not in state.core.fleet.workers:
        raise RouterHTTPError(404, f"unknown worker {worker_id}", "worker_not_found")
    return worker_id


async def _json_object(request: web.Request) -> dict:
    body = await request.content.read(MAX_ADMIN_BODY + 1)
    if len(body) > MAX_ADMIN_BODY:
        raise RouterHTTPError(413, "admin body too large", "body_too_large")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise RouterHTTPError(400, "malformed JSON body", "invalid_json") from None
    if not isinstance(data, dict):
        raise RouterHTTPError(400, "body must be a JSON object", "invalid_request")
    return data


def add_admin_routes(router: web.UrlDispatcher, state: RouterState) -> None:
    """The admin endpoints bound to one router state."""

    async def list_workers(request: web.Request) -> web.Response:
        _require_admin(state, request)
        return web.json_response({"workers": [describe_worker(state, w) for w in state.core.fleet.workers]})

    async def add_worker(request: web.Request) -> web.Response:
        _require_admin(state, request)
        data = await _json_object(request)
        try:
            spec = WorkerSpec(**data)
        except (ConfigError, TypeError) as exc:
            raise RouterHTTPError(400, f"bad worker: {exc}", "invalid_worker") from None
        if spec.url in state.core.fleet.workers:
            raise RouterHTTPError(409, f"worker {spec.url} already registered", "worker_exists")
        if (spec.role != "mixed") != state.config.disaggregated:
            mode = "PD (prefill/decode workers)" if state.config.disaggregated else "mixed workers"
            raise RouterHTTPError(400, f"bad worker: role {spec.role} in a router of {mode}", "invalid_worker")
        described = await register_worker(state, spec)
        await refresh_models(state)
        return web.json_response(described, status=201)

    async def remove_worker(request: web.Request) -> web.Response:
        _require_admin(state, request)
        worker_id = _known_worker(state, request.query.get("url", ""))
        state.core.remove_worker(worker_id)
        state.health.pop(worker_id, None)
        state.specs.pop(worker_id, None)
        return web.json_response({"removed": worker_id})

    async def inspect_session(request: web.Request) -> web.Response:
        _require_admin(state, request)
        session_id = request.match_info["session_id"]
        record = state.core.fleet.session(session_id)
        if record is None:
            raise RouterHTTPError(404, f"unknown session {session_id}", "session_not_found")
        prefill_leg = state.core.fleet.session(leg_session_id(session_id, "prefill"))
        pd = {"prefill_worker": prefill_leg.worker_id if prefill_leg else None} if state.config.disaggregated else {}
        return web.json_response({
            "session_id": record.session_id, "worker": record.worker_id, **pd, "context_tokens": record.context_tokens,
            "resident_tokens": record.resident_tokens, "inflight": record.inflight, "turns": record.turns,
            "moves": record.moves, "idle_s": round(max(0.0, state.now() - record.last_seen), 3),
        })

    async def close_session(request: web.Request) -> web.Response:
        _require_admin(state, request)
        session_id = request.match_info["session_id"]
        if not state.core.close_session(session_id):
            raise RouterHTTPError(404, f"unknown session {session_id}", "session_not_found")
        return web.json_response({"closed": session_id})

    router.add_get("/workers", list_workers)
    router.add_post("/workers", add_worker)
    router.add_delete("/workers", remove_worker)
    router.add_get("/sessions/{session_id}", inspect_session)
    router.add_delete("/sessions/{session_id}", close_session)
