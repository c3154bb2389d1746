"""Event-fed arms of `k3 router replay --events`: simulated workers that publish KV events, and our policy fed by
them. Pure; no HTTP, no threads.

`EventSimEngine` is `SimEngine` (replay_sim.py) plus what the live path has around it:
- it publishes what its caches do as KV events, one batch per request, through the router's own decoder and
  `WorkerEventFeed` (one published token id per 512-token trace block, `unit_tokens` 512): BlockStored /
  BlockRemoved per block, K3KdaCheckpointStored / Removed per saved state;
- an optional host tier (`host_factor` x the device's blocks and states): what the device evicts moves there and
  a hit on it is loaded back at `host_load_tps` before the prefill (a prefetch starts that load when the turn
  arrives instead of when it is admitted);
- retention: a turn that asked for it pins its blocks and state for `retain_s` after it finishes, within
  `retain_share` of the device blocks and state slots (over-share: the pins expiring soonest go first).
The arms share that engine (same caches, same tiers) and differ only in the policy:
- `k3_text`: our policy on text inference (the events are published but not read);
- `k3_events`: placed by the events (event_placement.py), inference only where they say nothing;
- `k3_events_retain_prefetch`: plus every session asking for `retain_s` and prefetch (prefetch.py) on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.event_feed import WorkerEventFeed
from k3_sglang.router.event_index import WorkerEventIndex
from k3_sglang.router.kv_events import KDA_REMOVED, KDA_STORED, encode_batch
from k3_sglang.router.policy import RouteRequest
from k3_sglang.router.prefetch import plan_prefetch
from k3_sglang.tooling.router.replay_sim import BLOCK_TOKENS, FleetSpec, SessionPolicy, SimEngine, TraceRequest

GPU, HOST = "GPU", "CPU_PINNED"


@dataclass(frozen=True)
class EventArm:
    """One event-fed arm: whether the policy reads events, the retention sessions ask for, prefetch, the host tier."""

    name: str
    events: bool = True
    retain_s: float = 0.0
    retain_share: float = 0.25
    prefetch: bool = False
    host_factor: float = 1.0
    host_load_tps: float = 100_000.0


def event_arms(retain_s: float = 300.0, host_factor: float = 1.0) -> dict[str, EventArm]:
    """The three arms compared by `k3 router replay --events`."""
    arms = (EventArm("k3_text", events=False), EventArm("k3_events"),
            EventArm("k3_events_retain_prefetch", retain_s=retain_s, prefetch=True))
    return {a.name: EventArm(**{**a.__dict__, "host_factor": host_factor}) for a in arms}


@dataclass
class EventSimEngine(SimEngine):
    """A simulated worker that publishes its cache as KV events, with a host tier and retention pins."""

    feed: WorkerEventFeed = field(default_factory=WorkerEventFeed)
    arm: EventArm = field(default_factory=lambda: EventArm("plain"))
    host_blocks: OrderedDict = field(default_factory=OrderedDict)
    host_states: OrderedDict = field(default_factory=OrderedDict)
    parent: dict = field(default_factory=dict)   # block id -> the block before it on its path
    pins: dict = field(default_factory=dict)     # session -> (until, block ids, state id)
    pinned: dict = field(default_factory=dict)   # block or state id -> pin count
    prefetch_next: bool = False                  # set by the policy for the request it just placed here
    session_next: str | None = None
    seq: int = 0
    pending: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self._publish()  # seq 0: the feed knows it has seen everything from the start

    def resumable_blocks(self, hash_ids: Sequence[int], full: int) -> tuple[int, int]:
        """(leading blocks resumable from the device alone, from any tier): ends at a saved state."""
        device, anywhere, on_device = 0, 0, True
        for i in range(full):
            h = hash_ids[i]
            in_device = h in self.blocks
            if not in_device and h not in self.host_blocks:
                break
            on_device = on_device and in_device
            if h in self.states or h in self.host_states:
                anywhere = i + 1
                if on_device and h in self.states:
                    device = i + 1
        return device, anywhere

    def resume(self, t: float, req: TraceRequest, full: int) -> tuple[int, float, float | None]:
        device, anywhere = self.resumable_blocks(req.hash_ids, full)
        cached = min(req.input_length, anywhere * BLOCK_TOKENS)
        load_s = max(0, cached - device * BLOCK_TOKENS) / self.arm.host_load_tps
        load_from = t if self.prefetch_next else None
        self.prefetch_next = False
        return cached, load_s, load_from

    def admit(self, t: float, req: TraceRequest) -> tuple[float, float, int]:
        session, self.session_next = self.session_next, None
        first_token, finish, cached = super().admit(t, req)
        full = min(len(req.hash_ids), req.input_length // BLOCK_TOKENS)
        if self.arm.retain_s > 0 and session is not None and full:
            self._pin(session, finish + self.arm.retain_s, req.hash_ids[:full], t)
        self._publish()
        return first_token, finish, cached

    # ---- caches ------------------------------------------------------------------------------
    # A block and its state leave and return to the device together; a state alone may also leave (state LRU).
    def _remember(self, hash_ids: Sequence[int], full: int) -> None:
        run = None
        for i, h in enumerate(hash_ids[:full]):
            parent = hash_ids[i - 1] if i else None
            self.parent[h] = parent
            if h in self.blocks:
                self.blocks.move_to_end(h)
                run = None
                continue
            self.blocks[h] = True
            if run is None:
                run = {"type": "BlockStored", "block_hashes": [], "parent_block_hash": parent, "token_ids": [],
                       "block_size": 1, "lora_id": None, "medium": GPU}
                self.pending.append(run)
            run["block_hashes"].append(h)
            run["token_ids"].append(h)
            if self.host_blocks.pop(h, None):  # loaded back from the host tier, its state with it
                self._event("BlockRemoved", [h], HOST)
                run = None
                tokens = self.host_states.pop(h, None)
                if tokens is not None:
                    self.states[h] = tokens
                    self.pending.append({"type": KDA_STORED, "block_hash": h, "tokens": tokens, "medium": GPU})
        if full:
            last = hash_ids[full - 1]
            if self.host_states.pop(last, None) is not None:
                self.pending.append({"type": KDA_REMOVED, "block_hash": last, "medium": HOST})
            if last not in self.states:
                self.pending.append({"type": KDA_STORED, "block_hash": last, "tokens": full, "medium": GPU})
            self.states.pop(last, None)
            self.states[last] = full
        self._evict(self.blocks, self.spec.kv_tokens // BLOCK_TOKENS, self._block_out)
        self._evict(self.states, self.spec.state_slots, self._state_out)

    def _evict(self, cache: OrderedDict, capacity: int, out) -> None:
        skipped = 0
        while len(cache) > capacity and skipped <= len(cache):
            h, value = next(iter(cache.items()))
            if self.pinned.get(h):
                cache.move_to_end(h)  # retained: stays (behaves as recently used)
                skipped += 1
                continue
            del cache[h]
            out(h, value)

    def _block_out(self, h: int, _) -> None:
        tokens = self.states.pop(h, None)
        if self.arm.host_factor <= 0:
            self._event("BlockRemoved", [h], GPU)
            return
        self.host_blocks[h] = True  # backed up to the host first, then dropped from the device (as HiCache does)
        self.pending.append({"type": "BlockStored", "block_hashes": [h], "parent_block_hash": self.parent.get(h),
                             "token_ids": [h], "block_size": 1, "lora_id": None, "medium": HOST})
        self._event("BlockRemoved", [h], GPU)
        if tokens is not None:
            self._state_to_host(h, tokens)
        while len(self.host_blocks) > int(self.arm.host_factor * self.spec.kv_tokens // BLOCK_TOKENS):
            gone, _ = self.host_blocks.popitem(last=False)
            self._event("BlockRemoved", [gone], HOST)
            self.host_states.pop(gone, None)

    def _state_out(self, h: int, tokens: int) -> None:
        self.pending.append({"type": KDA_REMOVED, "block_hash": h, "medium": GPU})
        if self.arm.host_factor > 0:
            self._state_to_host(h, tokens)

    def _state_to_host(self, h: int, tokens: int) -> None:
        self.host_states[h] = tokens
        self.pending.append({"type": KDA_STORED, "block_hash": h, "tokens": tokens, "medium": HOST})
        while len(self.host_states) > int(self.arm.host_factor * self.spec.state_slots):
            gone, _ = self.host_states.popitem(last=False)
            self.pending.append({"type": KDA_REMOVED, "block_hash": gone, "medium": HOST})

    def _event(self, kind: str, hashes: list, medium: str) -> None:
        self.pending.append({"type": kind, "block_hashes": hashes, "medium": medium})

    # ---- retention ---------------------------------------------------------------------------
    def _pin(self, session: str, until: float, blocks: Sequence[int], now: float) -> None:
        for key in [k for k, (end, _, _) in self.pins.items() if end <= now or k == session]:
            self._unpin(key)
        max_blocks = int(self.arm.retain_share * self.spec.kv_tokens // BLOCK_TOKENS)
        max_states = int(self.arm.retain_share * self.spec.state_slots)
        if len(blocks) > max_blocks or max_states < 1:
            return  # larger than the whole share: trimmed
        while self.pins and (sum(len(b) for _, b, _ in self.pins.values()) + len(blocks) > max_blocks
                             or len(self.pins) >= max_states):
            self._unpin(min(self.pins, key=lambda k: self.pins[k][0]))
        self.pins[session] = (until, tuple(blocks), blocks[-1])
        for h in (*blocks, blocks[-1]):
            self.pinned[h] = self.pinned.get(h, 0) + 1

    def _unpin(self, session: str) -> None:
        _, blocks, state = self.pins.pop(session)
        for h in (*blocks, state):
            self.pinned[h] -= 1
            if not self.pinned[h]:
                del self.pinned[h]

    def _publish(self) -> None:
        self.feed.on_live(self.seq, encode_batch(self.pending))
        self.seq, self.pending = self.seq + 1, []


class EventFedPolicy(SessionPolicy):
    """Our policy on simulated workers that publish KV events (`arm.events`: whether it reads them)."""

    def __init__(self, spec: FleetSpec, policy: PolicyConfig, arm: EventArm) -> None:
        super().__init__(spec, policy)
        self.name, self.spec, self.arm = arm.name, spec, arm
        self.engines: dict[int, EventSimEngine] = {}

    def make_engine(self, i: int) -> EventSimEngine:
        """The simulated worker `i`, publishing into the feed the router reads (or a private one)."""
        feed = self.core.event_feed(self.ids[i]) if self.arm.events else WorkerEventFeed()
        feed.index = WorkerEventIndex(feed.index.max_blocks, unit_tokens=BLOCK_TOKENS)
        engine = self.engines[i] = EventSimEngine(self.spec, feed=feed, arm=self.arm)
        return engine

    def request_for(self, req: TraceRequest, session_id: str) -> RouteRequest:
        base = super().request_for(req, session_id)
        token_ids = (*req.full_blocks, -1) if self.arm.events else None  # one id per block, then the tail
        return RouteRequest(base.session_id, base.context_tokens, base.growth_tokens, base.session_keys, base.derived,
                            token_ids, self.arm.retain_s)

    def route(self, req: TraceRequest, now: float):
        worker, ticket = super().route(req, now)
        if worker is not None:
            engine = self.engines[worker]
            engine.session_next = ticket.session_id
            if self.arm.prefetch:
                token_ids = (*req.full_blocks, -1)
                engine.prefetch_next = plan_prefetch(engine.feed, ticket.session_id, token_ids,
                                                     self.core.policy.prefetch_min_tokens) is not None
        return worker, ticket
