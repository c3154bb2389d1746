"""KV events leave a host safely: SGLang's ZMQ publisher with CURVE (serving/kv_events_curve.py), forced on by
K3_KV_EVENTS_CURVE=on on loopback. The router with its key stays synced (live and replay); a subscriber without an
admitted key, or without CURVE at all, receives nothing from either socket; a router without keys does not
subscribe."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time

import pytest
import zmq
import zmq.auth

from k3_sglang.net import free_port_block
from k3_sglang.router.event_feed import SYNCED
from k3_sglang.serving.kv_events_config import KvEventsSettings, kv_events_flags
from tests.router.kv_event_model import SimRadixWorker, random_operation
from tests.router.test_event_index import SESSIONS, _assert_same, _queries
from tests.router.test_event_subscriber import _publish, _wait

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def keys(tmp_path, monkeypatch):
    clients = tmp_path / "clients"
    clients.mkdir()
    paths = {}
    for name in ("worker", "router", "intruder"):
        public, secret = zmq.auth.create_certificates(str(tmp_path), name)
        paths[name] = (public, secret)
    (clients / "router.key").write_bytes(open(paths["router"][0], "rb").read())  # only the router is admitted
    monkeypatch.setenv("K3_KV_EVENTS_CURVE", "on")
    monkeypatch.setenv("K3_KV_EVENTS_CURVE_SECRET_FILE", paths["worker"][1])
    monkeypatch.setenv("K3_KV_EVENTS_CURVE_CLIENTS_DIR", str(clients))
    return paths


@pytest.fixture
def curve_publisher(keys):
    from k3_sglang.serving.kv_events_curve import curve_publisher_class

    flags = kv_events_flags([], KvEventsSettings.from_env(), pick_ports=free_port_block)
    config = json.loads(flags[1])
    assert config["publisher"] == "k3_zmq_curve"  # what k3 serve asks SGLang for, on loopback too when forced
    base = free_port_block(2)
    pub = curve_publisher_class()(attn_dp_rank=0, endpoint=f"tcp://127.0.0.1:{base}", bind=True,
                                  replay_endpoint=f"tcp://127.0.0.1:{base + 1}", topic="kv")
    pub.block = {"publisher": "k3_zmq_curve", "endpoint_host": "127.0.0.1", "endpoint_port_base": base,
                 "topic": "kv", "block_size": 2, "dp_size": 1, "replay_endpoint_port_base": base + 1}
    yield pub
    pub.shutdown()


def _eavesdroppers(ctx, block, keys):
    """A plain SUB, a CURVE SUB with a key the worker does not admit, and a plain replay DEALER."""
    pub, replay = f"tcp://127.0.0.1:{block['endpoint_port_base']}", f"tcp://127.0.0.1:{block['replay_endpoint_port_base']}"
    server_public, _ = zmq.auth.load_certificate(keys["worker"][0])
    intruder_public, intruder_secret = zmq.auth.load_certificate(keys["intruder"][1])
    plain = ctx.socket(zmq.SUB)
    plain.connect(pub)
    plain.setsockopt(zmq.SUBSCRIBE, b"")
    wrong = ctx.socket(zmq.SUB)
    wrong.curve_serverkey, wrong.curve_publickey, wrong.curve_secretkey = server_public, intruder_public, intruder_secret
    wrong.connect(pub)
    wrong.setsockopt(zmq.SUBSCRIBE, b"")
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay)
    dealer.send_multipart([b"", (0).to_bytes(8, "big", signed=True)], flags=zmq.NOBLOCK)
    return [plain, wrong, dealer]


def test_router_with_the_key_syncs_and_eavesdroppers_get_nothing(make_fleet, fast_reliability, curve_publisher, keys):
    rng, paths = random.Random(5), []
    worker = SimRadixWorker(rng, page=2)
    _publish(curve_publisher, worker, rng, paths, 10)  # before anyone subscribed: only a replay has them
    reliability = dataclasses.replace(fast_reliability, capacity_refresh_s=0.3)
    fleet = make_fleet(1, reliability=reliability, events_curve_key=keys["router"][1],
                       events_curve_server_key=keys["worker"][0])
    fleet.states[0].kv_events = curve_publisher.block
    ctx = zmq.Context()
    spies = _eavesdroppers(ctx, curve_publisher.block, keys)
    try:
        url = fleet.workers[0].url
        assert _wait(lambda: url in fleet.state.subscriptions)
        feed = fleet.core.event_feeds[url]
        assert _wait(lambda: feed.state == SYNCED and feed.expected == 10)  # replayed over CURVE
        time.sleep(0.3)
        _publish(curve_publisher, worker, rng, paths, 10)  # live, over CURVE
        assert _wait(lambda: feed.expected == 20)
        assert feed.state == SYNCED and feed.counts["malformed"] == 0
        _assert_same(feed.index, worker, _queries(worker, rng, paths, 30))
        poller = zmq.Poller()
        for spy in spies:
            poller.register(spy, zmq.POLLIN)
        assert dict(poller.poll(1500)) == {}  # not one frame, from either socket
    finally:
        for spy in spies:
            spy.close(0)
        ctx.term()


def test_router_without_keys_does_not_subscribe_to_curve_events(make_fleet, fast_reliability, curve_publisher, caplog):
    caplog.set_level(logging.INFO, logger="k3.router.events")
    reliability = dataclasses.replace(fast_reliability, capacity_refresh_s=0.3)
    fleet = make_fleet(1, reliability=reliability)
    fleet.states[0].kv_events = curve_publisher.block
    assert _wait(lambda: "CURVE-protected" in caplog.text, timeout_s=10)
    assert fleet.workers[0].url not in fleet.state.subscriptions


def test_curve_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="K3_KV_EVENTS_CURVE_SECRET_FILE"):
        KvEventsSettings.from_env({"K3_KV_EVENTS_HOST": "0.0.0.0"})  # off loopback: CURVE unless turned off
    assert KvEventsSettings.from_env({"K3_KV_EVENTS_HOST": "0.0.0.0", "K3_KV_EVENTS_CURVE": "off"}).curve is False
    assert KvEventsSettings.from_env({}).curve is False
    with pytest.raises(ValueError, match="K3_KV_EVENTS_CURVE_CLIENTS_DIR"):
        public, secret = zmq.auth.create_certificates(str(tmp_path), "w")
        KvEventsSettings.from_env({"K3_KV_EVENTS_CURVE": "on", "K3_KV_EVENTS_CURVE_SECRET_FILE": secret})


def test_router_curve_flags_are_checked(tmp_path, capsys):
    from k3_sglang import cli

    public, secret = zmq.auth.create_certificates(str(tmp_path), "r")
    worker = ["router", "--worker", "http://127.0.0.1:1"]
    assert cli.main(worker + ["--curve-key", secret]) == 2  # without the worker's public key
    assert cli.main(worker + ["--curve-key", public, "--curve-server-key", public]) == 2  # no secret
    assert cli.main(worker + ["--curve-key", str(tmp_path / "none"), "--curve-server-key", public]) == 2
    err = capsys.readouterr().err
    assert "events_curve_server_key" in err and "--curve-key" in err
