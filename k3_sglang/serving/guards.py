"""Request guards in front of SGLang's OpenAI and native endpoints (pure ASGI middleware).

SGLang 0.5.23 accepts a chat request with n=100000 and then blocks every other request for
minutes; this middleware rejects such requests before they reach the tokenizer manager, with
an OpenAI-style 400 body. It also writes the session fields into the body (`session_fields.py`: the
`X-Session-Id` as SGLang's `session_id`, a retention into `custom_params`) and refuses a bad retention with a
400 naming the header or field. Everything else passes through untouched (bodies are re-played).
"""

from __future__ import annotations

import json

import orjson

from k3_sglang.router.retention import BadRetention
from k3_sglang.serving.session_fields import session_fields

GUARDED_PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")


def openai_error(message: str, param: str | None, code: int = 400) -> bytes:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}
    return json.dumps(body).encode()


def check_request(path: str, body: object, max_n: int) -> tuple[str, str] | None:
    """Return (message, param) for a request we refuse, or None to let SGLang handle it."""
    if not isinstance(body, dict):
        return None  # SGLang's own validation answers these (422/400)
    fields = [body]
    if path == "/generate" and isinstance(body.get("sampling_params"), dict):
        fields.append(body["sampling_params"])
    for where in fields:
        n = where.get("n")
        if n is None or isinstance(n, bool) or not isinstance(n, int):
            continue
        if n > max_n:
            return f"n={n} exceeds this server's maximum of {max_n} (K3_MAX_N)", "n"
        if n < 1:
            return f"n must be >= 1, got {n}", "n"
    return None


class RequestGuard:
    """ASGI middleware: buffer POST bodies on guarded paths, refuse bad ones, replay the rest."""

    def __init__(self, app, max_n: int, max_retain_s: float = 3600.0):
        self.app = app
        self.max_n = max_n
        self.max_retain_s = max_retain_s

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("method") != "POST" or scope.get("path") not in GUARDED_PATHS:
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        try:
            body = json.loads(raw) if raw else None
        except (ValueError, UnicodeDecodeError):
            body = None  # malformed JSON: SGLang's handler answers it
        refusal = check_request(scope["path"], body, self.max_n)
        if refusal is not None:
            await _send_json(send, 400, openai_error(*refusal))
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", ())}
        try:
            rewritten = session_fields(scope["path"], body, headers, self.max_retain_s)
        except BadRetention as exc:
            await _send_json(send, 400, openai_error(str(exc), exc.param))
            return
        if rewritten is not None:
            raw = orjson.dumps(rewritten)
            scope = {**scope, "headers": [(k, v) for k, v in scope.get("headers", ()) if k.lower() != b"content-length"]
                     + [(b"content-length", str(len(raw)).encode())]}
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _send_json(send, status: int, payload: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
