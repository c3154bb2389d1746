"""The router's HTTP surface (FastAPI/Starlette). Thin: parse, authorize, hand off to `proxy`.

Client endpoints (behind `--api-key` when set): POST /v1/chat/completions, /v1/completions,
/generate; GET /v1/models. Probes: GET /health (router alive), /readiness (a worker can take
traffic), /metrics. Admin (behind `--admin-key`): GET/POST/DELETE /workers, GET/DELETE /sessions/{id}.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging

import aiohttp
import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from k3_sglang.router.admin import admin_routes, refresh_models, register_worker
from k3_sglang.router.config import RouterConfig
from k3_sglang.router.core import RouterCore
from k3_sglang.router.errors import RouterHTTPError, error_response
from k3_sglang.router.health import health_loop
from k3_sglang.router.metrics import RouterMetrics
from k3_sglang.router.proxy import RouterState, forward
from k3_sglang.router.session_key import BadRequest, request_facts

log = logging.getLogger("k3.router")
PROXIED_PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")


def check_key(headers, expected: str | None, header_name: str) -> bool:
    """True if no key is required, or `Authorization: Bearer <key>` / `<header_name>` carries it."""
    if expected is None:
        return True
    given = headers.get(header_name) or ""
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        given = given or auth[7:].strip()
    return hmac.compare_digest(given.encode(), expected.encode())


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or a 413 error once it exceeds `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise RouterHTTPError(413, f"request body exceeds {limit} bytes", "body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RouterHTTPError(413, f"request body exceeds {limit} bytes", "body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def build_client(config: RouterConfig) -> httpx.AsyncClient:
    """Control-plane client (probes, capacity, models, admin), every timeout bounded."""
    r = config.reliability
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=r.connect_timeout_s, read=r.health_timeout_s,
                              write=r.write_timeout_s, pool=r.pool_timeout_s),
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=16, keepalive_expiry=30),
        trust_env=False,
    )


def build_data_session(config: RouterConfig) -> aiohttp.ClientSession:
    """Data-plane session: pooled keep-alive connections per worker, bounded connect/read timeouts."""
    r = config.reliability
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=r.max_connections_per_worker,
                                     keepalive_timeout=60, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, connect=r.pool_timeout_s + r.connect_timeout_s,
                                    sock_connect=r.connect_timeout_s, sock_read=r.read_timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                 skip_auto_headers=("User-Agent",), trust_env=False)


async def maintenance_loop(state: RouterState, stop: asyncio.Event) -> None:
    """Expire idle sessions and refresh the model list until stopped."""
    interval = min(30.0, max(0.5, state.config.policy.session_ttl_s / 4))
    while not stop.is_set():
        state.core.expire_sessions(state.now())
        if not state.models:
            await refresh_models(state)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)


def create_app(config: RouterConfig) -> FastAPI:
    """Build the router app for `config`; workers are registered when the app starts."""
    state = RouterState(config, RouterCore(config.policy, config.reliability), RouterMetrics())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.client = build_client(config)
        state.session = build_data_session(config)
        await asyncio.gather(*(register_worker(state, spec) for spec in config.workers))
        await refresh_models(state)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(health_loop(state.client, state.core.fleet.workers, state.health,
                                                 config.reliability, stop)),
                 asyncio.create_task(maintenance_loop(state, stop))]
        try:
            yield
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await state.client.aclose()
            await state.session.close()

    app = FastAPI(title="k3 router", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.router = state
    _install_error_handlers(app)
    _install_client_routes(app, state)
    app.include_router(admin_routes(state))
    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RouterHTTPError)
    async def _router_error(_: Request, exc: RouterHTTPError) -> Response:
        return error_response(exc.status, exc.message, exc.code, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return error_response(exc.status_code, str(exc.detail), "http_error")

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
        return error_response(400, f"invalid request: {exc.errors()[:3]}", "invalid_request")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unexpected router error")
        return error_response(500, f"internal router error ({type(exc).__name__})", "internal_error")


def _install_client_routes(app: FastAPI, state: RouterState) -> None:
    config = state.config

    def require_client_key(request: Request) -> None:
        if not check_key(request.headers, config.api_key, "x-api-key"):
            raise RouterHTTPError(401, "missing or wrong API key", "invalid_api_key")

    async def proxied(request: Request) -> Response:
        require_client_key(request)
        path = request.url.path
        body = await read_body(request, config.max_body_bytes)
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise RouterHTTPError(400, f"malformed JSON body: {exc}", "invalid_json") from None
        try:
            facts = request_facts(path, request.headers, parsed, config.policy)
        except BadRequest as exc:
            raise RouterHTTPError(400, str(exc), "invalid_request") from None
        if facts.model is not None and state.models and facts.model not in state.models:
            raise RouterHTTPError(404, f"model {facts.model!r} not served; see /v1/models", "model_not_found")
        response = await forward(state, path, body, facts, dict(request.headers))
        state.metrics.requests.labels(path, str(response.status_code)).inc()
        return response

    for path in PROXIED_PATHS:  # plain Starlette routes: no FastAPI dependency solving on the hot path
        app.add_route(path, proxied, methods=["POST"], include_in_schema=False)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        require_client_key(request)
        await refresh_models(state)
        return JSONResponse({"object": "list", "data": list(state.models.values())})

    @app.get("/health")
    @app.get("/liveness")
    async def health() -> Response:
        healthy = sum(w.healthy for w in state.core.fleet.workers.values())
        return JSONResponse({"status": "ok", "workers": len(state.core.fleet.workers), "healthy_workers": healthy})

    @app.get("/readiness")
    async def readiness() -> Response:
        ready = bool(state.core.eligible_workers(state.now()))
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(state.core), media_type="text/plain; version=0.0.4")
