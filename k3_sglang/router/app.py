"""The router's HTTP surface (aiohttp.web). Thin: parse, authorize, check, hand off to `proxy`.

Client endpoints (behind `--api-key` when set): POST /v1/chat/completions, /v1/completions,
/generate (through a prefill/decode pair under PD, `pd_proxy`); GET /v1/models. Probes: GET /health, /liveness (router alive), /readiness (a worker can
take traffic), /metrics. Admin (behind `--admin-key`): GET/POST/DELETE /workers,
GET/DELETE /sessions/{id}. Every error is an OpenAI-style JSON body.

aiohttp's C HTTP parser and one thin middleware keep the per-request cost of the hop low (the
profile in docs/router-bench.md shows where the rest goes).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging

import aiohttp
import orjson
from aiohttp import web

from k3_sglang.router.admin import add_admin_routes, refresh_capacity, refresh_models, register_worker
from k3_sglang.router.config import RouterConfig
from k3_sglang.router.core import RouterCore
from k3_sglang.router.errors import HTTP_ERROR_CODES, RouterHTTPError, error_response
from k3_sglang.router.event_subscriber import events_loop
from k3_sglang.router.health import health_loop
from k3_sglang.router.fleet import DECODE, PREFILL
from k3_sglang.router.metrics import RouterMetrics
from k3_sglang.router.pd import layout_mismatch
from k3_sglang.router.pd_proxy import forward_pd, pairing_problem, role_problem
from k3_sglang.router.proxy import RouterState, forward
from k3_sglang.router.session_key import BadRequest, request_facts

log = logging.getLogger("k3.router")
PROXIED_PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")
ROUTER_STATE = web.AppKey("k3_router_state", RouterState)


def router_state(app: web.Application) -> RouterState:
    """The RouterState behind an app made by `create_app`."""
    return app[ROUTER_STATE]


def check_key(headers, expected: str | None, header_name: str) -> bool:
    """True if no key is required, or `Authorization: Bearer <key>` / `<header_name>` carries it."""
    if expected is None:
        return True
    given = headers.get(header_name) or ""
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        given = given or auth[7:].strip()
    return hmac.compare_digest(given.encode(), expected.encode())


def is_json_content_type(value: str | None) -> bool:
    """A missing Content-Type is taken as JSON (as SGLang's FastAPI does); else application/json or +json."""
    if value is None:
        return True
    mime = value.split(";", 1)[0].strip().lower()
    return mime == "application/json" or mime.endswith("+json")


def build_sessions(config: RouterConfig) -> tuple[aiohttp.ClientSession, aiohttp.ClientSession]:
    """(data plane, control plane) sessions: pooled keep-alive connections, every timeout bounded."""
    r = config.reliability
    data = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=r.max_connections_per_worker, keepalive_timeout=60),
        timeout=aiohttp.ClientTimeout(total=None, connect=r.pool_timeout_s + r.connect_timeout_s,
                                      sock_connect=r.connect_timeout_s, sock_read=r.read_timeout_s),
        auto_decompress=False, skip_auto_headers=("User-Agent",), trust_env=False)
    control = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=30),
        timeout=aiohttp.ClientTimeout(total=r.health_timeout_s + r.connect_timeout_s, sock_connect=r.connect_timeout_s),
        trust_env=False)
    return data, control


async def maintenance_loop(state: RouterState, stop: asyncio.Event) -> None:
    """Expire idle sessions, refresh worker capacities and the model list, until stopped."""
    interval = min(30.0, max(0.5, state.config.policy.session_ttl_s / 4), state.config.reliability.capacity_refresh_s)
    next_refresh = state.now() + state.config.reliability.capacity_refresh_s
    while not stop.is_set():
        state.core.expire_sessions(state.now())
        if state.now() >= next_refresh:
            next_refresh = state.now() + state.config.reliability.capacity_refresh_s
            specs = [spec for url, spec in state.specs.items() if url in state.core.fleet.workers]
            await asyncio.gather(*(refresh_capacity(state, spec) for spec in specs))
        if not state.models:
            await refresh_models(state)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Every error becomes an OpenAI-style JSON body; the server stays up."""
    try:
        return await handler(request)
    except RouterHTTPError as exc:
        return error_response(exc.status, exc.message, exc.code, exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        message = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason
        return error_response(exc.status, message, HTTP_ERROR_CODES.get(exc.status, "http_error"), headers)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.exception("unexpected router error")
        return error_response(500, f"internal router error ({type(exc).__name__})", "internal_error")


def create_app(config: RouterConfig) -> web.Application:
    """Build the router app for `config`; workers are registered when the app starts."""
    state = RouterState(config, RouterCore(config.policy, config.reliability), RouterMetrics())
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[error_middleware])
    app[ROUTER_STATE] = state

    async def lifespan(_: web.Application):
        state.session, state.control = build_sessions(config)
        await asyncio.gather(*(register_worker(state, spec) for spec in config.workers))
        await refresh_models(state)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(health_loop(state.control, state.core, state.health, config.reliability,
                                                 state.now, stop)),
                 asyncio.create_task(maintenance_loop(state, stop))]
        if config.policy.kv_events and not config.disaggregated:
            tasks.append(asyncio.create_task(events_loop(state, stop)))
        try:
            yield
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await state.session.close()
            await state.control.close()

    app.cleanup_ctx.append(lifespan)
    _add_client_routes(app, state)
    add_admin_routes(app.router, state)
    return app


def _add_client_routes(app: web.Application, state: RouterState) -> None:
    config = state.config

    def require_client_key(request: web.Request) -> None:
        if not check_key(request.headers, config.api_key, "x-api-key"):
            raise RouterHTTPError(401, "missing or wrong API key", "invalid_api_key")

    async def proxied(request: web.Request) -> web.StreamResponse:
        require_client_key(request)
        if not is_json_content_type(request.headers.get("Content-Type")):
            raise RouterHTTPError(415, "Content-Type must be application/json", "unsupported_media_type")
        body = await request.read()
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise RouterHTTPError(400, f"malformed JSON body: {exc}", "invalid_json") from None
        try:
            facts = request_facts(request.path, request.headers, parsed, config.policy)
        except BadRequest as exc:
            raise RouterHTTPError(400, str(exc), "invalid_request") from None
        # no model check: SGLang serves any `model` name (`default`, the served name, `name:adapter` for LoRA)
        # and answers for itself, so a client moving its base URL to the router changes nothing (issue 41)
        try:
            if config.disaggregated:
                response = await forward_pd(state, request, parsed, facts)
            else:
                response = await forward(state, request, body, facts)
        except RouterHTTPError as exc:
            state.metrics.count(state.metrics.requests, request.path, str(exc.status))
            raise
        state.metrics.count(state.metrics.requests, request.path, str(response.status))
        return response

    async def models(request: web.Request) -> web.Response:
        require_client_key(request)
        await refresh_models(state)
        return web.json_response({"object": "list", "data": list(state.models.values())})

    async def health(_: web.Request) -> web.Response:
        healthy = sum(w.healthy for w in state.core.fleet.workers.values())
        return web.json_response({"status": "ok", "workers": len(state.core.fleet.workers), "healthy_workers": healthy})

    async def readiness(_: web.Request) -> web.Response:
        if not config.disaggregated:
            ready = bool(state.core.eligible_workers(state.now()))
            return web.json_response({"ready": ready}, status=200 if ready else 503)
        # PD (as SMG): ready when an eligible prefill server and an eligible decode server can pair
        now = state.now()
        prefills = state.core.eligible_workers(now, role=PREFILL)
        decodes = state.core.eligible_workers(now, role=DECODE)
        pairable = [d for d in decodes if any(not layout_mismatch(p.worker_id, p.layout, d.worker_id, d.layout)
                                              for p in prefills)]
        body = {"ready": bool(pairable), "prefill_workers": len(prefills), "decode_workers": len(decodes),
                "pairable_decode_workers": len(pairable)}
        problem = role_problem(state) or pairing_problem(state)
        if problem:
            body["pairing_problem"] = problem
        return web.json_response(body, status=200 if pairable else 503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=state.metrics.render(state.core),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    for path in PROXIED_PATHS:
        app.router.add_post(path, proxied)
    app.router.add_get("/v1/models", models)
    for path, handler in (("/health", health), ("/liveness", health), ("/readiness", readiness),
                          ("/metrics", metrics)):
        app.router.add_get(path, handler)
