"""End-to-end on loopback: the router in front of mock SGLang workers, with injected faults."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from k3_sglang.router.config import PolicyConfig

pytestmark = pytest.mark.timeout(60)
MODEL = "mock-k3"


def client_for(fleet, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.router.url + "/v1", api_key="unused", max_retries=0, timeout=15, **kwargs)


def chat_turn(client, messages, **kwargs):
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, **kwargs)
    return raw.headers["x-k3-worker"], raw.parse().choices[0].message.content


def ledger_is_zero(fleet) -> bool:
    fleet.wait_idle()
    return all(w.inflight_requests == 0 and w.inflight_prefill_tokens == 0 and w.active_tokens == 0
               for w in fleet.core.fleet.workers.values())


def test_openai_client_multi_turn_session_stays_on_one_worker(make_fleet):
    fleet = make_fleet(2)
    client = client_for(fleet)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello"}]
    homes = set()
    for i in range(4):
        worker, content = chat_turn(client, messages)
        homes.add(worker)
        assert content.startswith(f"w{fleet.worker_index(worker)}-t0")
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"turn {i}"}]
    assert len(homes) == 1
    stream = client.chat.completions.create(model=MODEL, messages=messages, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    index = fleet.worker_index(homes.pop())
    assert text == "".join(f"w{index}-t{i} " for i in range(8))
    assert len(fleet.core.fleet.sessions) == 1 and fleet.core.moves == 0
    assert ledger_is_zero(fleet)


def test_completions_and_generate_pass_through_streaming(make_fleet):
    fleet = make_fleet(2)
    client = client_for(fleet)
    text = client.completions.create(model=MODEL, prompt="once upon a time", max_tokens=3).choices[0].text
    assert text.endswith("-t2 ")
    chunks = list(client.completions.create(model=MODEL, prompt="once upon a time", max_tokens=3, stream=True))
    assert "".join(c.choices[0].text for c in chunks).endswith("-t2 ")
    with httpx.Client(timeout=10) as http:
        body = http.post(fleet.router.url + "/generate", json={"text": "abc", "sampling_params": {"max_new_tokens": 2}})
        assert body.status_code == 200 and body.json()["meta_info"]["completion_tokens"] == 2
        with http.stream("POST", fleet.router.url + "/generate", json={"input_ids": [1, 2, 3], "stream": True}) as r:
            events = [line for line in r.iter_lines() if line.startswith("data:")]
        assert events[-1] == "data: [DONE]" and len(events) == 9
    assert ledger_is_zero(fleet)


def test_body_reaches_the_worker_byte_for_byte(make_fleet):
    fleet = make_fleet(1)
    raw = ('{ "separate_reasoning":true,"messages":[{"content":"h\u00e9llo \u2603","role":"user"}],\n'
           ' "model" : "mock-k3", "custom_field_xyz": [1, 2.50, null], "top_k": 3, "chat_template_kwargs": {}}').encode()
    r = httpx.post(fleet.router.url + "/v1/chat/completions", content=raw,
                   headers={"content-type": "application/json", "x-request-id": "req-1"}, timeout=10)
    assert r.status_code == 200
    assert fleet.states[0].last_body == raw


def test_conversations_sharing_a_long_system_prompt_are_separate_sessions(make_fleet):
    fleet = make_fleet(2)
    client = client_for(fleet)
    system = {"role": "system", "content": "You are a careful agent. " * 400}  # ~10,000 characters
    histories = [[system, {"role": "user", "content": f"task {i}"}] for i in range(4)]
    first_ids = []
    for messages in histories:
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
        first_ids.append(raw.headers["x-k3-session-id"])
        messages += [{"role": "assistant", "content": raw.parse().choices[0].message.content},
                     {"role": "user", "content": "next"}]
    assert len(set(first_ids)) == 4
    for messages, sid in zip(histories, first_ids):
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
        assert raw.headers["x-k3-session-id"] == sid
    assert len(fleet.core.fleet.sessions) == 4
    assert 'k3_router_session_identity_total{source="prefix"} 4.0' in httpx.get(fleet.router.url + "/metrics").text


def test_explicit_session_headers_and_user_field(make_fleet):
    fleet = make_fleet(2)
    with httpx.Client(timeout=10) as http:
        for header in ("X-Session-Id", "X-SMG-Routing-Key"):
            r = http.post(fleet.router.url + "/v1/chat/completions", headers={header: "agent-7"},
                          json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
            assert r.headers["x-k3-session-id"] == "agent-7"
        r = http.post(fleet.router.url + "/v1/chat/completions",
                      json={"model": MODEL, "user": "bob", "messages": [{"role": "user", "content": "x"}]})
        assert r.headers["x-k3-session-id"] == "user:bob"


def test_500s_are_retried_before_first_byte_without_duplicates(make_fleet):
    fleet = make_fleet(2)
    client = client_for(fleet)
    messages = [{"role": "user", "content": "retry me"}]
    home, _ = chat_turn(client, messages)
    fleet.set_fault(fleet.worker_index(home), mode="error", count=-1)
    stream = client.chat.completions.create(model=MODEL, messages=messages, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    other = 1 - fleet.worker_index(home)
    assert text == "".join(f"w{other}-t{i} " for i in range(8))  # one answer, from the other worker
    assert fleet.core.moves == 1
    assert ledger_is_zero(fleet)


def test_connection_refused_moves_the_session(make_fleet):
    fleet = make_fleet(2)
    client = client_for(fleet)
    messages = [{"role": "user", "content": "who serves me"}]
    home, _ = chat_turn(client, messages)
    fleet.workers[fleet.worker_index(home)].stop()
    started = time.monotonic()
    worker, content = chat_turn(client, messages + [{"role": "user", "content": "again"}])
    assert worker != home and time.monotonic() - started < 5
    (record,) = fleet.core.fleet.sessions.values()
    assert record.moves == 1 and record.worker_id == worker
    assert ledger_is_zero(fleet)


def test_slow_worker_times_out_and_the_client_does_not_hang(make_fleet):
    fleet = make_fleet(2)  # read timeout 2 s in FAST_RELIABILITY
    client = client_for(fleet)
    messages = [{"role": "user", "content": "slow"}]
    home, _ = chat_turn(client, messages)
    fleet.set_fault(fleet.worker_index(home), mode="slow", delay_s=4.0, count=1)
    started = time.monotonic()
    worker, _ = chat_turn(client, messages)
    assert worker != home and time.monotonic() - started < 3.9
    assert ledger_is_zero(fleet)


def test_worker_dying_mid_stream_ends_cleanly_and_is_not_retried(make_fleet):
    fleet = make_fleet(2)
    client = client_for(fleet)
    messages = [{"role": "user", "content": "die"}]
    home, _ = chat_turn(client, messages)
    index = fleet.worker_index(home)
    fleet.set_fault(index, mode="die_mid_stream", chunks_before_death=3, count=1)
    before = [s.requests for s in fleet.states]
    received = []
    with pytest.raises(openai.APIError):
        for chunk in client.chat.completions.create(model=MODEL, messages=messages, stream=True):
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == f"w{index}-t0 w{index}-t1 "  # partial answer, never a second one
    assert [s.requests for s in fleet.states] == [b + (i == index) for i, b in enumerate(before)]
    assert ledger_is_zero(fleet)
    assert httpx.get(fleet.router.url + "/health", timeout=5).status_code == 200


def test_client_cancelling_a_stream_closes_the_ledger(make_fleet):
    fleet = make_fleet(1)
    fleet.states[0].token_delay_s = 0.3
    with httpx.Client(timeout=10) as http:
        with http.stream("POST", fleet.router.url + "/v1/chat/completions",
                         json={"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "c"}]}) as r:
            chunks = r.iter_raw()  # keep a reference: a dropped iterator closes the response at once
            next(chunks)
            assert fleet.core.fleet.workers[fleet.workers[0].url].inflight_requests == 1
        # leaving the block closes the connection mid-stream: the router must see the cancel
    assert ledger_is_zero(fleet)


def test_circuit_breaker_opens_and_recovers(make_fleet):
    fleet = make_fleet(1)  # breaker: 3 failures -> open 0.5 s -> 1 success closes
    url = fleet.workers[0].url
    fleet.set_fault(0, mode="error", count=-1)
    with httpx.Client(timeout=10) as http:
        post = lambda: http.post(fleet.router.url + "/v1/chat/completions",
                                 json={"model": MODEL, "messages": [{"role": "user", "content": "cb"}]})
        statuses = [post().status_code for _ in range(3)]
        assert all(s in (502, 503) for s in statuses)
        assert fleet.core.breakers[url].state == "open"
        seen = fleet.states[0].requests
        r = post()
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_worker"
        assert fleet.states[0].requests == seen  # open breaker: the worker is not touched
        fleet.set_fault(0, mode="ok")
        time.sleep(0.6)
        assert post().status_code == 200  # the half-open trial succeeds
        assert fleet.core.breakers[url].state == "closed"
        assert 'k3_router_worker_breaker_state{worker="' + url + '"} 0.0' in http.get(fleet.router.url + "/metrics").text


def test_everything_down_gives_a_clean_error_quickly(make_fleet):
    fleet = make_fleet(2)
    for worker in fleet.workers:
        worker.stop()
    started = time.monotonic()
    r = httpx.post(fleet.router.url + "/v1/chat/completions", timeout=10,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "anyone?"}]})
    assert r.status_code in (502, 503) and "error" in r.json() and time.monotonic() - started < 5
    deadline = time.monotonic() + 5
    while httpx.get(fleet.router.url + "/readiness", timeout=5).status_code != 503 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert httpx.get(fleet.router.url + "/readiness", timeout=5).status_code == 503
    assert httpx.get(fleet.router.url + "/health", timeout=5).status_code == 200


def test_admission_answers_429_with_retry_after(make_fleet):
    fleet = make_fleet(2)  # mock workers report 65,536 KV tokens
    huge = [{"role": "user", "content": "x" * 400_000}]  # ~100K tokens
    r = httpx.post(fleet.router.url + "/v1/chat/completions", json={"model": MODEL, "messages": huge}, timeout=10)
    assert r.status_code == 429 and r.headers["retry-after"] == "5"
    assert r.json()["error"]["code"] == "capacity_exceeded"
    assert fleet.states[0].requests == fleet.states[1].requests == 0


def test_admission_queue_waits_then_gives_up(make_fleet):
    fleet = make_fleet(1, policy=PolicyConfig(admission="queue", queue_timeout_s=0.6))
    huge = [{"role": "user", "content": "x" * 400_000}]
    started = time.monotonic()
    r = httpx.post(fleet.router.url + "/v1/chat/completions", json={"model": MODEL, "messages": huge}, timeout=10)
    assert r.status_code == 429 and 0.5 < time.monotonic() - started < 3


def test_admin_api_workers_and_sessions(make_fleet):
    fleet = make_fleet(2, admin_key="adm")
    auth = {"X-Admin-Key": "adm"}
    with httpx.Client(base_url=fleet.router.url, timeout=10) as http:
        r = http.post("/v1/chat/completions", headers={"X-Session-Id": "s1"},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        home = r.headers["x-k3-worker"]
        session = http.get("/sessions/s1", headers=auth).json()
        assert session["worker"] == home and session["turns"] == 1
        assert len(http.get("/workers", headers=auth).json()["workers"]) == 2
        assert http.delete("/workers", params={"url": home}, headers=auth).status_code == 200
        assert http.get("/sessions/s1", headers=auth).json()["worker"] is None
        r = http.post("/v1/chat/completions", headers={"X-Session-Id": "s1"},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.headers["x-k3-worker"] != home
        added = http.post("/workers", json={"url": home, "state_slots": 4}, headers=auth)
        assert added.status_code == 201 and added.json()["state_slots"] == 4
        assert http.delete("/sessions/s1", headers=auth).status_code == 200
        assert http.get("/sessions/s1", headers=auth).status_code == 404
        metrics = http.get("/metrics").text
        assert "k3_router_worker_resident_tokens" in metrics and "k3_router_placements_total" in metrics


def test_a_worker_silent_past_the_read_timeout_is_named_a_read_timeout(make_fleet, fast_reliability):
    """No response head within `reliability.read_timeout_s` (a worker queueing a long prefill) is reported as a
    read timeout, not a connect error, and the client gets 502 once every worker has failed that way."""
    import dataclasses

    fleet = make_fleet(1, reliability=dataclasses.replace(fast_reliability, read_timeout_s=0.5, max_retries=0))
    fleet.set_fault(0, mode="slow", delay_s=2.0, count=-1)
    resp = httpx.post(fleet.router.url + "/v1/chat/completions", timeout=10,
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert resp.status_code == 502, resp.text[:300]
    message = resp.json()["error"]["message"]
    assert "read timeout (no byte within reliability.read_timeout_s = 0.5 s)" in message
    assert "connect error" not in message
    fleet.set_fault(0, mode="ok")
    fleet.wait_idle()
