"""Request-body checks the router makes before it places anything (the HTTP layer answers 400).

They cover what a typed OpenAI gateway (SMG) rejects and SGLang would reject later at the cost of
a placement: a missing `model` on the OpenAI paths, token limits that are negative or not
integers, a `stream` that is not a boolean, `n` < 1, `temperature` < 0, `top_p` outside (0, 1],
and chat messages without a string `role` or with a `content` that is neither text, parts nor null.
Fields the router does not know are left alone: the body is forwarded byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions")
TOKEN_LIMITS = ("max_tokens", "max_completion_tokens")


class BadRequest(ValueError):
    """The request body cannot be routed; the message is shown to the client."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_token_limit(name: str, value: Any) -> None:
    if value is not None and not (_is_int(value) and value >= 0):
        raise BadRequest(f"{name} must be a non-negative integer, got {value!r}")


def check_messages(messages: Any) -> list:
    """The chat `messages` list, or BadRequest."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest("each message must be an object")
        if not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}].role must be a string")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRequest(f"messages[{i}].content must be a string, a list of parts or null")
    return messages


def check_body(path: str, body: Mapping[str, Any]) -> None:
    """Raise BadRequest if the body has a field SGLang would reject (model, limits, sampling)."""
    if path in OPENAI_PATHS:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("missing field `model` (a non-empty string)")
    for name in TOKEN_LIMITS:
        _check_token_limit(name, body.get(name))
    sampling = body.get("sampling_params")
    if sampling is not None:
        if not isinstance(sampling, dict):
            raise BadRequest("sampling_params must be an object")
        _check_token_limit("sampling_params.max_new_tokens", sampling.get("max_new_tokens"))
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest(f"stream must be a boolean, got {stream!r}")
    n = body.get("n")
    if n is not None and not (_is_int(n) and n >= 1):
        raise BadRequest(f"n must be an integer >= 1, got {n!r}")
    temperature = body.get("temperature")
    if temperature is not None and not (_is_number(temperature) and temperature >= 0):
        raise BadRequest(f"temperature must be a number >= 0, got {temperature!r}")
    top_p = body.get("top_p")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise BadRequest(f"top_p must be a number in (0, 1], got {top_p!r}")
