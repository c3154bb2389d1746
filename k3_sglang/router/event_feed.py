"""Sequence numbers, gaps and resync for one worker's event stream, feeding its `WorkerEventIndex`. Pure.

SGLang numbers each published batch 0, 1, 2, ... per publisher process and keeps the last `buffer_steps`
batches for replay (a ROUTER socket answers a start seq with every buffered batch from it on, then seq -1).
The feed's states:
- `none`: nothing received yet (or the worker restarted): placement infers from request text;
- `synced`: every batch since the publisher started (or since an AllBlocksCleared) was applied: the index is
  the worker's cache, and placement trusts it;
- `partial`: a gap could not be replayed, a payload was malformed or the index overflowed: the index was
  emptied and only what came after is known, so it has no false positives but may miss older blocks;
  placement takes the larger of it and the text inference. An AllBlocksCleared makes it `synced` again.
On a gap (first seq above the expected one, including a first batch > 0: events sent before we subscribed)
`on_live` returns the seq to replay from and buffers live batches until `on_replay` (or `replay_failed`).
A seq below the expected one means the publisher restarted (a new process counts from 0): the index is
emptied and the feed starts over; except right after a replay, when live copies of replayed batches may still
be queued (counted as duplicates).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from k3_sglang.router.event_index import WorkerEventIndex
from k3_sglang.router.kv_events import AllCleared, MalformedEvents, decode_batch

NONE, SYNCED, PARTIAL = "none", "synced", "partial"


@dataclass
class WorkerEventFeed:
    """The event stream of one worker (one DP rank) and the index it keeps."""

    index: WorkerEventIndex = field(default_factory=WorkerEventIndex)
    max_buffered: int = 10_000
    state: str = NONE
    expected: int | None = None
    replaying_from: int | None = None
    replayed_upto: int | None = None  # live copies of replayed batches may still be queued: not a restart
    buffered: list = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    problems: list = field(default_factory=list)  # (kind, detail) not yet reported; the I/O layer logs them

    def on_live(self, seq: int, payload: bytes) -> int | None:
        """A batch from the live stream; returns the seq to ask the replay socket for when a gap opened."""
        self.counts["batches"] += 1
        if self.replaying_from is not None:
            self.buffered.append((seq, payload))
            if len(self.buffered) > self.max_buffered:
                self._note("replay_overrun", f"{len(self.buffered)} batches arrived while a replay was pending")
                self.replay_failed()
            return None
        if self.expected is not None and seq < self.expected:
            if self.replayed_upto is not None and seq <= self.replayed_upto:
                self.counts["duplicates"] += 1
                return None
            self.counts["restarts"] += 1
            self._note("restart", f"seq went back from {self.expected} to {seq}: publisher restarted")
            self.index.clear()
            self.state, self.expected = NONE, None
        self.replayed_upto = None
        start = 0 if self.expected is None else self.expected
        if seq > start:
            self.counts["gaps"] += 1
            self.replaying_from = start
            self.buffered = [(seq, payload)]
            return start
        self._apply(seq, payload)
        return None

    def catch_up(self) -> int | None:
        """On subscribing: the seq to replay from (0) when nothing was applied yet, so the publisher's history
        (its buffer) comes first; None when there is nothing to catch up on."""
        if self.expected is not None or self.replaying_from is not None:
            return None
        self.replaying_from = 0
        return 0

    def on_replay(self, batches: list[tuple[int, bytes]]) -> None:
        """The replay socket's answer to `replaying_from` (batches in seq order, END marker excluded)."""
        start = self.replaying_from
        if start is None:
            return
        merged = sorted(dict([(s, p) for s, p in batches if s >= start] + self.buffered).items())
        if not merged:  # the publisher has sent nothing yet
            self.replaying_from = None
            return
        if merged[0][0] != start:
            self._note("replay_short", f"asked replay from seq {start}, the publisher's buffer starts at "
                                       f"{merged[0][0]}")
            self.replay_failed()
            return
        self.counts["replays"] += 1
        self.replaying_from, self.buffered = None, []
        for seq, payload in merged:
            if seq < self.expected_or(start):
                continue  # a live batch the replay also carried
            if seq > self.expected_or(start):
                self._lose(f"seq {self.expected_or(start)}..{seq - 1} missing after replay")
            self._apply(seq, payload)
        self.replayed_upto = self.expected - 1 if self.expected is not None else None

    def replay_failed(self) -> None:
        """The gap cannot be filled (no replay socket, timeout, buffer overrun): keep only what follows it."""
        self.replaying_from, pending, self.buffered = None, self.buffered, []
        self._lose("events lost and not replayable")
        for seq, payload in sorted(pending, key=lambda b: b[0]):
            if self.expected is not None and seq < self.expected:
                continue
            self._apply(seq, payload)

    def reset(self) -> None:
        """Forget the worker's cache (it was removed or went down); the next batch starts the feed over."""
        self.index.clear()
        self.state, self.expected, self.replaying_from, self.buffered = NONE, None, None, []
        self.replayed_upto = None

    def expected_or(self, default: int) -> int:
        return default if self.expected is None else self.expected

    def take_problems(self) -> list[tuple[str, str]]:
        """Problems noted since the last call (for logging), oldest first."""
        out, self.problems = self.problems, []
        return out

    # ---- internals -----------------------------------------------------------------------
    def _apply(self, seq: int, payload: bytes) -> None:
        self.expected = seq + 1
        if self.state == NONE and seq == 0:
            self.state = SYNCED
        try:
            batch = decode_batch(payload)
        except MalformedEvents as exc:
            self.counts["malformed"] += 1
            self._lose(f"malformed batch {seq}: {exc}", kind="malformed")
            return
        if batch.unknown:
            self.counts["unknown_events"] += batch.unknown
            self._note("unknown_event", f"batch {seq} has {batch.unknown} event(s) of unknown type (skipped)")
        for event in batch.events:
            self.index.apply(event)
            if isinstance(event, AllCleared):
                self.state = SYNCED
        self.counts["events"] += len(batch.events)
        if self.index.overflowed:
            self.index.overflowed = False
            self._lose(f"index passed {self.index.max_blocks} blocks", kind="overflow")
        elif self.state == NONE:
            self.state = PARTIAL  # the first batch we could read was not the publisher's first

    def _lose(self, detail: str, kind: str = "lost") -> None:
        self.counts["resyncs"] += 1
        self._note(kind, detail)
        self.index.clear()
        self.state = PARTIAL

    def _note(self, kind: str, detail: str) -> None:
        if len(self.problems) < 64:
            self.problems.append((kind, detail))


def event_status(feed: WorkerEventFeed | None) -> dict:
    """JSON view of a worker's event feed (GET /workers): state, index size and counters."""
    if feed is None:
        return {"state": NONE}
    return {"state": feed.state, "blocks": len(feed.index), "kda_checkpoints": len(feed.index.checkpoints),
            "next_seq": feed.expected, **dict(feed.counts)}
