"""The request guard (k3_sglang/serving/guards.py) on every shape SGLang accepts: a dict or a list of sampling params,
batched /generate, OpenAI `n` and `best_of`, batched completions, numbers as SGLang's models read them, PUT
/generate; and the ASGI middleware's refuse / replay. tests/e2e/test_openai_layer.py checks the counts against
SGLang's own normalisation over HTTP. Pure, under 1 s."""
from __future__ import annotations

import asyncio
import json

import pytest

from k3_sglang.serving.guards import RequestGuard, SampleLimits, check_request, prompt_count, sequence_count

LIMITS = SampleLimits(max_n=16, max_sequences=64)


def refused(path, body, limits=LIMITS):
    refusal = check_request(path, body, limits)
    return None if refusal is None else refusal[0]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"n": 100000}, "n"),
    ("/v1/chat/completions", {"n": 0}, "n"),
    ("/v1/completions", {"prompt": "x", "n": 17}, "n"),
    ("/v1/completions", {"prompt": "x", "best_of": 17}, "best_of"),
    ("/v1/completions", {"prompt": "x", "n": "3000"}, "n"),  # SGLang's pydantic reads "3000" as 3000
    ("/v1/completions", {"prompt": "x", "n": 3000.0}, "n"),
    ("/generate", {"text": "x", "sampling_params": {"n": 1000}}, "n"),
    ("/generate", {"text": ["a", "b"], "sampling_params": [{"n": 3000}, {"n": 3000}]}, "n"),  # the 57 s hole
    ("/generate", {"text": ["a", "b"], "sampling_params": [{"n": 1}, {"n": 17}]}, "n"),
    ("/generate", {"text": "x", "sampling_params": {"beam_width": 100}}, "beam_width"),
])
def test_per_prompt_samples_above_k3_max_n_are_refused(path, body, param):
    refusal = check_request(path, body, LIMITS)
    assert refusal is not None and refusal[1] == param
    assert "K3_MAX_N" in refusal[0] or "must be >= 1" in refusal[0]


@pytest.mark.parametrize("path,body,sequences", [
    ("/v1/chat/completions", {"messages": [], "n": 16}, 16),
    ("/v1/completions", {"prompt": "x"}, 1),
    ("/v1/completions", {"prompt": [1, 2, 3], "n": 4}, 4),  # one tokenized prompt
    ("/v1/completions", {"prompt": ["a", "b", "c"], "n": 4}, 12),
    ("/v1/completions", {"prompt": [[1, 2], [3]], "n": 2, "best_of": 5}, 10),
    ("/generate", {"text": "x"}, 1),
    ("/generate", {"text": ["a", "b"], "sampling_params": [{"n": 3}, {"n": 3}]}, 6),
    ("/generate", {"text": ["a"] * 4, "sampling_params": {"n": 16}}, 64),
    ("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"n": 2}}, 2),
    ("/generate", {"input_ids": [[1, 2], [3], [4]], "sampling_params": {"n": 2}}, 6),
    ("/generate", {"input_embeds": [[0.1, 0.2]], "sampling_params": {"n": 2}}, 2),
    ("/generate", {"input_embeds": [[[0.1]], [[0.2]]]}, 2),
])
def test_sequences_within_the_limits_pass_and_are_counted(path, body, sequences):
    assert sequence_count(path, body) == sequences
    assert refused(path, body) is None


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": ["a"] * 5, "sampling_params": {"n": 16}}),  # 80 sequences, each n allowed
    ("/generate", {"text": ["a"] * 65}),
    ("/generate", {"input_ids": [[1]] * 33, "sampling_params": [{"n": 2}] * 33}),
    ("/v1/completions", {"prompt": ["p"] * 9, "n": 8}),
    ("/v1/completions", {"prompt": [[1]] * 65}),
])
def test_total_sequences_of_one_request_are_bounded(path, body):
    message = refused(path, body)
    assert message is not None and "K3_MAX_SEQUENCES" in message
    assert f"would run {sequence_count(path, body)} sequences" in message


def test_values_sglang_rejects_itself_pass_through():
    for body in ({"n": "many"}, {"n": None}, {"n": True}, {"n": 2.5}, {"prompt": "x", "n": [3]}):
        assert refused("/v1/completions", body) is None
    assert refused("/v1/chat/completions", ["not", "an", "object"]) is None
    assert prompt_count("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}] * 5}) == 1


def _run_guard(method, path, body: bytes, limits=LIMITS):
    """(status, body) the middleware answers, and what the wrapped app received (None: not reached)."""
    reached, sent = {}, []

    async def app(scope, receive, send):
        message = await receive()
        reached["body"] = message["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    chunks = [body[:5], body[5:]]

    async def receive():
        part = chunks.pop(0)
        return {"type": "http.request", "body": part, "more_body": bool(chunks)}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path}
    asyncio.run(RequestGuard(app, limits)(scope, receive, send))
    return sent[0]["status"], sent[-1]["body"], reached.get("body")


def test_middleware_refuses_with_an_openai_error_and_replays_the_rest():
    hole = json.dumps({"text": ["a", "b"], "sampling_params": [{"n": 3000}, {"n": 3000}]}).encode()
    for method in ("POST", "PUT"):  # SGLang's /generate takes both
        status, body, reached = _run_guard(method, "/generate", hole)
        error = json.loads(body)["error"]
        assert status == 400 and reached is None
        assert error["type"] == "invalid_request_error" and error["param"] == "n" and "K3_MAX_N" in error["message"]
    fine = json.dumps({"text": ["a", "b"], "sampling_params": [{"n": 2}, {"n": 2}]}).encode()
    assert _run_guard("POST", "/generate", fine) == (200, b"ok", fine)  # the whole body, replayed once
    assert _run_guard("POST", "/health_generate", hole)[0] == 200  # unguarded path: untouched
    assert _run_guard("POST", "/v1/completions", b'{"prompt": [')[0] == 200  # malformed JSON: SGLang answers
