"""Session identity and request facts from an OpenAI / SGLang request body.

Identity, first match wins: header `X-Session-Id`, header `X-SMG-Routing-Key`, the OpenAI `user`
field, else `auto-<hash>` of the conversation's opening (system prompt(s) + first user message for
chat; the first `opening_chars` of the prompt or the first block of `input_ids` otherwise), so a
multi-turn chat that resends its history keeps one key with no client change.
Context length is counted from `input_ids` when given, else estimated as chars / chars_per_token.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.prefix import text_block_hashes, token_block_hashes

SESSION_HEADERS = ("x-session-id", "x-smg-routing-key")
MAX_SESSION_ID_CHARS = 256


class BadRequest(ValueError):
    """The request body cannot be routed; the message is shown to the client."""


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What routing needs from one request."""

    session_id: str
    session_source: str
    context_tokens: int
    growth_tokens: int
    prefix_hashes: tuple[int, ...]
    model: str | None
    stream: bool


def message_text(content: Any) -> str:
    """Text of a chat message `content` (a string or a list of parts with `text`)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _chat_text(messages: list) -> tuple[str, str]:
    """(full conversation text, opening text) of a chat `messages` list."""
    parts, opening = [], []
    first_user_seen = False
    for m in messages:
        if not isinstance(m, dict):
            raise BadRequest("each message must be an object")
        role = str(m.get("role", ""))
        text = f"<{role}>{message_text(m.get('content'))}\n"
        parts.append(text)
        if not first_user_seen and role in ("system", "developer", "user"):
            opening.append(text)
            first_user_seen = role == "user"
    return "".join(parts), "".join(opening)


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
        raise BadRequest(f"missing {'messages' if path.endswith('chat/completions') else field}")
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


def opening_key(opening: str) -> str:
    """Stable session key of a conversation's opening text."""
    return "auto-" + hashlib.blake2b(opening.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def request_facts(path: str, headers: Mapping[str, str], body: Any, cfg: PolicyConfig) -> RequestFacts:
    """Extract session identity, context size, growth and prefix hashes from a parsed body."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        text, opening = _chat_text(messages)
        ids = None
    else:
        text, ids = _prompt_parts(body, path)
        opening = (text or "")[: cfg.opening_chars]
    if ids is not None:
        context = len(ids)
        hashes = token_block_hashes(ids, cfg.block_tokens)
        opening = opening or ",".join(map(str, ids[: cfg.block_tokens]))
    else:
        context = max(1, int(len(text) / cfg.chars_per_token))
        hashes = text_block_hashes(text, cfg.block_chars)
    explicit = explicit_session_id(headers, body)
    session_id, source = explicit if explicit else (opening_key(opening), "opening")
    model = body.get("model")
    return RequestFacts(
        session_id, source, context, _growth(body, cfg), tuple(hashes),
        model if isinstance(model, str) else None, bool(body.get("stream")),
    )
