"""The event index and its feed against a brute-force radix model, on fresh random event sequences."""

from __future__ import annotations

import random

import msgspec
import pytest

from k3_sglang.router.event_feed import NONE, PARTIAL, SYNCED, WorkerEventFeed
from k3_sglang.router.event_index import WorkerEventIndex
from k3_sglang.router.kv_events import (
    KDA_STORED, AllCleared, BlocksStored, CheckpointStored, MalformedEvents, decode_batch, encode_batch, parse_seq,
)
from tests.router.kv_event_model import SimRadixWorker, random_operation, tier_bit

SESSIONS = ["s0", "s1", "s2"]


def _queries(worker: SimRadixWorker, rng: random.Random, paths: list[list[int]], n: int = 12) -> list[list[int]]:
    out = [rng.choice(paths) + [rng.randrange(6) for _ in range(rng.randint(0, 4))] for _ in range(n) if paths]
    return out + [[rng.randrange(6) for _ in range(rng.randint(0, 12))] for _ in range(4)]


def _assert_same(index: WorkerEventIndex, worker: SimRadixWorker, queries: list[list[int]]) -> list:
    assert {h: {t for t in ("GPU", "CPU_PINNED") if b.tiers & tier_bit(t)} for h, b in index.blocks.items()} == \
        {h: b.tiers for h, b in worker.blocks.items()}
    truth_checkpoints = {h: {tier_bit(t) for t in b.checkpoint} for h, b in worker.blocks.items() if b.checkpoint}
    assert {h: {bit for bit in (1, 2) if tiers & bit} for h, (_, tiers) in index.checkpoints.items()} == truth_checkpoints
    # residency the policy charges where a worker publishes: device-tier blocks (tokens) and KDA states
    assert index.device_blocks == sum("GPU" in b.tiers for b in worker.blocks.values())
    assert index.resident_tokens == index.device_blocks * worker.page * (index.block_size is not None)
    assert index.device_states == sum("GPU" in b.checkpoint for b in worker.blocks.values())
    seen = []
    for tokens in queries:
        assert index.match_tokens(tokens) == worker.resumable(tokens), tokens
        assert index.match_tokens(tokens, len(tokens) - 1) == worker.resumable(tokens[:-1]), tokens
        seen.append(worker.resumable(tokens))
    for session in SESSIONS:
        assert index.session_resumable(session) == worker.session_resumable(session), session
        seen.append(worker.session_resumable(session))
    return seen


def _assert_no_false_positive(index: WorkerEventIndex, worker: SimRadixWorker, queries: list[list[int]]) -> None:
    for tokens in queries:
        got, truth = index.match_tokens(tokens), worker.resumable(tokens)
        assert got.tokens <= truth.tokens and got.device_tokens <= truth.device_tokens, tokens
    for session in SESSIONS:
        got, truth = index.session_resumable(session), worker.session_resumable(session)
        assert got.tokens <= truth.tokens and got.device_tokens <= truth.device_tokens, session


@pytest.mark.parametrize("seed", range(12))
def test_index_equals_brute_force_on_random_events(seed: int) -> None:
    rng = random.Random(1000 + seed)
    worker, paths = SimRadixWorker(rng, page=rng.choice([1, 2, 3])), []
    index, answers = WorkerEventIndex(), []
    for step in range(250):
        for event in decode_batch(encode_batch(random_operation(worker, rng, paths, SESSIONS))).events:
            index.apply(event)
        if step % 5 == 0:
            answers += _assert_same(index, worker, _queries(worker, rng, paths))
    answers += _assert_same(index, worker, _queries(worker, rng, paths, 40))
    # the sequence exercised resumable prefixes, on device and (partly) on host only
    assert sum(a.tokens > 0 for a in answers) > 20
    assert any(a.device_tokens < a.tokens for a in answers)


def _publish(worker, rng, paths, batches: int) -> list[bytes]:
    return [encode_batch(random_operation(worker, rng, paths, SESSIONS)) for _ in range(batches)]


@pytest.mark.parametrize("seed", range(8))
def test_lost_batches_are_detected_and_replayed(seed: int) -> None:
    """Random drops on the live stream (the first batches included: a late subscriber); the replay buffer holds
    everything, so each gap is replayed and the index equals the worker afterwards."""
    rng = random.Random(2000 + seed)
    worker, paths, feed = SimRadixWorker(rng, page=2), [], WorkerEventFeed()
    published = _publish(worker, rng, paths, 150)
    gaps = 0
    for seq, payload in enumerate(published):
        if rng.random() < 0.15 and seq < len(published) - 1:
            continue  # lost on the wire
        start = feed.on_live(seq, payload)
        if start is not None:
            gaps += 1
            feed.on_replay(list(enumerate(published))[start:seq + 1])
        assert feed.replaying_from is None
    assert gaps > 0 and feed.counts["gaps"] == gaps and feed.counts["replays"] == gaps
    assert feed.state == SYNCED
    _assert_same(feed.index, worker, _queries(worker, rng, paths, 40))


@pytest.mark.parametrize("seed", range(6))
def test_unreplayable_gap_leaves_a_partial_index_without_false_positives(seed: int) -> None:
    rng = random.Random(3000 + seed)
    worker, paths, feed = SimRadixWorker(rng, page=2), [], WorkerEventFeed()
    published = _publish(worker, rng, paths, 71)
    for seq in range(60):
        assert feed.on_live(seq, published[seq]) is None
    assert feed.state == SYNCED
    start = feed.on_live(70, published[70])  # 60..69 lost
    assert start == 60
    feed.on_replay([(s, published[s]) for s in range(65, 71)])  # the publisher's buffer starts too late
    assert feed.state == PARTIAL and feed.counts["resyncs"] == 1
    kinds = [kind for kind, _ in feed.take_problems()]
    assert kinds == ["replay_short", "lost"] and feed.take_problems() == []
    for seq in range(71, 120):  # the truth is the worker after each batch
        assert feed.on_live(seq, _publish(worker, rng, paths, 1)[0]) is None
        _assert_no_false_positive(feed.index, worker, _queries(worker, rng, paths))
    clear = worker.clear()
    more = [encode_batch(clear)] + _publish(worker, rng, paths, 30)
    for seq, payload in enumerate(more, start=120):
        feed.on_live(seq, payload)
    assert feed.state == SYNCED  # an AllBlocksCleared makes the index whole again
    _assert_same(feed.index, worker, _queries(worker, rng, paths, 40))


def test_live_copies_of_replayed_batches_are_duplicates_not_a_restart() -> None:
    rng = random.Random(9)
    worker, paths, feed = SimRadixWorker(rng, page=1), [], WorkerEventFeed()
    published = _publish(worker, rng, paths, 12)
    assert feed.on_live(5, published[5]) == 0  # a late subscriber
    feed.on_replay([(s, published[s]) for s in range(0, 9)])  # the replay ran ahead of the live stream
    for seq in range(6, 12):  # the live stream still carries 6..8
        assert feed.on_live(seq, published[seq]) is None
    assert feed.counts["duplicates"] == 3 and feed.counts["restarts"] == 0 and feed.state == SYNCED
    _assert_same(feed.index, worker, _queries(worker, rng, paths, 30))


def test_replay_failure_and_buffer_overrun_fall_back_to_partial() -> None:
    rng = random.Random(7)
    worker, paths = SimRadixWorker(rng, page=1), []
    published = _publish(worker, rng, paths, 9)
    feed = WorkerEventFeed(max_buffered=5)
    assert feed.on_live(3, published[3]) == 0  # subscribed late: replay from the publisher's first batch
    for seq in range(4, 9):
        assert feed.on_live(seq, published[seq]) is None
    assert feed.replaying_from is None and feed.state == PARTIAL  # the buffer overran: gave up the replay
    feed.on_replay([(s, published[s]) for s in range(0, 9)])  # a late answer changes nothing
    assert feed.expected == 9
    for seq in range(9, 40):
        feed.on_live(seq, _publish(worker, rng, paths, 1)[0])
        _assert_no_false_positive(feed.index, worker, _queries(worker, rng, paths))


def test_malformed_and_unknown_events_are_counted_and_do_not_stop_the_feed() -> None:
    rng = random.Random(11)
    worker, paths, feed = SimRadixWorker(rng, page=1), [], WorkerEventFeed()
    published = _publish(worker, rng, paths, 10)
    garbage = [b"\xc1not msgpack", msgspec.msgpack.encode({"no": "batch"}),
               encode_batch([{"type": "BlockStored", "block_hashes": ["x"], "block_size": 1, "token_ids": [1]}])]
    stream = published + garbage + [encode_batch([{"type": "SomethingNew", "x": 1}])]
    for seq, payload in enumerate(stream):
        assert feed.on_live(seq, payload) is None
    assert feed.state == PARTIAL
    for seq in range(len(stream), len(stream) + 20):
        assert feed.on_live(seq, _publish(worker, rng, paths, 1)[0]) is None
        _assert_no_false_positive(feed.index, worker, _queries(worker, rng, paths))
    assert feed.counts["malformed"] == 3 and feed.counts["unknown_events"] == 1
    kinds = [kind for kind, _ in feed.take_problems()]
    assert kinds.count("malformed") == 3 and "unknown_event" in kinds
    _assert_no_false_positive(feed.index, worker, _queries(worker, rng, paths, 30))


def test_publisher_restart_starts_the_feed_over() -> None:
    rng = random.Random(5)
    first, paths = SimRadixWorker(rng, page=1), []
    feed = WorkerEventFeed()
    for seq, payload in enumerate(_publish(first, rng, paths, 30)):
        feed.on_live(seq, payload)
    assert feed.state == SYNCED and len(feed.index) > 0
    second, paths2 = SimRadixWorker(rng, page=1), []
    restarted = _publish(second, rng, paths2, 10)
    assert feed.on_live(2, restarted[2]) == 0  # a new process: its seq is below ours; replay its start
    feed.on_replay([(s, restarted[s]) for s in range(3)])
    for seq in range(3, 10):
        feed.on_live(seq, restarted[seq])
    assert feed.counts["restarts"] == 1 and feed.state == SYNCED
    _assert_same(feed.index, second, _queries(second, rng, paths2, 30))


def test_index_overflow_empties_it_and_marks_partial() -> None:
    rng = random.Random(3)
    worker, paths = SimRadixWorker(rng, page=1), []
    feed = WorkerEventFeed(WorkerEventIndex(max_blocks=20))
    seq = 0
    while feed.counts["resyncs"] == 0 and seq < 500:
        feed.on_live(seq, encode_batch(worker.insert([rng.randrange(50) for _ in range(8)], "s0")))
        seq += 1
    assert feed.state == PARTIAL and len(feed.index) <= 20
    assert ("overflow" in {k for k, _ in feed.take_problems()})


def test_feed_state_before_any_event_is_none() -> None:
    feed = WorkerEventFeed()
    assert feed.state == NONE and feed.index.match_tokens([1, 2, 3]).tokens == 0


def test_decode_checks_every_field() -> None:
    good = {"type": "BlockStored", "block_hashes": [5, -6], "parent_block_hash": None, "token_ids": [1, 2, 3, 4],
            "block_size": 2, "lora_id": None, "medium": "CPU_PINNED", "session_id": "a"}
    batch = decode_batch(encode_batch([good, {"type": KDA_STORED, "block_hash": -6, "tokens": 4},
                                       {"type": "AllBlocksCleared"}]))
    assert batch.events == (BlocksStored((5, -6), None, (1, 2, 3, 4), 2, tier_bit("CPU_PINNED"), "a"),
                            CheckpointStored(-6, 4, tier_bit("GPU")), AllCleared())
    bad = [
        ({**good, "token_ids": [1, 2, 3]}, "token_ids"),
        ({**good, "block_hashes": [1 << 63]}, "64-bit"),
        ({**good, "block_hashes": [True]}, "64-bit"),
        ({**good, "block_size": 0}, "block_size"),
        ({**good, "medium": "HBM"}, "medium"),
        ({**good, "session_id": 3}, "session_id"),
        ({**good, "token_ids": [1, "a", 3, 4]}, "token_ids"),
        ({"type": KDA_STORED, "block_hash": 1, "tokens": 0}, "tokens"),
        ({"type": "BlockRemoved", "block_hashes": []}, "non-empty"),
        ({"type": 3}, "string 'type'"),
    ]
    for event, words in bad:
        with pytest.raises(MalformedEvents, match=words):
            decode_batch(encode_batch([event]))
    with pytest.raises(MalformedEvents):
        parse_seq(b"\x00\x01")
    assert parse_seq((-1).to_bytes(8, "big", signed=True)) == -1


def test_catch_up_on_subscribing() -> None:
    rng = random.Random(13)
    worker, paths = SimRadixWorker(rng, page=1), []
    quiet = WorkerEventFeed()
    assert quiet.catch_up() == 0 and quiet.catch_up() is None
    quiet.on_replay([])  # the publisher has sent nothing yet
    assert quiet.state == NONE and quiet.replaying_from is None
    published = _publish(worker, rng, paths, 8)
    feed = WorkerEventFeed()
    assert feed.catch_up() == 0
    assert feed.on_live(6, published[6]) is None  # live batches during the replay are buffered
    feed.on_replay([(s, published[s]) for s in range(6)])
    feed.on_live(7, published[7])
    assert feed.state == SYNCED and feed.counts["replays"] == 1 and feed.counts["gaps"] == 0
    _assert_same(feed.index, worker, _queries(worker, rng, paths, 20))


@pytest.mark.parametrize("seed", range(4))
def test_prefix_tokens_rebuild_what_a_session_stored(seed: int) -> None:
    rng = random.Random(4000 + seed)
    worker, paths, index = SimRadixWorker(rng, page=2), [], WorkerEventIndex()
    for _ in range(150):
        for event in decode_batch(encode_batch(random_operation(worker, rng, paths, SESSIONS))).events:
            index.apply(event)
    for session in SESSIONS:
        h = index.session_checkpoint(session)
        truth = worker.session_resumable(session)
        if h is None:
            assert truth.tokens == 0
            continue
        tokens = index.prefix_tokens(h)
        assert len(tokens) == truth.tokens == index.checkpoints[h][0]
        assert worker.resumable(tokens).tokens == len(tokens)  # the worker resumes exactly that prefix
