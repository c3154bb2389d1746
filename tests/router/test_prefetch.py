"""Prefetch, against a stand-in worker (the mock): when a worker's events say a turn's prefix is in the host tier,
the router sends the worker a `/generate` over that prefix with `max_new_tokens: 0` before the turn; not when
the prefix is on the device, not below the threshold, not when the worker publishes nothing."""

from __future__ import annotations

import time

import httpx
import orjson

from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.event_feed import WorkerEventFeed
from k3_sglang.router.kv_events import KDA_STORED, encode_batch
from k3_sglang.router.prefetch import plan_prefetch


def _feed(tier: str, tokens: list[int], session: str = "s") -> WorkerEventFeed:
    feed = WorkerEventFeed()
    feed.on_live(0, encode_batch([
        {"type": "BlockStored", "block_hashes": list(range(1, len(tokens) + 1)), "parent_block_hash": None,
         "token_ids": tokens, "block_size": 1, "lora_id": None, "medium": tier, "session_id": session},
        {"type": KDA_STORED, "block_hash": len(tokens), "tokens": len(tokens), "medium": tier, "session_id": session},
    ]))
    return feed


def test_plan_prefetch():
    ids = list(range(100, 700))
    host, device = _feed("CPU_PINNED", ids), _feed("GPU", ids)
    plan = plan_prefetch(host, "s", ids + [1, 2], min_tokens=512)
    assert plan.token_ids == ids and plan.off_device_tokens == 600
    body = orjson.loads(plan.body())
    assert body["sampling_params"] == {"max_new_tokens": 0} and body["input_ids"] == ids
    assert plan_prefetch(device, "s", ids + [1], 512) is None       # already on the device
    assert plan_prefetch(host, "s", ids + [1], 1_000) is None        # below the threshold
    assert plan_prefetch(host, "s", ids + [1], 0) is None            # turned off
    assert plan_prefetch(WorkerEventFeed(), "s", ids + [1], 1) is None  # the worker publishes nothing
    by_session = plan_prefetch(host, "s", None, 512)  # a text request: the session's stored prefix, rebuilt
    assert by_session.token_ids == ids and plan_prefetch(host, "other", None, 512) is None


def test_router_prefetches_a_host_tier_prefix_before_the_turn(make_fleet):
    fleet = make_fleet(1, policy=PolicyConfig(prefetch_min_tokens=256))
    url, mock = fleet.workers[0].url, fleet.states[0]
    ids = list(range(1, 401))
    fleet.core.event_feeds[url] = _feed("CPU_PINNED", ids, session="agent")
    chat = {"model": "mock-k3", "messages": [{"role": "user", "content": "next"}], "max_tokens": 2}
    response = httpx.post(fleet.router.url + "/v1/chat/completions", json=chat, headers={"X-Session-Id": "agent"},
                          timeout=10)
    assert response.status_code == 200
    deadline = time.monotonic() + 5
    while len(mock.received) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    (first_path, first_body), (second_path, _) = mock.received[:2]
    assert (first_path, second_path) == ("/generate", "/v1/chat/completions")
    assert orjson.loads(first_body) == {"input_ids": ids, "session_id": "agent", "sampling_params": {"max_new_tokens": 0}}
    assert 'k3_router_prefetches_total{worker="%s"} 1.0' % url in httpx.get(fleet.router.url + "/metrics").text
    fleet.core.event_feeds[url] = _feed("GPU", ids, session="agent")
    mock.received.clear()
    assert httpx.post(fleet.router.url + "/v1/chat/completions", json=chat, headers={"X-Session-Id": "agent"},
                      timeout=10).status_code == 200
    time.sleep(0.2)
    assert [p for p, _ in mock.received] == ["/v1/chat/completions"]  # on the device: no prefetch
