"""One streamed `/generate` request timed from the client, shared by the `k3 bench` targets."""
from __future__ import annotations

import json
import time

import httpx


def stream_generate(url: str, body: dict, timeout_s: float) -> tuple[float, float, int]:
    """POST body (with "stream": True) to url/generate: (seconds to the first streamed chunk, seconds from the
    first to the last, completion tokens). RuntimeError naming the status on a non-200 answer or an empty stream."""
    start = time.perf_counter()
    first = last = None
    tokens = 0
    with httpx.stream("POST", url + "/generate", json={**body, "stream": True}, timeout=timeout_s) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"/generate answered {resp.status_code}: {resp.read()[:300]!r}")
        for line in resp.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            now = time.perf_counter()
            first = first or now
            last = now
            tokens = json.loads(line[5:])["meta_info"]["completion_tokens"]
    if first is None:
        raise RuntimeError("/generate streamed no token")
    return first - start, last - first, tokens
