"""PD disaggregation on the request path: pair a prefill and a decode server, send both legs, answer from decode.

Per request (SMG's PD routing, `pd_router.rs`, is the behaviour matched):
1. the session's decode server is chosen first (its home: sticky, moved only by the policy), among
   the decode servers some usable prefill server can pair with (same KV layout, `pd.py`); then a
   prefill server (its own sticky leg: the prefill radix cache holds the session's prefix);
2. the body gets `bootstrap_host` / `bootstrap_port` / `bootstrap_room` and goes to both at once;
3. the client's answer is the decode server's (streamed chunk by chunk); the prefill leg's answer
   is read and dropped, in the background once the decode server has answered.
Failures before the first byte reaches the client re-pair and retry (at most `max_retries`):
- the prefill leg fails while decode waits: the decode leg is cancelled at once (closing its
  connection aborts it in SGLang; it would otherwise wait `SGLANG_DISAGGREGATION_WAITING_TIMEOUT`,
  300 s, for KV that never comes) and the pair is retried with another prefill server when there is one;
- the decode leg fails (connection refused or reset, 5xx, a server killed mid-session): the prefill
  leg is cancelled and the session is re-paired on another decode server; the prefill radix cache
  makes the re-prefill of the session's context cheap;
- a 4xx from either leg is the client's answer (the other leg is cancelled).
Once bytes are out, a broken decode stream ends with an SSE error event and `[DONE]`, as unpaired.
Every ticket of both legs is closed exactly once on every path.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web

from k3_sglang.router.errors import RouterHTTPError
from k3_sglang.router.fleet import DECODE, PREFILL, Ticket
from k3_sglang.router.pd import (DEFAULT_BOOTSTRAP_PORT, bootstrap_host, layout_mismatch, parallel_samples,
                                 with_bootstrap)
from k3_sglang.router.policy import RouteRequest
from k3_sglang.router.proxy import (RETRYABLE_STATUS, UPSTREAM_ERRORS, AttemptFailed, RouterState, _completion_tokens,
                                    _failed, _first_chunk, _pushed_back, _relay, _response_headers, place,
                                    route_request_of, transport_failed, unavailable_after_failures, upstream_headers)
from k3_sglang.router.session_key import RequestFacts


@dataclass(frozen=True, slots=True)
class Pair:
    """The two tickets of one PD attempt."""

    prefill: Ticket
    decode: Ticket


@dataclass(frozen=True, slots=True)
class LegFailed:
    """One attempt failed on one leg before anything reached the client."""

    role: str
    worker_id: str
    failure: AttemptFailed


@dataclass(frozen=True, slots=True)
class LegAnswer:
    """A leg's HTTP answer read in full (status and body), or why there was none."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    failure: AttemptFailed | None = None


def role_problem(state: RouterState) -> str:
    """'' unless every registered server of one role is refused (it reports another role): then why."""
    workers = list(state.core.fleet.workers.values())
    for role in (PREFILL, DECODE):
        of_role = [w for w in workers if w.role == role]
        if of_role and all(w.refusal for w in of_role):
            return f"no usable {role} server: " + "; ".join(w.refusal for w in of_role)
    return ""


def pairing_problem(state: RouterState) -> str:
    """'' when some registered prefill and decode servers can pair (or their layouts are not known
    yet); else every reason none can."""
    workers = state.core.fleet.workers.values()
    prefills = [w for w in workers if w.role == PREFILL and not w.refusal]
    decodes = [w for w in workers if w.role == DECODE and not w.refusal]
    reasons = []
    for d in decodes:
        for p in prefills:
            why = layout_mismatch(p.worker_id, p.layout, d.worker_id, d.layout)
            if not why:
                return ""
            reasons.append(why)
    return "; ".join(reasons)


def incompatible_prefills(state: RouterState, decode_id: str) -> list[str]:
    """Prefill servers whose KV layout differs from this decode server's."""
    workers = state.core.fleet.workers
    decode = workers[decode_id]
    return [w.worker_id for w in workers.values() if w.role == PREFILL
            and layout_mismatch(w.worker_id, w.layout, decode.worker_id, decode.layout)]


def unpairable_decodes(state: RouterState, exclude_prefills: list[str]) -> list[str]:
    """Decode servers no usable (not excluded, not refused) prefill server shares a KV layout with."""
    workers = state.core.fleet.workers.values()
    prefills = [w for w in workers if w.role == PREFILL and not w.refusal and w.worker_id not in exclude_prefills]
    return [d.worker_id for d in workers if d.role == DECODE and not any(
        not layout_mismatch(p.worker_id, p.layout, d.worker_id, d.layout) for p in prefills)]


async def place_pair(state: RouterState, request: RouteRequest, prefix_hashes: tuple[int, ...],
                     exclude_prefills: list[str], exclude_decodes: list[str]) -> Pair:
    """A decode server for the session (sticky), then a prefill server that can pair with it."""
    refused = role_problem(state)
    if refused:
        raise RouterHTTPError(503, refused, "pd_role_mismatch")
    problem = pairing_problem(state)
    if problem:
        raise RouterHTTPError(503, f"no prefill and decode server can pair: {problem}", "pd_layout_mismatch")
    exclude = exclude_decodes + [d for d in unpairable_decodes(state, exclude_prefills) if d not in exclude_decodes]
    _, decode = await place(state, request, prefix_hashes, exclude, DECODE)
    prefill_request = dataclasses.replace(request, growth_tokens=1)  # prefill holds the prompt, not the answer
    try:
        _, prefill = await place(state, prefill_request, prefix_hashes,
                                 exclude_prefills + incompatible_prefills(state, decode.worker_id), PREFILL)
    except BaseException:
        state.complete(decode, ok=False, worker_fault=False)
        raise
    return Pair(prefill, decode)


async def forward_pd(state: RouterState, request: web.Request, parsed: dict, facts: RequestFacts) -> web.StreamResponse:
    """Serve one client request through a (prefill, decode) pair, re-pairing before the first byte."""
    if parallel_samples(parsed) > 1:
        raise RouterHTTPError(400, "n > 1 is not supported through PD disaggregation (one bootstrap room per "
                              "prompt); send n separate requests", "invalid_request")
    route_request = route_request_of(state, facts)
    headers = upstream_headers(state, request.headers)
    reliability = state.config.reliability
    exclude = {PREFILL: [], DECODE: []}
    failures: list[AttemptFailed] = []
    for attempt in range(1 + reliability.max_retries):
        if attempt:
            state.metrics.retries.inc()
            await asyncio.sleep(reliability.retry_backoff_s * attempt)
        try:
            pair = await place_pair(state, route_request, facts.prefix_hashes, exclude[PREFILL], exclude[DECODE])
        except RouterHTTPError:
            if not failures:
                raise
            break
        outcome = await _pd_attempt(state, request, parsed, facts.stream, headers, pair)
        if isinstance(outcome, web.StreamResponse):
            return outcome
        failures.append(outcome.failure)
        exclude[outcome.role].append(outcome.worker_id)
        state.metrics.count(state.metrics.pd_leg_failures, outcome.role)
        if outcome.role == DECODE:
            state.metrics.pd_repairs.inc()
    raise unavailable_after_failures(failures)


async def _pd_attempt(state: RouterState, request: web.Request, parsed: dict, stream: bool,
                      headers: dict[str, str], pair: Pair) -> web.StreamResponse | LegFailed:
    """Both legs of one pair; the client's response, or which leg failed (retryable)."""
    prefill = state.core.fleet.workers.get(pair.prefill.worker_id)
    port = (prefill.bootstrap_port if prefill is not None else None) or DEFAULT_BOOTSTRAP_PORT
    body = orjson.dumps(with_bootstrap(parsed, request.path, bootstrap_host(pair.prefill.worker_id), port, state.rng))
    state.metrics.count(state.metrics.pd_pairs, pair.prefill.worker_id, pair.decode.worker_id)
    started = time.perf_counter()
    prefill_leg = asyncio.create_task(_prefill_leg(state, request.path, body, headers, pair.prefill))
    decode_head = asyncio.create_task(_decode_head(state, request.path, body, headers, stream, pair.decode))
    try:
        done, _ = await asyncio.wait({prefill_leg, decode_head}, return_when=asyncio.FIRST_COMPLETED)
        if decode_head not in done:
            answer = prefill_leg.result()
            if answer.failure is not None or answer.status != 200:
                await _cancel(decode_head)
                if answer.failure is not None:
                    return LegFailed(PREFILL, pair.prefill.worker_id, answer.failure)
                return web.Response(body=answer.body, status=answer.status, content_type=None,
                                    headers={"Content-Type": answer.content_type, "x-k3-worker": pair.prefill.worker_id,
                                             "x-k3-session-id": pair.decode.session_id})
        head = await decode_head
    except BaseException:  # the client went away (handler cancelled): drop both legs
        await _cancel(decode_head)
        await _cancel(prefill_leg)
        raise
    if isinstance(head, AttemptFailed):
        await _cancel(prefill_leg)
        return LegFailed(DECODE, pair.decode.worker_id, head)
    _finish_in_background(state, prefill_leg)
    upstream, first = head
    state.metrics.first_byte_seconds.observe(time.perf_counter() - started)
    response_headers = _response_headers(upstream, pair.decode)
    response_headers["x-k3-prefill-worker"] = pair.prefill.worker_id
    if not (stream and upstream.status == 200):
        upstream.release()
        state.complete(pair.decode, ok=upstream.status < 500, output_tokens=_completion_tokens(first))
        return web.Response(body=first, status=upstream.status, headers=response_headers)
    response = web.StreamResponse(status=upstream.status, headers=response_headers)
    try:
        await response.prepare(request)
    except BaseException:
        state.complete(pair.decode, ok=False, worker_fault=False)
        upstream.close()
        raise
    return await _relay(state, response, first, upstream, pair.decode)


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _finish_in_background(state: RouterState, task: asyncio.Task) -> None:
    """Let a prefill leg that is still running finish (its ticket closes itself) without holding the answer."""
    if task.done():
        return
    state.background.add(task)
    task.add_done_callback(state.background.discard)


def _leg_error(state: RouterState, ticket: Ticket, upstream: aiohttp.ClientResponse | None,
               exc: Exception) -> AttemptFailed:
    """A leg's transport failure, named (a decode server still waiting for KV behind a long prefill queue
    sends no byte: a read timeout, not a connect error)."""
    return transport_failed(state, ticket, "connect" if upstream is None else "read", exc)


async def _decode_head(state: RouterState, path: str, body: bytes, headers: dict[str, str], stream: bool,
                       ticket: Ticket) -> tuple[aiohttp.ClientResponse, bytes] | AttemptFailed:
    """POST to the decode server and wait for its first chunk (a stream) or whole body.

    On success the ticket stays open for the caller; on failure or cancellation it is closed here."""
    upstream = None
    try:
        upstream = await state.session.post(ticket.worker_id + path, data=body, headers=headers)
        if upstream.status == 429:
            return _pushed_back(state, ticket, upstream)
        if upstream.status in RETRYABLE_STATUS:
            status = upstream.status
            upstream.close()
            return _failed(state, ticket, f"status {status}", None)
        first = await _first_chunk(upstream) if stream and upstream.status == 200 else await upstream.read()
    except UPSTREAM_ERRORS as exc:
        if upstream is not None:
            upstream.close()
        return _leg_error(state, ticket, upstream, exc)
    except BaseException:
        state.complete(ticket, ok=False, worker_fault=False)
        if upstream is not None:
            upstream.close()
        raise
    state.core.first_byte(ticket, state.now())
    return upstream, first


async def _prefill_leg(state: RouterState, path: str, body: bytes, headers: dict[str, str],
                       ticket: Ticket) -> LegAnswer:
    """POST to the prefill server and read its whole answer; closes the ticket on every path."""
    upstream = None
    try:
        upstream = await state.session.post(ticket.worker_id + path, data=body, headers=headers)
        if upstream.status == 429:
            failure = _pushed_back(state, ticket, upstream)
            return LegAnswer(429, failure=failure)
        content = await upstream.read()
    except UPSTREAM_ERRORS as exc:
        if upstream is not None:
            upstream.close()
        return LegAnswer(0, failure=_leg_error(state, ticket, upstream, exc))
    except BaseException:
        state.complete(ticket, ok=False, worker_fault=False)
        if upstream is not None:
            upstream.close()
        raise
    status = upstream.status
    upstream.release()
    if status in RETRYABLE_STATUS:
        return LegAnswer(status, failure=_failed(state, ticket, f"status {status}", None))
    state.core.first_byte(ticket, state.now())
    state.complete(ticket, ok=True)  # a 4xx is the request's fault, not the worker's
    return LegAnswer(status, content, upstream.headers.get("Content-Type", "application/json"))
