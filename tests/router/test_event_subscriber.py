"""The router's KV-event subscription against SGLang's own ZMQ publisher (in this process, on loopback): discovery
from /server_info, a late subscriber replaying the start, a lost batch detected and replayed, garbage counted
and logged once while the router keeps serving, and a worker that publishes nothing placed by inference."""

from __future__ import annotations

import dataclasses
import logging
import random
import time

import httpx
import pytest

from k3_sglang.net import free_port_block
from k3_sglang.router.event_feed import NONE, PARTIAL, SYNCED
from k3_sglang.router.event_subscriber import parse_event_source
from tests.router.kv_event_model import SimRadixWorker, random_operation
from tests.router.test_event_index import SESSIONS, _assert_same, _queries


@pytest.fixture
def publisher():
    from sglang.srt.disaggregation.kv_events import ZmqEventPublisher

    base = free_port_block(2)
    pub = ZmqEventPublisher(attn_dp_rank=0, endpoint=f"tcp://127.0.0.1:{base}", bind=True,
                            replay_endpoint=f"tcp://127.0.0.1:{base + 1}", topic="kv")
    pub.block = {"publisher": "zmq", "endpoint_host": "127.0.0.1", "endpoint_port_base": base, "topic": "kv",
                 "block_size": 2, "dp_size": 1, "replay_endpoint_port_base": base + 1}
    yield pub
    pub.shutdown()


def _publish(pub, worker, rng, paths, n):
    from sglang.srt.disaggregation.kv_events import EventBatch

    for _ in range(n):
        pub.publish(EventBatch(ts=time.time(), events=random_operation(worker, rng, paths, SESSIONS)))


def _wait(predicate, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _fast(fast_reliability):
    return dataclasses.replace(fast_reliability, capacity_refresh_s=0.3)


def test_subscription_replays_gaps_and_equals_the_published_cache(make_fleet, fast_reliability, publisher):
    rng, paths = random.Random(21), []
    worker = SimRadixWorker(rng, page=2)
    _publish(publisher, worker, rng, paths, 20)  # before anyone subscribed: replayed from seq 0
    fleet = make_fleet(1, reliability=_fast(fast_reliability))
    fleet.states[0].kv_events = publisher.block
    url = fleet.workers[0].url
    assert _wait(lambda: url in fleet.state.subscriptions)
    feed = fleet.core.event_feeds[url]
    published = 20
    assert _wait(lambda: feed.state == SYNCED and feed.expected == published)
    _assert_same(feed.index, worker, _queries(worker, rng, paths, 30))
    assert feed.counts["gaps"] == 0 and feed.counts["replays"] == 1  # the catch-up on subscribing
    for _ in range(3):  # lose one live batch each round: detected by the next seq, replayed
        fleet.state.subscriptions[url].drop_next = 1
        _publish(publisher, worker, rng, paths, 6)
        published += 6
        assert _wait(lambda: feed.expected == published and feed.replaying_from is None)
        assert feed.state == SYNCED
        _assert_same(feed.index, worker, _queries(worker, rng, paths, 30))
    assert feed.counts["gaps"] == 3 and feed.counts["replays"] == 4
    described = httpx.get(fleet.router.url + "/metrics", timeout=5).text
    assert f'k3_router_worker_kv_events_state{{state="synced",worker="{url}"}} 1.0' in described


def test_garbage_is_counted_logged_once_and_placement_falls_back(make_fleet, fast_reliability, publisher, caplog):
    from sglang.srt.disaggregation.kv_events import EventBatch

    caplog.set_level(logging.WARNING, logger="k3.router.events")
    fleet = make_fleet(1, reliability=_fast(fast_reliability))
    fleet.states[0].kv_events = publisher.block
    url = fleet.workers[0].url
    assert _wait(lambda: url in fleet.state.subscriptions)
    publisher.publish(EventBatch(ts=0.0, events=[]))
    feed = fleet.core.event_feeds[url]
    assert _wait(lambda: feed.state == SYNCED)
    for _ in range(3):
        publisher.publish(EventBatch(ts=0.0, events=[{"type": "BlockStored", "block_hashes": ["x"]}]))
    assert _wait(lambda: feed.counts["malformed"] == 3)
    assert feed.state == PARTIAL
    assert len([r for r in caplog.records if "malformed" in r.getMessage()]) == 1
    body = {"model": "mock-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(fleet.router.url + "/v1/chat/completions", json=body, timeout=10).status_code == 200


def test_a_worker_without_events_is_placed_by_inference(make_fleet, fast_reliability):
    fleet = make_fleet(2, reliability=_fast(fast_reliability))
    time.sleep(1.0)
    assert fleet.state.subscriptions == {} and all(f.state == NONE for f in fleet.core.event_feeds.values())
    body = {"model": "mock-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(fleet.router.url + "/v1/chat/completions", json=body, timeout=10).status_code == 200


def test_event_source_discovery():
    block = {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557, "topic": "kv", "dp_size": 1,
             "replay_endpoint_port_base": 5558}
    source, why = parse_event_source("http://10.0.0.7:30000", {"kv_events": block})
    assert (source.endpoint, source.replay_endpoint, source.topic, why) == \
        ("tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558", "kv", "")
    assert parse_event_source("http://h:1", {"kv_events": {**block, "dp_size": 2}})[0] is None
    assert parse_event_source("http://h:1", {})[0] is None
    assert parse_event_source("http://h:1", {"kv_events": {**block, "endpoint_port_base": "x"}})[0] is None
    no_replay = {k: v for k, v in block.items() if k != "replay_endpoint_port_base"}
    assert parse_event_source("http://h:1", {"kv_events": no_replay})[0].replay_endpoint is None
