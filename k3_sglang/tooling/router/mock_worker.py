"""A small imitation of an SGLang worker for tests and benchmarks, with fault injection.

It serves the shapes SGLang 0.5.23 serves: `/health`, `/v1/loads` (`loads[]` per DP rank, ISO-8601
`timestamp`), `/get_server_info` and `/server_info` (`max_total_num_tokens` in logical tokens,
`dcp_size`, `max_running_requests`, `max_mamba_cache_size`), `/v1/models`, `/generate`,
`/v1/completions`, `/v1/chat/completions` (streamed as `data: ...` events ending in `data: [DONE]`).

Faults (`POST /_fault` with a JSON `Fault`, `GET /_stats` for counters):
`slow` waits `delay_s` before answering; `error` answers 500 for the next `count` requests (-1:
always); `reject` answers 400; `overloaded` answers 429 with `Retry-After: delay_s`; `die_mid_stream` sends
`chunks_before_death` chunks and drops the connection. `POST /_load` sets what `/v1/loads` reports
(`num_waiting_reqs`, `num_waiting_uncached_tokens`).
PD mode (`disaggregation_mode` prefill or decode) imitates SGLang's PD protocol within one process:
a prefill mock needs `bootstrap_host/port/room`, computes for `transfer_delay_s` and then publishes
the room under its bootstrap address; a decode mock waits until a prefill published the room at
the address it was given (or its client goes away, counted in `pd_cancelled`, or
`bootstrap_timeout_s` passes: 500), then answers with words naming the prefill that fed it.
Run standalone: `python -m k3_sglang.tooling.router.mock_worker --port 31000 --name w0`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field

import orjson
import uvicorn
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse


@dataclass
class Fault:
    """The fault a mock worker injects into its generation endpoints."""

    mode: str = "ok"
    delay_s: float = 0.0
    count: int = -1
    chunks_before_death: int = 2


@dataclass
class MockState:
    """Counters and configuration of one mock worker."""

    name: str
    model: str = "mock-k3"
    max_total_num_tokens: int = 65536
    max_running_requests: int = 16
    dcp_size: int = 1
    reply_tokens: int = 8
    token_delay_s: float = 0.0
    fault: Fault = field(default_factory=Fault)
    requests: int = 0
    running: int = 0
    waiting_reqs: int = 0
    waiting_uncached_tokens: int = 0
    last_body: bytes = b""
    last_headers: dict = field(default_factory=dict)
    received: list = field(default_factory=list)  # (path, body) of the latest generation requests, oldest first
    sessions_seen: dict = field(default_factory=dict)
    disaggregation_mode: str = "null"
    bootstrap_port: int = 8998
    page_size: int = 1
    kv_cache_dtype: str = "auto"
    transfer_delay_s: float = 0.0
    bootstrap_timeout_s: float = 30.0
    pd_cancelled: int = 0
    rooms: list = field(default_factory=list)
    kv_events: dict | None = None  # what /server_info advertises under `kv_events` (SGLang's publisher block)


# PD rooms published by prefill mocks of this process: (bootstrap host, port, room) -> prefill name
_ROOMS: dict[tuple[str, int, int], str] = {}
_ROOMS_LOCK = threading.Lock()


def _bootstrap_keys(body: dict) -> list[tuple[str, int, int]] | None:
    hosts, ports, rooms = body.get("bootstrap_host"), body.get("bootstrap_port"), body.get("bootstrap_room")
    if hosts is None or ports is None or rooms is None:
        return None
    if isinstance(rooms, list):
        return list(zip(hosts, ports, rooms))
    return [(hosts, ports, rooms)]


async def _pd_leg(state: MockState, request: Request, body: dict) -> Response | str | None:
    """Run the PD part of a request: a Response to answer with, the feeding prefill's name, or None."""
    if state.disaggregation_mode not in ("prefill", "decode"):
        return None
    keys = _bootstrap_keys(body)
    if keys is None:
        return JSONResponse({"error": {"message": "PD request without bootstrap_host/port/room",
                                       "type": "invalid_request_error", "code": 400}}, status_code=400)
    state.rooms.extend(k[2] for k in keys)
    if state.disaggregation_mode == "prefill":
        await asyncio.sleep(state.transfer_delay_s)
        with _ROOMS_LOCK:
            for host, _port, room in keys:
                _ROOMS[(host, state.bootstrap_port, room)] = state.name
        return state.name
    deadline = time.monotonic() + state.bootstrap_timeout_s
    while True:
        with _ROOMS_LOCK:
            fed = [_ROOMS.get(k) for k in keys]
        if all(fed):
            return fed[0]
        if await request.is_disconnected():
            state.pd_cancelled += 1
            return JSONResponse({"error": {"message": "client gone"}}, status_code=499)
        if time.monotonic() > deadline:
            return JSONResponse({"error": {"message": "KV transfer from prefill timed out", "type": "server_error",
                                           "code": 500}}, status_code=500)
        await asyncio.sleep(0.005)


def _fault_active(state: MockState, mode: str) -> bool:
    fault = state.fault
    if fault.mode != mode or fault.count == 0:
        return False
    if fault.count > 0:
        fault.count -= 1
    return True


def _reply_words(state: MockState, body: dict) -> list[str]:
    limit = body.get("max_tokens") or body.get("max_completion_tokens") or \
        (body.get("sampling_params") or {}).get("max_new_tokens") or state.reply_tokens
    n = max(1, min(int(limit), state.reply_tokens))
    return [f"{state.name}-t{i} " for i in range(n)]


def _chat_chunk(state: MockState, rid: str, delta: dict, finish: str | None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": state.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}


def _completion_chunk(state: MockState, rid: str, text: str, finish: str | None) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": state.model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]}


def _events(state: MockState, path: str, rid: str, words: list[str]) -> list[dict]:
    if path == "/v1/chat/completions":
        first = [_chat_chunk(state, rid, {"role": "assistant", "content": ""}, None)]
        body = [_chat_chunk(state, rid, {"content": w}, None) for w in words]
        return first + body + [_chat_chunk(state, rid, {}, "stop")]
    if path == "/v1/completions":
        return [_completion_chunk(state, rid, w, None) for w in words] + [_completion_chunk(state, rid, "", "stop")]
    text = ""
    out = []
    for i, w in enumerate(words):
        text += w
        out.append({"text": text, "output_ids": list(range(i + 1)),
                    "meta_info": {"id": rid, "finish_reason": None, "completion_tokens": i + 1}})
    out[-1]["meta_info"]["finish_reason"] = {"type": "length", "length": len(words)}
    return out


def _full_response(state: MockState, path: str, rid: str, words: list[str], prompt_tokens: int) -> dict:
    text = "".join(words)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
             "total_tokens": prompt_tokens + len(words)}
    if path == "/v1/chat/completions":
        return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": state.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop", "logprobs": None}], "usage": usage}
    if path == "/v1/completions":
        return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": state.model,
                "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}], "usage": usage}
    return {"text": text, "output_ids": list(range(len(words))),
            "meta_info": {"id": rid, "finish_reason": {"type": "length", "length": len(words)},
                          "prompt_tokens": prompt_tokens, "completion_tokens": len(words), "cached_tokens": 0}}


async def _stream(state: MockState, path: str, rid: str, words: list[str], die: bool) -> AsyncIterator[bytes]:
    state.running += 1
    try:
        for i, event in enumerate(_events(state, path, rid, words)):
            if die and i >= state.fault.chunks_before_death:
                raise ConnectionAbortedError("mock worker dies mid-stream")
            yield b"data: " + orjson.dumps(event) + b"\n\n"
            if state.token_delay_s:
                await asyncio.sleep(state.token_delay_s)
        yield b"data: [DONE]\n\n"
    finally:
        state.running -= 1


def create_mock_app(state: MockState) -> FastAPI:
    """Build the mock worker app around `state`."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    async def generation(request: Request) -> Response:
        path = request.url.path
        state.last_body = await request.body()
        state.last_headers = dict(request.headers)
        state.received = state.received[-63:] + [(path, state.last_body)]
        body = orjson.loads(state.last_body)
        state.requests += 1
        sid = request.headers.get("x-session-id")
        if sid:
            state.sessions_seen[sid] = state.sessions_seen.get(sid, 0) + 1
        if _fault_active(state, "slow"):
            await asyncio.sleep(state.fault.delay_s)
        if _fault_active(state, "error"):
            return JSONResponse({"error": {"message": "injected failure", "type": "server_error", "code": 500}},
                                status_code=500)
        if _fault_active(state, "reject"):
            return JSONResponse({"error": {"message": "request rejected by the mock", "type": "invalid_request_error",
                                           "code": 400}}, status_code=400)
        if _fault_active(state, "overloaded"):
            return JSONResponse({"error": {"message": "engine overloaded", "type": "rate_limit_error", "code": 429}},
                                status_code=429, headers={"Retry-After": f"{state.fault.delay_s:g}"})
        fed_by = await _pd_leg(state, request, body)
        if isinstance(fed_by, Response):
            return fed_by
        rid = f"{state.name}-{state.requests}"
        words = _reply_words(state, body)
        if fed_by is not None and state.disaggregation_mode == "decode":
            words = [f"{fed_by}>{w}" for w in words]
        elif fed_by is not None:
            words = words[:1]  # a PD prefill server answers with its one prefill token
        if body.get("stream"):
            die = _fault_active(state, "die_mid_stream")
            return StreamingResponse(_stream(state, path, rid, words, die), media_type="text/event-stream")
        prompt_tokens = len(orjson.dumps(body)) // 4
        return Response(orjson.dumps(_full_response(state, path, rid, words, prompt_tokens)),
                        media_type="application/json")

    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
        app.add_api_route(path, generation, methods=["POST"])

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> Response:
        card = {"id": state.model, "object": "model", "created": 0, "owned_by": "sglang", "root": state.model,
                "parent": None, "max_model_len": state.max_total_num_tokens}
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info() -> Response:
        return JSONResponse({"model_path": state.model, "served_model_name": state.model,
                             "max_total_num_tokens": state.max_total_num_tokens, "dcp_size": state.dcp_size,
                             "tp_size": 1, "max_running_requests": state.max_running_requests,
                             "max_mamba_cache_size": state.max_running_requests, "version": "mock",
                             "disaggregation_mode": state.disaggregation_mode, "page_size": state.page_size,
                             "kv_cache_dtype": state.kv_cache_dtype, "dtype": "float32",
                             "disaggregation_bootstrap_port": state.bootstrap_port,
                             "disaggregation_transfer_backend": "mooncake", "kv_events": state.kv_events})

    @app.get("/v1/loads")
    async def loads() -> Response:
        load = {"dp_rank": 0, "num_running_reqs": state.running, "num_waiting_reqs": state.waiting_reqs,
                "num_waiting_uncached_tokens": state.waiting_uncached_tokens, "num_used_tokens": 0,
                "num_total_tokens": 0, "max_total_num_tokens": state.max_total_num_tokens,
                "max_running_requests": state.max_running_requests, "token_usage": 0.0}
        return JSONResponse({"timestamp": dt.datetime.now(dt.timezone.utc).isoformat(), "version": "mock",
                             "accelerator": None, "num_accelerators": 1, "loads": [load]})

    @app.post("/_load")
    async def set_load(request: Request) -> Response:
        load = orjson.loads(await request.body())
        state.waiting_reqs = int(load.get("num_waiting_reqs", 0))
        state.waiting_uncached_tokens = int(load.get("num_waiting_uncached_tokens", 0))
        return JSONResponse({"num_waiting_reqs": state.waiting_reqs,
                             "num_waiting_uncached_tokens": state.waiting_uncached_tokens})

    @app.post("/_fault")
    async def set_fault(request: Request) -> Response:
        state.fault = Fault(**orjson.loads(await request.body()))
        return JSONResponse(asdict(state.fault))

    @app.get("/_stats")
    async def stats() -> Response:
        return JSONResponse({"name": state.name, "requests": state.requests, "running": state.running,
                             "sessions_seen": state.sessions_seen, "pd_cancelled": state.pd_cancelled,
                             "rooms": state.rooms})

    return app


def main(argv: list[str] | None = None) -> int:
    """Run one mock worker on 127.0.0.1."""
    parser = argparse.ArgumentParser(description="mock SGLang worker")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="mock")
    parser.add_argument("--reply-tokens", type=int, default=8)
    args = parser.parse_args(argv)
    state = MockState(name=args.name, reply_tokens=args.reply_tokens)
    uvicorn.run(create_mock_app(state), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
