"""Session retention requests: "keep my cache for T seconds after this turn". Pure; shared by router and worker.

A client asks with the header `X-Session-Retain-S: T` or the body field `session_retain_s: T` (OpenAI clients:
`extra_body={"session_retain_s": T}`); the header wins when both are given. T is seconds, a finite number >= 0
(0: no retention). Anything else is refused with a 400 that names the header or field; a T above the configured
maximum is clamped to it (e.g. 10^9 s becomes `max_retain_s`). The router forwards the clamped value as the
header; the worker (`k3_sglang/serving/retention.py`) keeps the session's prefix and KDA state, within its
configured share of the pool.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

RETAIN_HEADER = "X-Session-Retain-S"
RETAIN_FIELD = "session_retain_s"


class BadRetention(ValueError):
    """A retention value that is not a finite number of seconds >= 0; `param` names the header or field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _seconds(value: Any, param: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            value = None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise BadRetention(f"{param} must be a finite number of seconds >= 0", param)
    return float(value)


def requested_retention(headers: Mapping[str, str], body: Any, max_retain_s: float) -> float | None:
    """Seconds of retention asked for (clamped to `max_retain_s`), None when not asked; BadRetention if invalid.

    `headers` must look names up case-insensitively (aiohttp, Starlette and our ASGI guard's dict of lowercased
    names all do when given the lowercase name)."""
    header = headers.get(RETAIN_HEADER.lower())
    field = body.get(RETAIN_FIELD) if isinstance(body, dict) else None
    if header is not None:
        seconds = _seconds(header, RETAIN_HEADER)
        if field is not None:
            _seconds(field, RETAIN_FIELD)  # a bad body value is refused even when the header wins
    elif field is not None:
        seconds = _seconds(field, RETAIN_FIELD)
    else:
        return None
    return min(seconds, float(max_retain_s))
