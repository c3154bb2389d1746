"""SGLang's OpenAI serving layer with K3's `kimi_k3` reasoning and tool-call parsers on fixed XTML generations, parsed
by the official `openai` client; and the request guard against SGLang's own request normalisation.

The tiny K3 has random weights, so it never writes XTML channels; here SGLang's real app and serving classes run on
the `k3 serve` configuration with a scripted engine in place of the tokenizer manager (tests/utils/scripted_engine.py:
fixed token sequences, stop strings and detokenisation emulated). One server process, about 40 s in all.
"""
from __future__ import annotations

import json
import sys

import httpx
import openai
import pytest

from k3_sglang.serving.guards import sequence_count
from k3_sglang.serving.process import K3ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def think(text):
    return f"<|open|>think<|sep|>{text}<|close|>think<|sep|>"


def response(text):
    return f"<|open|>response<|sep|>{text}<|close|>response<|sep|>"


def call(index, name, args):
    parts = "".join(f'<|open|>argument key="{k}" type="{kind}"<|sep|>{v}<|close|>argument<|sep|>'
                    for k, (kind, v) in args.items())
    return f'<|open|>call tool="{name}" index="{index}"<|sep|>{parts}<|close|>call<|sep|>'


def tools(*calls):
    return "<|open|>tools<|sep|>" + "".join(calls) + "<|close|>tools<|sep|>"


OUTPUTS = {
    "plain": response("Hello there.") + "<|close|>message<|sep|>",
    "reasoning": think("Two plus two is four.") + response("4") + "<|close|>message<|sep|>",
    "tool_call": think("Paris is in France; ask the weather tool.") + response("Let me check.")
    + tools(call(1, "get_weather", {"city": ("string", "Paris"), "unit": ("string", "celsius")}))
    + "<|close|>message<|sep|>",
    "two_calls": think("Two cities.") + tools(
        call(1, "get_weather", {"city": ("string", "Paris"), "days": ("integer", "3")}),
        call(2, "get_weather", {"city": ("string", "Tokyo"), "options": ("object", '{"unit": "F"}')})),
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"},
                                         "days": {"type": "integer"}, "options": {"type": "object"}},
        "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


class ScriptedServer(K3ServerProcess):
    def __init__(self, model_path, outputs_file, log_path, env):
        super().__init__([], log_path, env=env)
        self.model_path, self.outputs_file = model_path, outputs_file

    def command(self):
        return [sys.executable, "-m", "tests.utils.scripted_engine", "--port", str(self.port),
                "--model-path", str(self.model_path), "--outputs", str(self.outputs_file)]

    def healthy(self):
        try:
            return httpx.get(self.url + "/k3_test/requests", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def engine_requests(self):
        return httpx.get(self.url + "/k3_test/requests", timeout=10).json()


@pytest.fixture(scope="module")
def scripted(tiny_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("scripted")
    (folder / "outputs.json").write_text(json.dumps(OUTPUTS))
    server = ScriptedServer(tiny_dir, folder / "outputs.json", folder / "server.log",
                            env={"K3_MAX_N": "16", "K3_MAX_SEQUENCES": "64"})
    server.start(timeout_s=300)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(scripted):
    return openai.OpenAI(base_url=scripted.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _chat(client, output, **kwargs):
    return client.chat.completions.create(model="default", messages=ASK, extra_headers={"X-K3-Output": output},
                                          **kwargs)


def test_tool_call_and_reasoning_are_parsed(client, scripted):
    resp = _chat(client, "tool_call", tools=[WEATHER])
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    assert choice.message.model_extra["reasoning_content"] == "Paris is in France; ask the weather tool."
    (tool_call,) = choice.message.tool_calls
    assert tool_call.type == "function" and tool_call.function.name == "get_weather"
    assert json.loads(tool_call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    prompt = scripted.engine_requests()[-1]["prompt"]
    assert "get_weather" in prompt and "Weather in Paris?" in prompt  # the tool was rendered for the model


def test_streamed_tool_call_and_reasoning_are_parsed(client):
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in _chat(client, "tool_call", tools=[WEATHER], stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
        for part in delta.tool_calls or []:
            entry = calls.setdefault(part.index, {"name": "", "arguments": ""})
            entry["name"] += (part.function and part.function.name) or ""
            entry["arguments"] += (part.function and part.function.arguments) or ""
        finish = chunk.choices[0].finish_reason or finish
    assert reasoning == "Paris is in France; ask the weather tool."
    assert content.strip() == "Let me check."
    assert list(calls) == [0] and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    assert finish == "tool_calls"


def test_parallel_calls_with_typed_arguments(client):
    message = _chat(client, "two_calls", tools=[WEATHER]).choices[0].message
    assert [c.function.name for c in message.tool_calls] == ["get_weather", "get_weather"]
    assert [json.loads(c.function.arguments) for c in message.tool_calls] == [
        {"city": "Paris", "days": 3}, {"city": "Tokyo", "options": {"unit": "F"}}]
    assert message.model_extra["reasoning_content"] == "Two cities."
    assert not message.content


def test_reasoning_without_tools(client):
    choice = _chat(client, "reasoning").choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == "4"
    assert choice.message.model_extra["reasoning_content"] == "Two plus two is four."


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"model": "default", "messages": ASK, "n": 4, "max_tokens": 2}),
    ("/v1/completions", {"model": "default", "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 2}),
    ("/v1/completions", {"model": "default", "prompt": [[5, 6], [7, 8]], "n": "3", "max_tokens": 2}),
    ("/generate", {"text": ["a", "b"], "sampling_params": [{"n": 3, "max_new_tokens": 2}] * 2}),
    ("/generate", {"input_ids": [[5, 6], [7], [8]], "sampling_params": {"n": 2, "max_new_tokens": 2}}),
    ("/generate", {"text": "a", "sampling_params": {"n": 16, "max_new_tokens": 2}}),
])
def test_guard_counts_what_sglang_runs(scripted, path, body):
    resp = httpx.post(scripted.url + path, json=body, timeout=60)
    assert resp.status_code == 200, resp.text[:500]
    assert scripted.engine_requests()[-1]["sequences"] == sequence_count(path, body)


@pytest.mark.parametrize("method,path,body", [
    ("POST", "/generate", {"text": ["a", "b"], "sampling_params": [{"n": 3000}, {"n": 3000}]}),
    ("PUT", "/generate", {"text": "a", "sampling_params": {"n": 17}}),
    ("POST", "/generate", {"text": ["a"] * 5, "sampling_params": {"n": 16}}),
    ("POST", "/v1/completions", {"model": "default", "prompt": "x", "n": "3000"}),
    ("POST", "/v1/completions", {"model": "default", "prompt": "x", "best_of": 17}),
    ("POST", "/v1/completions", {"model": "default", "prompt": ["p"] * 33, "n": 2}),
    ("POST", "/v1/chat/completions", {"model": "default", "messages": ASK, "n": 17}),
])
def test_guard_refuses_before_the_engine_and_the_server_keeps_serving(scripted, client, method, path, body):
    before = len(scripted.engine_requests())
    resp = httpx.request(method, scripted.url + path, json=body, timeout=60)
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert len(scripted.engine_requests()) == before
    assert _chat(client, "plain").choices[0].message.content == "Hello there."
