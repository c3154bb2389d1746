"""KV events from two real `k3 serve` workers (tiny K3 on CPU) into the router's index.

The truth is what each worker actually resumes: before every probe request the router's index predicts the
prefix the worker will reuse (`match_tokens(ids, len - 1)`, KDA checkpoints included), and the worker's
reported `cached_tokens` must equal it, after stores, a shared prefix, a prefix whose KV is cached but whose
KDA state is not, evictions under a small pool, a flush, and a batch lost on the wire (detected and replayed).
Then placement: a token request goes to the worker that holds its prefix; and retention: a session that asked
for it resumes its whole prefix after a burst that evicts an otherwise identical session.
Slow tier since 2026-12-06 (two worker starts, about 2.3 min of CI's default run): `make test-slow`.
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

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]
STARTUP_TIMEOUT_S = float(os.environ.get("K3_TEST_STARTUP_S", "400"))
POOL_TOKENS = 700
CHUNK = 64
WORKER_ARGS = ["--dtype", "float32", "--max-total-tokens", str(POOL_TOKENS), "--max-mamba-cache-size", "24",
               "--max-running-requests", "2", "--chunked-prefill-size", str(CHUNK),
               "--mamba-max-states-per-path", "-1"]  # every chunk's KDA state kept (also k3 serve's default since issue 42)
RELIABILITY = ReliabilityConfig(health_interval_s=0.5, capacity_refresh_s=1.0, health_fail_threshold=3)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    logs = tmp_path_factory.mktemp("kv-events")
    workers: list[K3ServerProcess] = []
    router = None
    try:
        for i in range(2):  # one after the other (two first starts at once are slow on 2 cores)
            workers.append(K3ServerProcess(WORKER_ARGS, logs / f"serve-{i}.log").start(timeout_s=STARTUP_TIMEOUT_S))
        app = create_app(RouterConfig(workers=tuple(WorkerSpec(w.url) for w in workers), reliability=RELIABILITY,
                                      policy=PolicyConfig(max_retain_s=600)))
        router = ServerThread(app).start()
        state = router_state(app)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
                state.core.event_feeds.get(w.url) is not None and state.core.event_feeds[w.url].state == SYNCED
                for w in workers):
            time.sleep(0.2)
        yield workers, router, state
    finally:
        if router is not None:
            router.stop(timeout_s=5)
        for worker in workers:
            worker.stop()


def generate(url: str, ids: list[int], session: str, new_tokens: int = 1, headers: dict | None = None) -> dict:
    response = httpx.post(url + "/generate", json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": new_tokens, "temperature": 0}}, headers={"X-Session-Id": session, **(headers or {})},
        timeout=300)
    assert response.status_code == 200, response.text
    return response.json() | {"_worker": response.headers.get("x-k3-worker")}


def settle(feed, quiet_s: float = 0.5, timeout_s: float = 30.0) -> None:
    """Wait until the worker's events stopped arriving (the last request's batches are in the index)."""
    deadline = time.monotonic() + timeout_s
    last, since = feed.expected, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if feed.expected != last or feed.replaying_from is not None:
            last, since = feed.expected, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
    raise AssertionError("events did not settle")


def predicted(feed, ids: list[int]) -> int:
    return feed.index.match_tokens(ids, len(ids) - 1).tokens


def check(url: str, feed, ids: list[int], session: str = "probe") -> int:
    """The index's prediction equals what the worker resumes; returns it."""
    settle(feed)
    want = predicted(feed, ids)
    got = generate(url, ids, session)["meta_info"]["cached_tokens"]
    assert got == want, (got, want, len(ids))
    settle(feed)
    return got


def kv_only_depth(feed, ids: list[int]) -> int:
    """Leading tokens whose KV blocks the index holds, ignoring KDA checkpoints (what a KV-only index sees)."""
    from k3_sglang.router.event_index import ROOT_CHAIN, chain_key

    chain, depth = ROOT_CHAIN, 0
    for token in ids:  # the tiny model's page is one token
        chain = chain_key(chain, (token,))
        if chain not in feed.index.by_chain:
            break
        depth += 1
    return depth


def test_index_equals_what_the_workers_resume(cluster):
    workers, _, state = cluster
    rng = random.Random(30)
    for worker in workers:
        feed = state.core.event_feeds[worker.url]
        assert feed.state == SYNCED, feed.counts
        url = worker.url
        s1 = [rng.randrange(10, 1000) for _ in range(90)]
        s2 = s1[:50] + [rng.randrange(10, 1000) for _ in range(40)]
        out = generate(url, s1, "a", new_tokens=3)["output_ids"]
        generate(url, s2, "b", new_tokens=3)
        assert check(url, feed, s1 + [5, 6]) == 90  # the state saved at the end of the prompt
        assert check(url, feed, s1 + out + [5]) == 92  # prompt + outputs but the last (its KV is never computed)
        assert check(url, feed, s2 + [7]) > 50
        partial = s1[:70] + [1, 2, 3]
        assert kv_only_depth(feed, partial) == 70  # KV blocks cover 70 tokens ...
        assert check(url, feed, partial) == CHUNK  # ... but the deepest KDA state is at the chunk boundary
        burst = [[rng.randrange(10, 1000) for _ in range(150)] for _ in range(6)]
        for i, ids in enumerate(burst):  # more than the pool: evictions
            generate(url, ids, f"burst{i}", new_tokens=2)
        settle(feed)
        assert len(feed.index) <= POOL_TOKENS and feed.counts["events"] > 0
        for ids in (s1 + [9], s2 + [9], burst[0] + [9], burst[-1] + [9]):
            check(url, feed, ids)
        assert httpx.post(url + "/flush_cache", timeout=30).status_code == 200
        settle(feed)
        assert len(feed.index) == 0 and not feed.index.checkpoints
        assert check(url, feed, s1 + [9]) == 0
    # a batch lost on the wire: detected by the next sequence number and replayed
    worker, feed = workers[1], state.core.event_feeds[workers[1].url]
    before = dict(feed.counts)
    state.subscriptions[worker.url].drop_next = 1
    s3 = [rng.randrange(10, 1000) for _ in range(80)]
    generate(worker.url, s3, "c", new_tokens=2)
    generate(worker.url, s3[:40] + [3, 4, 5], "c2", new_tokens=2)
    settle(feed)
    assert feed.counts["gaps"] == before.get("gaps", 0) + 1 and feed.counts["replays"] > before.get("replays", 0)
    assert feed.state == SYNCED
    assert check(worker.url, feed, s3 + [8]) == 80


def test_a_token_request_goes_where_its_prefix_is_resumable(cluster):
    workers, router, state = cluster
    rng = random.Random(31)
    ids = [rng.randrange(10, 1000) for _ in range(100)]
    holder = workers[0]
    generate(holder.url, ids, "warm", new_tokens=2)
    feed = state.core.event_feeds[holder.url]
    settle(feed)
    request = ids + [11, 12]
    assert predicted(feed, request) == 100 and predicted(state.core.event_feeds[workers[1].url], request) == 0
    out = generate(router.url, request, "fresh-session")
    assert out["_worker"] == holder.url and out["meta_info"]["cached_tokens"] == 100


def _retention_script(router_url: str, state, workers, session: str, retain: float | None, rng) -> tuple[int, int]:
    """Turn 1 through the router, a burst straight to that worker, turn 2 through the router: (cached, full)."""
    turn1 = [rng.randrange(10, 1000) for _ in range(60)]
    headers = {"X-Session-Retain-S": str(retain)} if retain else {}
    first = generate(router_url, turn1, session, new_tokens=3, headers=headers)
    home = first["_worker"]
    for i in range(6):
        generate(home, [rng.randrange(10, 1000) for _ in range(150)], f"{session}-burst{i}", new_tokens=2)
    for worker in workers:
        settle(state.core.event_feeds[worker.url])
    second = generate(router_url, turn1 + first["output_ids"] + [21, 22], session, headers=headers)
    return second["meta_info"]["cached_tokens"], len(turn1) + len(first["output_ids"]) - 1


def test_retained_session_resumes_its_whole_prefix_after_a_burst(cluster):
    workers, router, state = cluster
    rng = random.Random(32)
    results = {}
    for session, retain in (("not-kept", None), ("kept", 600)):  # the same script on flushed workers
        for worker in workers:
            assert httpx.post(worker.url + "/flush_cache", timeout=30).status_code == 200
        results[session] = _retention_script(router.url, state, workers, session, retain, rng)
    cached, full = results["kept"]
    assert cached == full
    cached, full = results["not-kept"]
    assert cached < full
    for url in (router.url, workers[0].url):  # refused by the router, and by a worker's own guard
        response = httpx.post(url + "/generate", json={"input_ids": [1, 2], "session_retain_s": -1}, timeout=30)
        assert response.status_code == 400 and "session_retain_s" in response.json()["error"]["message"]
