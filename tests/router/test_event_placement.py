"""Placement with KV events: exact resumable prefixes where a worker publishes, text inference elsewhere."""

from __future__ import annotations

import random

from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.core import Capacity, RouterCore
from k3_sglang.router.event_feed import NONE, PARTIAL, SYNCED
from k3_sglang.router.event_index import Resumable
from k3_sglang.router.event_placement import EventView, cached_tokens
from k3_sglang.router.kv_events import KDA_REMOVED, KDA_STORED, encode_batch
from k3_sglang.router.policy import MOVE, NEW, STAY, RouteRequest

CFG = PolicyConfig(kv_headroom=0.0, kv_barrier_s=0.25, move_penalty_s=1.0, move_penalty_factor=1.0,
                   block_tokens=4, session_ttl_s=1000.0)


def make_core(n: int = 2, tps: float = 1_000.0) -> RouterCore:
    core = RouterCore(CFG)
    for i in range(n):
        core.add_worker(f"w{i}", Capacity(1_000_000, 64, tps))
    return core


def publish(core: RouterCore, worker: str, events: list[dict]) -> None:
    feed = core.event_feed(worker)
    feed.on_live(feed.expected_or(0), encode_batch(events))


def stored(hashes: list[int], tokens: list[int], parent=None, session=None, size: int = 1) -> dict:
    event = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
             "block_size": size, "lora_id": None, "medium": "GPU"}
    if session:
        event["session_id"] = session
    return event


def checkpoint(h: int, tokens: int, session=None) -> dict:
    event = {"type": KDA_STORED, "block_hash": h, "tokens": tokens, "medium": "GPU"}
    if session:
        event["session_id"] = session
    return event


def turn(core, sid, context, now, token_ids=None, growth=10):
    decision, ticket = core.route(RouteRequest(sid, context, growth, token_ids=token_ids), (), now)
    core.complete(ticket, now, ok=True, output_tokens=growth)
    return decision


def test_token_request_goes_where_its_prefix_is_resumable():
    core = make_core()
    ids = list(range(100, 140))
    publish(core, "w0", [])  # w0 publishes too (synced, empty)
    publish(core, "w1", [stored(list(range(1, 33)), ids[:32]), checkpoint(32, 32)])
    decision = turn(core, "a", 40, 0.0, token_ids=ids)
    assert (decision.kind, decision.worker_id, decision.cached_tokens) == (NEW, "w1", 32)
    # a prefix with its KV blocks but without a KDA checkpoint at the end resumes only to the last checkpoint
    publish(core, "w1", [{"type": KDA_REMOVED, "block_hash": 32}, checkpoint(16, 16)])
    decision = turn(core, "b", 40, 1.0, token_ids=ids)
    assert decision.cached_tokens == 16


def test_an_evicted_home_is_known_cold_and_the_session_may_move():
    core = make_core()
    for w in ("w0", "w1"):
        publish(core, w, [])
    first = turn(core, "s", 4_000, 0.0)
    home = first.worker_id
    other = "w1" if home == "w0" else "w0"
    publish(core, home, [stored([7, 8], [1, 2], session="s"), checkpoint(8, 4_000, session="s")])
    core.fleet.workers[home].inflight_prefill_tokens = 2_000  # 2 s of queue on the home
    decision = turn(core, "s", 4_100, 1.0)
    assert (decision.kind, decision.cached_tokens) == (STAY, 4_000)  # resumable there: stays despite the queue
    publish(core, home, [{"type": "BlockRemoved", "block_hashes": [8, 7], "medium": "GPU"}])  # evicted
    decision = turn(core, "s", 4_200, 2.0)
    assert (decision.kind, decision.worker_id) == (MOVE, other)  # nothing left to resume at home


def test_without_events_placement_is_unchanged():
    """A worker that publishes nothing (feed `none`) is placed by inference exactly as before."""
    rng = random.Random(4)
    plain, with_feeds = make_core(3), make_core(3)
    for w in ("w0", "w1", "w2"):
        with_feeds.event_feed(w)  # created, never fed
    for step in range(200):
        sid, context = f"s{rng.randrange(20)}", rng.randint(10, 5_000)
        a, b = turn(plain, sid, context, float(step)), turn(with_feeds, sid, context, float(step))
        assert (a.kind, a.worker_id, a.cached_tokens) == (b.kind, b.worker_id, b.cached_tokens)
    assert all(f.state == NONE for f in with_feeds.event_feeds.values())


def test_partial_feed_takes_the_larger_of_events_and_inference():
    assert cached_tokens(None, 300, 1_000) == 300
    assert cached_tokens(EventView(Resumable(800, 800), True), 300, 1_000) == 800
    assert cached_tokens(EventView(Resumable(0, 0), True), 300, 1_000) == 0  # authoritative: cold
    assert cached_tokens(EventView(Resumable(100, 0), False), 300, 1_000) == 300
    assert cached_tokens(EventView(Resumable(5_000, 0), False), 300, 1_000) == 1_000  # capped by the context
    core = make_core()
    turn(core, "s", 4_000, 0.0)
    home = core.fleet.sessions["s"].worker_id
    feed = core.event_feed(home)
    feed.on_live(3, encode_batch([]))  # joined late, replay impossible
    feed.replay_failed()
    assert feed.state == PARTIAL
    decision = turn(core, "s", 4_100, 1.0)
    assert decision.cached_tokens == 4_000 + 10  # inference (the session's known context) still counts


def test_text_request_on_a_non_home_worker_keeps_inferring_shared_prefixes():
    """Session ids cannot show a system prompt another session cached: for a new text session the inferred
    prefix still counts on a synced worker."""
    core = make_core()
    for w in ("w0", "w1"):
        publish(core, w, [])
    prompt = (11, 12, 13)  # text block hashes of a shared opening
    first, ticket = core.route(RouteRequest("a", 20, 10), prompt, 0.0)
    core.complete(ticket, 0.0, ok=True, output_tokens=10)
    decision, _ = core.route(RouteRequest("b", 20, 10), prompt, 1.0)
    assert core.event_feeds[first.worker_id].state == SYNCED
    assert (decision.worker_id, decision.cached_tokens) == (first.worker_id, 12)
