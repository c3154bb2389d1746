"""One streamed `/generate` request timed from the client, shared by the `k3 bench` targets."""
from __future__ import annotations

import json
import time

import httpx


def stream_chunks(url: str, body: dict, timeout_s: float = 600.0,
                  http: httpx.Client | None = None) -> tuple[float, float, list[dict]]:
    """POST body (with "stream": True) to url/generate, on `http` (a shared connection pool) or a fresh stream:
    (seconds to the first streamed chunk, seconds from the first to the last, the parsed chunks). RuntimeError
    naming the status on a non-200 answer or an empty stream."""
    start = time.perf_counter()
    first = last = None
    chunks: list[dict] = []
    opened = (http.stream("POST", url + "/generate", json={**body, "stream": True}) if http is not None else
              httpx.stream("POST", url + "/generate", json={**body, "stream": True}, timeout=timeout_s))
    with opened as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"/generate answered {resp.status_code}: {resp.read()[:300]!r}")
        for line in resp.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            now = time.perf_counter()
            first = first or now
            last = now
            chunks.append(json.loads(line[5:]))
    if first is None:
        raise RuntimeError("/generate streamed no token")
    return first - start, last - first, chunks


def stream_generate(url: str, body: dict, timeout_s: float) -> tuple[float, float, int]:
    """(seconds to the first streamed chunk, seconds from the first to the last, completion tokens)."""
    ttft, decode_s, chunks = stream_chunks(url, body, timeout_s)
    return ttft, decode_s, chunks[-1]["meta_info"]["completion_tokens"]
