"""Request facts from an OpenAI / SGLang request body: explicit session key, prefix keys, size.

Identity, first match wins: header `X-Session-Id`, header `X-SMG-Routing-Key`, the OpenAI `user`
field; without one, the router looks the request's *prefix keys* up in its session index
(`session_index.py`, `RouterCore.identify`), so a multi-turn chat that resends its history keeps
one session with no client change, and two conversations behind one shared system prompt do not.
Prefix keys (shallow to deep), each naming a whole prefix of the request:
- chat: the text up to the end of each message (an earlier request of the same conversation ended
  at one of them), as block chain + exact tail;
- a text prompt or `input_ids`: the chained full-block hashes (the whole prompt when shorter).
Context length is counted from `input_ids` when given, else estimated as chars / chars_per_token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from k3_sglang.router.body_checks import BadRequest, check_body, check_messages
from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.prefix import text_block_hashes, text_prefix_key, token_block_hashes, token_prefix_key
from k3_sglang.router.retention import BadRetention, requested_retention

SESSION_HEADERS = ("x-session-id", "x-smg-routing-key")
MAX_SESSION_ID_CHARS = 256
__all__ = ["BadRequest", "RequestFacts", "SESSION_HEADERS", "explicit_session_id", "request_facts"]


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What routing needs from one request."""

    explicit_session: str | None
    session_source: str
    context_tokens: int
    growth_tokens: int
    prefix_hashes: tuple[int, ...]
    session_keys: tuple[int, ...]
    model: str | None
    stream: bool
    token_ids: list[int] | None = None  # the prompt's token ids, when the request carries them
    retain_s: float | None = None       # session retention asked for (clamped), router/retention.py


def message_text(content: Any) -> str:
    """Text of a chat message `content` (a string or a list of parts with `text`)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _chat_prefixes(messages: list, cfg: PolicyConfig) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(chars, prefix hashes, prefix keys) of a chat: one key where each message ends."""
    parts, boundaries, size, chars = [], [], 0, 0
    for m in messages:
        text = f"<{m['role']}>{message_text(m.get('content'))}\n"
        encoded = text.encode("utf-8", "surrogatepass")
        parts.append(encoded)
        size += len(encoded)
        chars += len(text)
        boundaries.append(size)
    data = b"".join(parts)
    block = cfg.block_chars
    hashes = text_block_hashes(data, block)
    return chars, tuple(hashes), tuple(text_prefix_key(data, hashes, end, block) for end in boundaries)


def _prompt_parts(body: Mapping[str, Any], path: str) -> tuple[str | None, list[int] | None]:
    """(text, token ids) of a completions or /generate prompt."""
    field = "text" if path == "/generate" else "prompt"
    prompt = body.get(field)
    ids = body.get("input_ids") if path == "/generate" else None
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        ids, prompt = prompt, None
    elif isinstance(prompt, list):
        prompt = prompt[0] if prompt and isinstance(prompt[0], str) else None
    if ids is not None and not (isinstance(ids, list) and all(isinstance(t, int) for t in ids[:8])):
        raise BadRequest("input_ids must be a list of integers")
    if prompt is not None and not isinstance(prompt, str):
        raise BadRequest(f"{field} must be a string or a list")
    if prompt is None and ids is None:
        raise BadRequest(f"missing {field}")
    return prompt, ids


def _growth(body: Mapping[str, Any], cfg: PolicyConfig) -> int:
    sampling = body.get("sampling_params") if isinstance(body.get("sampling_params"), dict) else {}
    for value in (body.get("max_completion_tokens"), body.get("max_tokens"), sampling.get("max_new_tokens")):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return cfg.expected_growth_tokens


def explicit_session_id(headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(session id, source) from headers or the `user` field, or None."""
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return value[:MAX_SESSION_ID_CHARS], name
    user = body.get("user")
    if isinstance(user, str) and user:
        return "user:" + user[:MAX_SESSION_ID_CHARS], "user"
    return None


def request_facts(path: str, headers: Mapping[str, str], body: Any, cfg: PolicyConfig) -> RequestFacts:
    """Check the body and extract explicit identity, prefix keys, context size and growth."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    check_body(path, body)
    ids = None
    if path.endswith("/chat/completions"):
        chars, hashes, keys = _chat_prefixes(check_messages(body.get("messages")), cfg)
        context = max(1, int(chars / cfg.chars_per_token))
    else:
        text, ids = _prompt_parts(body, path)
        if ids is not None:
            context = len(ids)
            hashes = tuple(token_block_hashes(ids, cfg.block_tokens))
            keys = hashes or (token_prefix_key(ids),)
        else:
            data = text.encode("utf-8", "surrogatepass")
            context = max(1, int(len(text) / cfg.chars_per_token))
            hashes = tuple(text_block_hashes(data, cfg.block_chars))
            keys = hashes or (text_prefix_key(data, hashes, len(data), cfg.block_chars),)
    explicit = explicit_session_id(headers, body)
    try:
        retain = requested_retention(headers, body, cfg.max_retain_s)
    except BadRetention as exc:
        raise BadRequest(str(exc)) from None
    model = body.get("model")
    return RequestFacts(
        explicit[0] if explicit else None, explicit[1] if explicit else "", context, _growth(body, cfg),
        hashes, keys, model if isinstance(model, str) else None, bool(body.get("stream")), ids, retain,
    )
