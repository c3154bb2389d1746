"""Forwarding one client request to a worker: identity, placement, admission wait, retries, relay.

Rules:
- the body goes to the worker byte for byte (never parsed and re-serialised);
- a retry (connection error, timeout, 5xx, or 429 from the worker) happens only while nothing has
  been sent to the client; for a stream, the router waits for the worker's first chunk before it
  commits its own response, so a worker that dies before answering is retried elsewhere;
- a worker's 429 is back-pressure, not failure: no breaker verdict, the worker is skipped for its
  `Retry-After` (else `backpressure_s`), and when every worker pushes back the client gets 429;
- once bytes have gone out, a broken upstream ends the stream with an SSE error event and `[DONE]`
  (never a second answer);
- every ticket is closed on every path (success, worker error, client gone, stream end).
The data plane is one pooled keep-alive aiohttp session; probes and admin calls use another.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field

import aiohttp
import orjson
from aiohttp import web

from k3_sglang.router.config import RouterConfig, WorkerSpec
from k3_sglang.router.core import RouterCore
from k3_sglang.router.errors import RouterHTTPError, sse_error_event
from k3_sglang.router.fleet import MIXED, Ticket
from k3_sglang.router.metrics import RouterMetrics
from k3_sglang.router.policy import MOVE, UNAVAILABLE, Decision, RouteRequest
from k3_sglang.router.prefetch import plan_prefetch, send_prefetch
from k3_sglang.router.retention import RETAIN_HEADER
from k3_sglang.router.session_key import RequestFacts

FORWARDED_HEADERS = ("Content-Type", "Accept", "X-Request-Id")
SESSION_HEADER = "X-Session-Id"
RETRYABLE_STATUS = frozenset({500, 502, 503, 504})
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
CLIENT_GONE = (ConnectionError, OSError, RuntimeError)


@dataclass
class RouterState:
    """Everything a request handler needs; one per router app."""

    config: RouterConfig
    core: RouterCore
    metrics: RouterMetrics
    session: aiohttp.ClientSession | None = None
    control: aiohttp.ClientSession | None = None
    specs: dict[str, WorkerSpec] = field(default_factory=dict)
    models: dict[str, dict] = field(default_factory=dict)
    health: dict = field(default_factory=dict)
    waiting: int = 0
    capacity_freed: asyncio.Event = field(default_factory=asyncio.Event)
    rng: random.Random = field(default_factory=random.SystemRandom)  # PD bootstrap rooms
    background: set = field(default_factory=set)  # PD prefill legs still running after the answer
    subscriptions: dict = field(default_factory=dict)  # worker -> its KV-event subscription (event_subscriber)

    def now(self) -> float:
        """Monotonic clock used for sessions, breakers and the ledger."""
        return time.monotonic()

    def complete(self, ticket: Ticket, ok: bool, output_tokens: int | None = None, worker_fault: bool = True) -> None:
        """Close a ticket and wake requests waiting for capacity."""
        self.core.complete(ticket, self.now(), ok, output_tokens, worker_fault)
        self.capacity_freed.set()
        self.capacity_freed = asyncio.Event()


@dataclass(frozen=True, slots=True)
class AttemptFailed:
    """Why one try on one worker failed before anything reached the client."""

    detail: str
    backpressure_s: float | None = None  # set when the worker answered 429


def _retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


async def place(state: RouterState, request: RouteRequest, prefix_hashes: tuple[int, ...],
                exclude: list[str], role: str = MIXED) -> tuple[Decision, Ticket]:
    """Route a request to a worker of `role`, waiting in the bounded admission queue if configured;
    raise 429/503 otherwise."""
    policy = state.config.policy
    deadline = state.now() + policy.queue_timeout_s
    metrics = state.metrics
    while True:
        started = time.perf_counter()
        decision, ticket = state.core.route(request, prefix_hashes, state.now(), exclude, role)
        metrics.decision_seconds.observe(time.perf_counter() - started)
        metrics.count(metrics.placements, decision.kind)
        if ticket is not None:
            if decision.kind == MOVE:
                metrics.session_moves.inc()
            metrics.predicted_ttft_seconds.observe(decision.ttft_s)
            return decision, ticket
        if decision.kind == UNAVAILABLE:
            if decision.reason.startswith("every healthy") and "back-pressuring" in decision.reason:
                raise RouterHTTPError(429, decision.reason, "worker_backpressure", _retry_after(decision.retry_after_s))
            code = "workers_recovering" if "recovering: half-open" in decision.reason else "no_healthy_worker"
            raise RouterHTTPError(503, decision.reason, code, _retry_after(decision.retry_after_s))
        remaining = deadline - state.now()
        if policy.admission == "queue" and remaining > 0 and state.waiting < policy.queue_max:
            await _wait_for_capacity(state, remaining)
            continue
        metrics.count(metrics.rejections, decision.reason.split(":")[0])
        code = "backlog" if decision.reason.startswith("backlog") else "capacity_exceeded"
        raise RouterHTTPError(429, f"no worker can take this session now ({decision.reason}); retry later", code,
                              _retry_after(decision.retry_after_s or policy.retry_after_s))


async def _wait_for_capacity(state: RouterState, timeout_s: float) -> None:
    state.waiting += 1
    try:
        await asyncio.wait_for(state.capacity_freed.wait(), timeout=min(timeout_s, 1.0))
    except asyncio.TimeoutError:
        pass
    finally:
        state.waiting -= 1


def upstream_headers(state: RouterState, headers) -> dict[str, str]:
    """Client headers passed to the worker (Authorization only when the router has no key of its own)."""
    out = {name: headers[name] for name in FORWARDED_HEADERS if name in headers}
    out.setdefault("Content-Type", "application/json")
    if state.config.api_key is None and "Authorization" in headers:
        out["Authorization"] = headers["Authorization"]
    return out


def _response_headers(upstream: aiohttp.ClientResponse, ticket: Ticket) -> dict[str, str]:
    out = {"x-k3-worker": ticket.worker_id, "x-k3-session-id": ticket.session_id}
    for name in ("Content-Type", "Content-Encoding"):
        value = upstream.headers.get(name)
        if value:
            out[name] = value
    return out


def _completion_tokens(content: bytes) -> int | None:
    if len(content) > 1 << 20:
        return None
    try:
        usage = orjson.loads(content).get("usage") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return None
    value = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) else None


def _backpressure_seconds(upstream: aiohttp.ClientResponse, default_s: float) -> float:
    value = upstream.headers.get("Retry-After", "")
    try:
        return min(300.0, max(0.1, float(value)))
    except ValueError:
        return default_s


def route_request_of(state: RouterState, facts: RequestFacts) -> RouteRequest:
    """The request's session (explicit key, else found by prefix or new) and what placement needs."""
    if facts.explicit_session is not None:
        session_id, source = facts.explicit_session, facts.session_source
    else:
        session_id, source = state.core.identify(facts.session_keys)
    state.metrics.count(state.metrics.sessions_found, source)
    return RouteRequest(session_id, facts.context_tokens, facts.growth_tokens, facts.session_keys,
                        facts.explicit_session is None, facts.token_ids, facts.retain_s or 0.0)


def unavailable_after_failures(failures: list[AttemptFailed]) -> RouterHTTPError:
    """The client's error once every attempt failed: 429 if every worker pushed back, else 502."""
    pushed_back = [f.backpressure_s for f in failures if f.backpressure_s is not None]
    if len(pushed_back) == len(failures):
        return RouterHTTPError(429, "every worker tried answered 429 (back-pressure); retry later",
                               "worker_backpressure", _retry_after(min(pushed_back)))
    return RouterHTTPError(502, "upstream failed: " + "; ".join(f.detail for f in failures), "upstream_failed")


async def forward(state: RouterState, request: web.Request, body: bytes, facts: RequestFacts) -> web.StreamResponse:
    """Send a request to the worker its session belongs on, retrying before the first byte."""
    route_request = route_request_of(state, facts)
    headers = upstream_headers(state, request.headers)
    headers[SESSION_HEADER] = route_request.session_id  # the worker tags its KV events with it
    if facts.retain_s is not None:
        headers[RETAIN_HEADER] = f"{facts.retain_s:g}"  # clamped; the worker's guard reads the header first
    reliability = state.config.reliability
    exclude: list[str] = []
    failures: list[AttemptFailed] = []
    for attempt in range(1 + reliability.max_retries):
        if attempt:
            state.metrics.retries.inc()
            await asyncio.sleep(reliability.retry_backoff_s * attempt)
        try:
            _, ticket = await place(state, route_request, facts.prefix_hashes, exclude)
        except RouterHTTPError:
            if not failures:
                raise
            break
        await maybe_prefetch(state, ticket.worker_id, route_request)
        outcome = await _attempt(state, request, body, facts.stream, headers, ticket)
        if isinstance(outcome, web.StreamResponse):
            return outcome
        failures.append(outcome)
        exclude.append(ticket.worker_id)
    raise unavailable_after_failures(failures)


async def maybe_prefetch(state: RouterState, worker_id: str, request: RouteRequest) -> None:
    """Ask the worker to load the turn's prefix from host/L3 first when its events say it is there (prefetch.py);
    the prefetch is on its way when this returns, and never delays or fails the turn beyond that."""
    policy = state.config.policy
    plan = plan_prefetch(state.core.event_feeds.get(worker_id), request.session_id, request.token_ids,
                         policy.prefetch_min_tokens)
    if plan is None:
        return
    state.metrics.count(state.metrics.prefetches, worker_id)
    task = asyncio.create_task(send_prefetch(state.control, worker_id, plan, policy.prefetch_timeout_s))
    state.background.add(task)
    task.add_done_callback(state.background.discard)
    await asyncio.sleep(0)  # let it start before the turn is sent


async def _attempt(state: RouterState, request: web.Request, body: bytes, stream: bool,
                   headers: dict[str, str], ticket: Ticket) -> web.StreamResponse | AttemptFailed:
    """One try on one worker: the response sent to the client, or why it failed (retryable)."""
    started = time.perf_counter()
    try:
        upstream = await state.session.post(ticket.worker_id + request.path, data=body, headers=headers)
    except UPSTREAM_ERRORS as exc:
        return transport_failed(state, ticket, "connect", exc)
    except BaseException:
        state.complete(ticket, ok=False, worker_fault=False)
        raise
    if upstream.status == 429:
        return _pushed_back(state, ticket, upstream)
    if upstream.status in RETRYABLE_STATUS:
        upstream.close()
        return _failed(state, ticket, f"status {upstream.status}", None)
    is_stream = stream and upstream.status == 200
    try:
        first = await _first_chunk(upstream) if is_stream else await upstream.read()
    except UPSTREAM_ERRORS as exc:
        upstream.close()
        return transport_failed(state, ticket, "read", exc)
    except BaseException:
        state.complete(ticket, ok=False, worker_fault=False)
        upstream.close()
        raise
    state.core.first_byte(ticket, state.now())
    state.metrics.first_byte_seconds.observe(time.perf_counter() - started)
    response_headers = _response_headers(upstream, ticket)
    if not is_stream:
        upstream.release()
        state.complete(ticket, ok=upstream.status < 500, output_tokens=_completion_tokens(first))
        return web.Response(body=first, status=upstream.status, headers=response_headers)
    response = web.StreamResponse(status=upstream.status, headers=response_headers)
    try:
        await response.prepare(request)
    except BaseException:
        state.complete(ticket, ok=False, worker_fault=False)
        upstream.close()
        raise
    return await _relay(state, response, first, upstream, ticket)


async def _first_chunk(upstream: aiohttp.ClientResponse) -> bytes:
    try:
        return await upstream.content.iter_any().__anext__()
    except StopAsyncIteration:
        return b""


def transport_failed(state: RouterState, ticket: Ticket, stage: str, exc: Exception) -> AttemptFailed:
    """A transport failure at `stage` (connect | read), named: a socket read timeout (no byte within
    `reliability.read_timeout_s`, e.g. a worker queueing a long prefill) is a read timeout, not a connect
    error, even when it hits before the response head arrived."""
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return _failed(state, ticket, f"read timeout (no byte within reliability.read_timeout_s = "
                       f"{state.config.reliability.read_timeout_s:g} s)", None)
    return _failed(state, ticket, stage, exc)


def _failed(state: RouterState, ticket: Ticket, kind: str, exc: Exception | None) -> AttemptFailed:
    state.complete(ticket, ok=False)
    state.metrics.count(state.metrics.upstream_errors, ticket.worker_id, kind.split()[0])
    return AttemptFailed(f"{ticket.worker_id}: {kind}" if exc is None else
                         f"{ticket.worker_id}: {kind} error ({type(exc).__name__})")


def _pushed_back(state: RouterState, ticket: Ticket, upstream: aiohttp.ClientResponse) -> AttemptFailed:
    seconds = _backpressure_seconds(upstream, state.config.policy.backpressure_s)
    upstream.close()
    state.complete(ticket, ok=False, worker_fault=False)
    state.core.backpressure(ticket.worker_id, state.now() + seconds)
    state.metrics.count(state.metrics.backpressure, ticket.worker_id)
    return AttemptFailed(f"{ticket.worker_id}: status 429", seconds)


async def _send(response: web.StreamResponse, data: bytes) -> bool:
    """Write to the client; False when the client has gone."""
    try:
        await response.write(data)
        return True
    except CLIENT_GONE:
        return False


async def _relay(state: RouterState, response: web.StreamResponse, first: bytes,
                 upstream: aiohttp.ClientResponse, ticket: Ticket) -> web.StreamResponse:
    """Pass stream chunks through as they arrive; close the ticket however the stream ends."""
    ended, events = "client", 0  # ended: "ok" | "worker" (upstream broke) | "client" (client gone)
    chunks = upstream.content.iter_any()
    try:
        chunk = first
        while not chunk or await _send(response, chunk):
            events += chunk.count(b"data:")
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                ended = "ok"
                break
            except UPSTREAM_ERRORS as exc:
                ended = "worker"
                state.metrics.count(state.metrics.upstream_errors, ticket.worker_id, "stream")
                message = f"worker failed mid-stream ({type(exc).__name__}); partial answer"
                await _send(response, sse_error_event(message, "upstream_stream_broken"))
                break
        if ended != "client":
            try:
                await response.write_eof()
            except CLIENT_GONE:
                pass
    finally:
        state.complete(ticket, ok=ended == "ok", output_tokens=events if ended == "ok" else None,
                       worker_fault=ended == "worker")
        if ended == "ok":
            upstream.release()
        else:
            upstream.close()
    return response
