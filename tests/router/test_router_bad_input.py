"""Bad input gets a 4xx with an OpenAI-style error body, and the router stays up."""

from __future__ import annotations

import httpx
import orjson
import pytest

pytestmark = pytest.mark.timeout(60)
CHAT = "/v1/chat/completions"
GOOD = {"model": "mock-k3", "messages": [{"role": "user", "content": "hi"}]}


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and error["type"]


@pytest.fixture
def http(make_fleet):
    fleet = make_fleet(1, admin_key="adm", max_body_bytes=64 * 1024)
    with httpx.Client(base_url=fleet.router.url, timeout=10) as client:
        yield client
        assert client.get("/health").status_code == 200
        assert client.post(CHAT, json=GOOD).status_code == 200  # still serving after all of it


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "invalid_json"),
        (b"[1, 2]", "invalid_request"),
        (b'{"model": "mock-k3"}', "invalid_request"),
        (b'{"model": "mock-k3", "messages": "hi"}', "invalid_request"),
        (b'{"model": "mock-k3", "messages": [1]}', "invalid_request"),
    ],
)
def test_malformed_bodies_are_400(http, body, code):
    assert_error(http.post(CHAT, content=body, headers={"content-type": "application/json"}), 400, code)


def test_bad_prompt_types_are_400(http):
    assert_error(http.post("/v1/completions", json={"model": "mock-k3", "prompt": 5}), 400, "invalid_request")
    assert_error(http.post("/generate", json={"input_ids": ["a", "b"]}), 400, "invalid_request")


def test_oversize_body_is_413(http):
    big = {"model": "mock-k3", "messages": [{"role": "user", "content": "x" * 100_000}]}
    assert_error(http.post(CHAT, json=big), 413, "body_too_large")


@pytest.mark.parametrize("model", ["default", "gpt-other", "mock-k3:adapter"])
def test_router_accepts_the_model_names_its_workers_accept(make_fleet, model):
    """SGLang answers whatever `model` it is sent (README's example uses "default"): the router forwards it as is."""
    fleet = make_fleet(1)
    with httpx.Client(base_url=fleet.router.url, timeout=10) as client:
        response = client.post(CHAT, json={**GOOD, "model": model})
        assert response.status_code == 200, response.text
        assert client.get("/v1/models").json()["data"][0]["id"] == "mock-k3"  # the list is still the workers'
    assert orjson.loads(fleet.states[0].last_body)["model"] == model


def test_admin_key_checks(http):
    assert_error(http.get("/workers"), 401, "invalid_admin_key")
    assert_error(http.get("/workers", headers={"X-Admin-Key": "wrong"}), 401, "invalid_admin_key")
    assert http.get("/workers", headers={"Authorization": "Bearer adm"}).status_code == 200


def test_unknown_or_bad_worker_url(http):
    auth = {"X-Admin-Key": "adm"}
    assert_error(http.delete("/workers", params={"url": "http://127.0.0.1:1"}, headers=auth), 404, "worker_not_found")
    assert_error(http.delete("/workers", params={"url": "ftp://x/y"}, headers=auth), 400, "invalid_worker_url")
    assert_error(http.post("/workers", json={"url": "http://127.0.0.1:2", "kv_tokens": -1}, headers=auth),
                 400, "invalid_worker")
    assert_error(http.post("/workers", json={"nope": 1}, headers=auth), 400, "invalid_worker")
    assert_error(http.post("/workers", content=b"{", headers=auth), 400, "invalid_json")
    assert_error(http.get("/sessions/none", headers=auth), 404, "session_not_found")


def test_unknown_route_and_method(http):
    assert_error(http.get("/v1/nothing"), 404, "not_found")
    assert_error(http.post("/v1/nothing", json=GOOD), 404, "not_found")
    r = http.get(CHAT)
    assert_error(r, 405, "method_not_allowed")
    assert "POST" in r.headers["allow"]


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        (CHAT, {"messages": [{"role": "user", "content": "hi"}]}, "missing field `model`"),
        (CHAT, {**GOOD, "model": ""}, "missing field `model`"),
        ("/v1/completions", {"prompt": "hi"}, "missing field `model`"),
        (CHAT, {**GOOD, "max_tokens": -5}, "max_tokens must be a non-negative integer"),
        (CHAT, {**GOOD, "max_tokens": 2.5}, "max_tokens must be a non-negative integer"),
        (CHAT, {**GOOD, "max_completion_tokens": "8"}, "max_completion_tokens"),
        ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ("/generate", {"text": "a", "sampling_params": [1]}, "sampling_params must be an object"),
        (CHAT, {**GOOD, "stream": "yes"}, "stream must be a boolean"),
        (CHAT, {**GOOD, "n": 0}, "n must be an integer >= 1"),
        (CHAT, {**GOOD, "temperature": -1}, "temperature"),
        (CHAT, {**GOOD, "top_p": 0}, "top_p"),
        (CHAT, {**GOOD, "messages": [{"content": "no role"}]}, "messages[0].role"),
        (CHAT, {**GOOD, "messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
        ("/generate", {"sampling_params": {}}, "missing text"),
    ],
)
def test_fields_sglang_would_reject_are_400_before_placement(make_fleet, path, body, fragment):
    fleet = make_fleet(1)
    with httpx.Client(base_url=fleet.router.url, timeout=10) as client:
        r = client.post(path, json=body)
        assert_error(r, 400, "invalid_request")
        assert fragment in r.json()["error"]["message"]
        assert client.post(CHAT, json=GOOD).status_code == 200
    assert fleet.states[0].requests == 1  # only the good request reached the worker
    assert not fleet.core.fleet.sessions or len(fleet.core.fleet.sessions) == 1


def test_content_type_must_be_json(http):
    assert_error(http.post(CHAT, content=b'{"model": "mock-k3"}', headers={"content-type": "text/plain"}),
                 415, "unsupported_media_type")
    assert_error(http.post(CHAT, content=b"model=x", headers={"content-type": "application/x-www-form-urlencoded"}),
                 415, "unsupported_media_type")
    body = b'{"model": "mock-k3", "messages": [{"role": "user", "content": "hi"}]}'
    for ctype in ("application/json; charset=utf-8", "application/vnd.api+json"):
        assert http.post(CHAT, content=body, headers={"content-type": ctype}).status_code == 200


def test_admin_api_disabled_without_key_and_api_key_enforced(make_fleet):
    fleet = make_fleet(1, api_key="client-key")
    with httpx.Client(base_url=fleet.router.url, timeout=10) as client:
        assert_error(client.get("/workers"), 403, "admin_disabled")
        assert_error(client.post(CHAT, json=GOOD), 401, "invalid_api_key")
        assert_error(client.get("/v1/models"), 401, "invalid_api_key")
        ok = client.post(CHAT, json=GOOD, headers={"Authorization": "Bearer client-key"})
        assert ok.status_code == 200
