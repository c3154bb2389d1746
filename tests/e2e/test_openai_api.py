"""The official `openai` client against `k3 serve`, tool rendering, and bad input handling."""

from __future__ import annotations

import concurrent.futures

import httpx
import openai
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_completion_plain(client):
    resp = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hello"}], max_tokens=8)
    assert resp.choices[0].finish_reason in ("length", "stop")
    assert resp.usage.completion_tokens > 0


def test_chat_completion_streamed(client):
    stream = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=8, stream=True)
    chunks = list(stream)
    assert len(chunks) >= 2
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_completions(client):
    resp = client.completions.create(model="default", prompt="The quick brown fox", max_tokens=8, temperature=0)
    assert resp.usage.completion_tokens == 8
    assert isinstance(resp.choices[0].text, str)


def test_chat_with_tools_is_accepted(client):
    resp = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                          tools=[WEATHER_TOOL], max_tokens=8)
    assert resp.usage.prompt_tokens > 40  # the tool declaration was rendered into the prompt


BAD_REQUESTS = {
    "malformed-json": ("/v1/chat/completions", b'{"model": "default", "messages": [', {}),
    "wrong-type-messages": ("/v1/chat/completions", None, {"model": "default", "messages": "hello"}),
    "negative-max-tokens": ("/v1/chat/completions", None, {"model": "default", "messages": [{"role": "user", "content": "x"}], "max_tokens": -5}),
    "huge-n": ("/v1/chat/completions", None, {"model": "default", "messages": [{"role": "user", "content": "x"}], "n": 100000}),
    "malformed-tools": ("/v1/chat/completions", None, {"model": "default", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
    "prompt-over-context": ("/v1/completions", None, {"model": "default", "prompt": "word " * 6000, "max_tokens": 4}),
    "completion-huge-n": ("/v1/completions", None, {"model": "default", "prompt": "x", "n": 1000}),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_input_gets_4xx_with_error_body_and_server_keeps_serving(server, client, case):
    path, raw, body = BAD_REQUESTS[case]
    if raw is not None:
        resp = httpx.post(server.url + path, content=raw, headers={"Content-Type": "application/json"}, timeout=60)
    else:
        resp = httpx.post(server.url + path, json=body, timeout=60)
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text[:300])
    payload = resp.json()
    message = payload.get("error", {}).get("message") if isinstance(payload.get("error"), dict) else payload.get("message")
    assert message, payload
    ok = client.completions.create(model="default", prompt="still alive?", max_tokens=2)
    assert ok.usage.completion_tokens == 2


def test_huge_n_does_not_block_other_requests(server, client):
    def huge():
        return httpx.post(server.url + "/v1/chat/completions", timeout=60,
                          json={"model": "default", "messages": [{"role": "user", "content": "x"}], "n": 100000}).status_code

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        bad = pool.submit(huge)
        good = pool.submit(lambda: client.completions.create(model="default", prompt="hi", max_tokens=4))
        assert bad.result(timeout=60) == 400
        assert good.result(timeout=60).usage.completion_tokens == 4
