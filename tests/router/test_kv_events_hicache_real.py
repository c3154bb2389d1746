"""KV events from a real `k3 serve` worker with SGLang's HiCache host tier into the router's index (issue 42).

The truth is what the worker resumes: a session evicted from the device pool into the host tier must be predicted
by the index as resumable (its KDA checkpoint now in the host tier, `serving/kv_event_tiers.py`) and off the
device, and the worker's reported `cached_tokens` must equal the prediction, tier by tier (SGLang's
`cached_tokens_details`: device / host). Then a resumed turn sent through the router is preceded by a prefetch
(the router's `/generate` with `max_new_tokens: 0` over the host-tier prefix) and resumes the predicted prefix. Slow tier (one worker start, a router, CPU prefill of a few thousand tokens).
"""

from __future__ import annotations

import os
import random
import time

import httpx
import pytest

from k3_sglang.router.app import create_app, router_state
from k3_sglang.router.config import PolicyConfig, ReliabilityConfig, RouterConfig, WorkerSpec
from k3_sglang.router.event_feed import SYNCED
from k3_sglang.router.threaded import ServerThread
from k3_sglang.serving.process import K3ServerProcess

from tests.router.test_kv_events_real import generate, settle

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]
STARTUP_TIMEOUT_S = float(os.environ.get("K3_TEST_STARTUP_S", "400"))
POOL_TOKENS = 700
CHUNK = 64
SESSION_TOKENS = 300
WORKER_ARGS = ["--dtype", "float32", "--max-total-tokens", str(POOL_TOKENS), "--max-mamba-cache-size", "24",
               "--max-running-requests", "2", "--chunked-prefill-size", str(CHUNK),
               "--enable-hierarchical-cache", "--hicache-ratio", "6"]
RELIABILITY = ReliabilityConfig(health_interval_s=0.5, capacity_refresh_s=1.0, health_fail_threshold=3)


@pytest.fixture(scope="module")
def hicache_worker(tmp_path_factory):
    logs = tmp_path_factory.mktemp("kv-events-hicache")
    worker = K3ServerProcess(WORKER_ARGS, logs / "serve.log")
    router = None
    try:
        worker.start(timeout_s=STARTUP_TIMEOUT_S)
        app = create_app(RouterConfig(workers=(WorkerSpec(worker.url),), reliability=RELIABILITY,
                                      policy=PolicyConfig(prefetch_min_tokens=CHUNK)))
        router = ServerThread(app).start()
        state = router_state(app)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                state.core.event_feeds.get(worker.url) is not None
                and state.core.event_feeds[worker.url].state == SYNCED):
            time.sleep(0.2)
        yield worker, router, state
    finally:
        if router is not None:
            router.stop(timeout_s=5)
        worker.stop()


def tiers_of(answer: dict) -> tuple[int, int, int]:
    """(cached, device, host) as the worker reports them."""
    meta = answer["meta_info"]
    details = meta.get("cached_tokens_details") or {}
    return meta["cached_tokens"], int(details.get("device", 0)), int(details.get("host", 0))


def evict_to_host(url: str, rng: random.Random, feed) -> None:
    """Sessions that fill the device pool more than twice over: earlier sessions leave the device for the host."""
    for i in range(5):
        generate(url, [rng.randrange(10, 1000) for _ in range(SESSION_TOKENS)], f"burst{i}-{rng.random()}", 2)
    settle(feed)


def test_index_predicts_host_tier_resumes_per_tier(hicache_worker):
    worker, _, state = hicache_worker
    feed = state.core.event_feeds[worker.url]
    assert feed.state == SYNCED, feed.counts
    rng = random.Random(42)
    sessions = [[rng.randrange(10, 1000) for _ in range(SESSION_TOKENS)] for _ in range(2)]
    turns = [s + generate(worker.url, s, f"s{i}", 3)["output_ids"] for i, s in enumerate(sessions)]
    evict_to_host(worker.url, rng, feed)
    host_checkpoints = sum(1 for _, tiers in feed.index.checkpoints.values() if tiers & 2)
    assert host_checkpoints > 0, "no KDA checkpoint announced in the host tier"
    for i, ids in enumerate(turns):
        probe = ids + [5, 6]
        want = feed.index.match_tokens(probe, len(probe) - 1)
        assert want.tokens > want.device_tokens, (want, "the session should be (partly) off the device")
        cached, device, host = tiers_of(generate(worker.url, probe, f"s{i}"))
        assert (cached, device, host) == (want.tokens, want.device_tokens, want.tokens - want.device_tokens)
        assert cached >= SESSION_TOKENS  # the prompt's state came back from the host tier
        settle(feed)
        again = feed.index.match_tokens(probe, len(probe) - 1)  # loaded back: now on the device
        assert again.device_tokens == again.tokens == cached, again


def test_router_prefetches_a_host_tier_session_before_its_turn(hicache_worker):
    worker, router, state = hicache_worker
    feed = state.core.event_feeds[worker.url]
    rng = random.Random(43)
    first = [rng.randrange(10, 1000) for _ in range(SESSION_TOKENS)]
    history = first + generate(router.url, first, "agent", 3)["output_ids"]
    evict_to_host(worker.url, rng, feed)
    probe = history + [7, 8]
    want = feed.index.match_tokens(probe, len(probe) - 1)
    assert want.tokens - want.device_tokens >= CHUNK, want
    metric = 'k3_router_prefetches_total{worker="%s"}' % worker.url
    before = _metric(router.url, metric)
    cached, device, host = tiers_of(generate(router.url, probe, "agent"))
    assert _metric(router.url, metric) == before + 1
    # the prefetch is sent just before the turn (never awaited), so either may be admitted first: the turn resumes
    # the predicted prefix, from the device if the prefetch loaded it back already, else from the host tier
    assert cached == want.tokens == device + host, (cached, device, host, want)


def _metric(router_url: str, name: str) -> float:
    for line in httpx.get(router_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0
