"""What the request guard writes into a request body so SGLang's scheduler sees the session. Pure.

- `X-Session-Id` (what `k3 router` forwards for every request) becomes SGLang 0.5.23's `session_id` field when
  the body has neither `session_id` nor `session_params`: SGLang only attributes with it (it tags the KV
  events of the request's cache stores; no session-radix semantics unless `--enable-session-radix-cache`).
- A retention (`X-Session-Retain-S` header or `session_retain_s` field, router/retention.py) goes to the scheduler
  in `custom_params["__k3_retain_s"]` (top level for the OpenAI endpoints, `sampling_params` for `/generate`):
  the private carrier SGLang itself uses for per-request values every path forwards. `session_retain_s` is
  removed from the body (SGLang's `/generate` refuses unknown fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from k3_sglang.router.retention import RETAIN_FIELD, requested_retention

SESSION_HEADER = "x-session-id"
RETAIN_PARAM = "__k3_retain_s"
MAX_SESSION_ID_CHARS = 256


def session_fields(path: str, body: Any, headers: Mapping[str, str], max_retain_s: float) -> dict | None:
    """The body with the session fields written in, or None when nothing changes (BadRetention if invalid)."""
    if not isinstance(body, dict):
        return None
    retain = requested_retention(headers, body, max_retain_s)
    session = headers.get(SESSION_HEADER)
    add_session = bool(session) and "session_id" not in body and body.get("session_params") is None
    if retain is None and not add_session and RETAIN_FIELD not in body:
        return None
    out = {k: v for k, v in body.items() if k != RETAIN_FIELD}
    if add_session:
        out["session_id"] = session[:MAX_SESSION_ID_CHARS]
    if retain:
        holder = out
        if path == "/generate":
            holder = out["sampling_params"] = dict(out.get("sampling_params") or {})
        custom = holder.get("custom_params")
        holder["custom_params"] = {**(custom if isinstance(custom, dict) else {}), RETAIN_PARAM: retain}
    return out


def retention_of(custom_params: Any) -> float:
    """Seconds of retention a scheduler-side request carries (0 when none)."""
    if not isinstance(custom_params, dict):
        return 0.0
    value = custom_params.get(RETAIN_PARAM)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 0.0
