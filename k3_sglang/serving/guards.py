"""Request guards in front of SGLang's OpenAI and native endpoints (pure ASGI middleware).

SGLang 0.5.23 accepts a chat request with n=100000, or a `/generate` batch whose sampling params each ask for
n=3000, and then serves nothing else for minutes; this middleware refuses such requests before they reach the
tokenizer manager, with an OpenAI-style 400 body. Everything else passes through untouched (bodies are re-played).

What one request starts, in every shape SGLang accepts:
- samples per prompt: `n` and `best_of` (OpenAI; SGLang ignores best_of today, the bound holds if it ever honours
  it), and in `/generate` sampling params `n` and `beam_width`, whether `sampling_params` is a dict or a list of
  dicts (one per prompt); each at most K3_MAX_N, at least 1;
- prompts: a batched `/generate` (`text` list, `input_ids` list of lists, `input_embeds` batch) or a batched
  `/v1/completions` (`prompt` list of strings or of token lists); chat is one prompt;
- sequences = prompts x samples per prompt: at most K3_MAX_SEQUENCES.
Numbers are read as SGLang's pydantic models read them (3000.0 and "3000" count as 3000); a value that is not a
number is left to SGLang's own validation.
The middleware also writes the session fields into the body (`session_fields.py`: the `X-Session-Id` as SGLang's
`session_id`, a retention into `custom_params`) and refuses a bad retention with a 400 naming the header or field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import orjson

from k3_sglang.router.retention import BadRetention
from k3_sglang.serving.session_fields import session_fields

GUARDED_PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")
GUARDED_METHODS = ("POST", "PUT")  # SGLang's /generate takes both
SAMPLE_FIELDS = ("n", "best_of", "beam_width")


@dataclass(frozen=True)
class SampleLimits:
    """max_n: samples one prompt may ask for (K3_MAX_N); max_sequences: prompts x samples of one request."""

    max_n: int = 16
    max_sequences: int = 256


def openai_error(message: str, param: str | None, code: int = 400) -> bytes:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}
    return json.dumps(body).encode()


def _as_count(value: object) -> int | None:
    """An integer as SGLang's models would read it (int, integral float, integer string), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _generate_prompts(body: dict) -> int:
    """SGLang's batch size of a /generate body (GenerateReqInput._determine_batch_size)."""
    text, ids, embeds = body.get("text"), body.get("input_ids"), body.get("input_embeds")
    if text is not None:
        return 1 if isinstance(text, str) else len(text) if isinstance(text, list) else 1
    if isinstance(ids, list):
        return len(ids) if ids and isinstance(ids[0], list) else 1
    if isinstance(embeds, list):  # one prompt is [tokens][hidden] floats, a batch one more list deep
        return len(embeds) if embeds and isinstance(embeds[0], list) and embeds[0] and \
            isinstance(embeds[0][0], list) else 1
    return 1


def prompt_count(path: str, body: dict) -> int:
    """How many prompts one request body carries (SGLang's batch size); chat is always one."""
    if path == "/generate":
        return _generate_prompts(body)
    if path == "/v1/completions":
        prompt = body.get("prompt")  # str, [int] (one prompt), [str] or [[int]] (a batch)
        return len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    return 1


def _sample_sources(path: str, body: dict) -> list[dict]:
    """The dicts that may carry sample counts: the body, and /generate's sampling params (a dict or a list)."""
    if path != "/generate":
        return [body]
    params = body.get("sampling_params")
    params = params if isinstance(params, list) else [params]
    return [body] + [p for p in params if isinstance(p, dict)]


def _samples_per_prompt(path: str, body: dict, limits: SampleLimits) -> int | tuple[str, str]:
    """The largest sample count the body asks for (1 if none), or (message, param) when one is out of bounds."""
    samples = 1
    for where in _sample_sources(path, body):
        for field in SAMPLE_FIELDS:
            count = _as_count(where.get(field))
            if count is None:
                continue
            if count < 1:
                return f"{field} must be >= 1, got {count}", field
            if count > limits.max_n:
                return f"{field}={count} exceeds this server's maximum of {limits.max_n} (K3_MAX_N)", field
            samples = max(samples, count)
    return samples


def sequence_count(path: str, body: dict) -> int:
    """Sequences one (valid) request body starts: prompts x samples per prompt."""
    samples = _samples_per_prompt(path, body, SampleLimits(max_n=2**62))
    return prompt_count(path, body) * (samples if isinstance(samples, int) else 1)


def check_request(path: str, body: object, limits: SampleLimits) -> tuple[str, str] | None:
    """Return (message, param) for a request we refuse, or None to let SGLang handle it."""
    if not isinstance(body, dict):
        return None  # SGLang's own validation answers these (422/400)
    samples = _samples_per_prompt(path, body, limits)
    if not isinstance(samples, int):
        return samples
    prompts = prompt_count(path, body)
    if prompts * samples > limits.max_sequences:
        return (f"this request would run {prompts * samples} sequences ({prompts} prompts x {samples} samples), "
                f"more than this server's maximum of {limits.max_sequences} (K3_MAX_SEQUENCES)",
                "n" if samples > 1 else "prompt")
    return None


class RequestGuard:
    """ASGI middleware: buffer POST/PUT bodies on guarded paths, refuse bad ones, replay the rest."""

    def __init__(self, app, limits: SampleLimits, max_retain_s: float = 3600.0):
        self.app = app
        self.limits = limits
        self.max_retain_s = max_retain_s

    async def __call__(self, scope, receive, send):
        if (scope.get("type") != "http" or scope.get("method") not in GUARDED_METHODS
                or scope.get("path") not in GUARDED_PATHS):
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
        refusal = check_request(scope["path"], body, self.limits)
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
