"""KV-cache events as the router reads them: SGLang's wire format plus K3's KDA checkpoint events. Pure.

A worker's ZMQ publisher (SGLang 0.5.23, `disaggregation/kv_events.py`) sends multipart messages
`(topic, seq: 8-byte big-endian, payload)`; the payload is a msgpack array `[ts, events, attn_dp_rank]`
and each event a msgpack map tagged by `type`:
- `BlockStored` {block_hashes, parent_block_hash, token_ids, block_size, medium, session_id, ...}: blocks
  of one radix path, each `block_size` tokens, chained on `parent_block_hash` (None: the root);
- `BlockRemoved` {block_hashes, medium}; `AllBlocksCleared` {}.
`k3 serve` adds, through our SGLang plugin (`k3_sglang/serving/kv_event_hooks.py`), two more in the same
batches, so one sequence number orders them with SGLang's own:
- `K3KdaCheckpointStored` {block_hash, tokens, medium, session_id}: a KDA state checkpoint (the recurrent
  state after `tokens` tokens) saved at the end of block `block_hash`; a prefix is resumable only up to
  such a checkpoint;
- `K3KdaCheckpointRemoved` {block_hash, medium}: that checkpoint was dropped (its KV blocks may stay).
`medium` is the tier: GPU (device), CPU_PINNED (host), DISK, EXTERNAL (L3); absent means GPU.
Anything that does not fit this shape raises `MalformedEvents` naming what is wrong; an event type we do
not know is skipped and counted (a newer SGLang may add some).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

KDA_STORED = "K3KdaCheckpointStored"
KDA_REMOVED = "K3KdaCheckpointRemoved"
TIERS = {"GPU": 1, "CPU_PINNED": 2, "DISK": 4, "EXTERNAL": 8}
DEVICE = TIERS["GPU"]
END_OF_REPLAY = -1  # the seq SGLang's replay socket sends after the last buffered batch
_INT64 = (-(1 << 63), (1 << 63) - 1)


class MalformedEvents(ValueError):
    """A payload or event that does not follow the wire format; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class BlocksStored:
    """Blocks of one radix path stored in tier `tier`; block i holds token_ids[i*size:(i+1)*size]."""

    block_hashes: tuple[int, ...]
    parent: int | None
    token_ids: tuple
    block_size: int
    tier: int
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    """Blocks dropped from tier `tier`."""

    block_hashes: tuple[int, ...]
    tier: int


@dataclass(frozen=True, slots=True)
class AllCleared:
    """The worker's cache was emptied (e.g. /flush_cache)."""


@dataclass(frozen=True, slots=True)
class CheckpointStored:
    """A KDA state checkpoint after `tokens` tokens, at the end of block `block_hash`, in tier `tier`."""

    block_hash: int
    tokens: int
    tier: int
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class CheckpointRemoved:
    """The KDA checkpoint at the end of block `block_hash` left tier `tier`."""

    block_hash: int
    tier: int


Event = BlocksStored | BlocksRemoved | AllCleared | CheckpointStored | CheckpointRemoved


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """One published batch: its events in order, and how many events of unknown type were skipped."""

    events: tuple[Event, ...]
    unknown: int = 0


def parse_seq(frame: bytes) -> int:
    """The sequence number of a multipart message (8 bytes, big-endian, signed; -1 ends a replay)."""
    if len(frame) != 8:
        raise MalformedEvents(f"sequence frame of {len(frame)} bytes, expected 8")
    return int.from_bytes(frame, "big", signed=True)


def decode_batch(payload: bytes) -> DecodedBatch:
    """Decode one msgpack payload `[ts, events, dp_rank]` into typed events (MalformedEvents if it is not one)."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        raise MalformedEvents(f"payload is not msgpack ({exc})") from None
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise MalformedEvents("payload is not an event batch [ts, events, dp_rank]")
    events: list[Event] = []
    unknown = 0
    for i, item in enumerate(raw[1]):
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            raise MalformedEvents(f"event {i} is not a map with a string 'type'")
        parser = _PARSERS.get(item["type"])
        if parser is None:
            unknown += 1
            continue
        try:
            events.append(parser(item))
        except MalformedEvents as exc:
            raise MalformedEvents(f"event {i} ({item['type']}): {exc}") from None
    return DecodedBatch(tuple(events), unknown)


def encode_batch(events: Sequence[dict], ts: float = 0.0) -> bytes:
    """The msgpack payload of a batch of raw event maps (for simulated publishers and tests)."""
    return msgspec.msgpack.encode([ts, list(events), 0])


def _int64(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not _INT64[0] <= value <= _INT64[1]:
        raise MalformedEvents(f"{name} must be a 64-bit integer, got {value!r}")
    return value


def _hashes(item: dict, name: str) -> tuple[int, ...]:
    values = item.get(name)
    if not isinstance(values, list) or not values:
        raise MalformedEvents(f"{name} must be a non-empty list")
    return tuple(_int64(v, name) for v in values)


def _tier(item: dict) -> int:
    medium = item.get("medium")
    if medium is None:
        return DEVICE
    tier = TIERS.get(medium) if isinstance(medium, str) else None
    if tier is None:
        raise MalformedEvents(f"medium must be one of {', '.join(TIERS)}, got {medium!r}")
    return tier


def _session(item: dict) -> str | None:
    session = item.get("session_id")
    if session is not None and not isinstance(session, str):
        raise MalformedEvents(f"session_id must be a string, got {session!r}")
    return session


def _token(value: Any) -> int | tuple:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)  # EAGLE bigram pages publish token pairs
    raise MalformedEvents(f"token_ids holds {value!r}")


def _stored(item: dict) -> BlocksStored:
    hashes = _hashes(item, "block_hashes")
    parent = item.get("parent_block_hash")
    parent = None if parent is None else _int64(parent, "parent_block_hash")
    size = item.get("block_size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise MalformedEvents(f"block_size must be a positive integer, got {size!r}")
    tokens = item.get("token_ids")
    if not isinstance(tokens, list) or len(tokens) != len(hashes) * size:
        got = len(tokens) if isinstance(tokens, list) else type(tokens).__name__
        raise MalformedEvents(f"token_ids must hold block_size x blocks = {len(hashes) * size} ids, got {got}")
    return BlocksStored(hashes, parent, tuple(_token(t) for t in tokens), size, _tier(item), _session(item))


def _removed(item: dict) -> BlocksRemoved:
    return BlocksRemoved(_hashes(item, "block_hashes"), _tier(item))


def _checkpoint_stored(item: dict) -> CheckpointStored:
    tokens = item.get("tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise MalformedEvents(f"tokens must be a positive integer, got {tokens!r}")
    return CheckpointStored(_int64(item.get("block_hash"), "block_hash"), tokens, _tier(item), _session(item))


def _checkpoint_removed(item: dict) -> CheckpointRemoved:
    return CheckpointRemoved(_int64(item.get("block_hash"), "block_hash"), _tier(item))


_PARSERS = {
    "BlockStored": _stored,
    "BlockRemoved": _removed,
    "AllBlocksCleared": lambda item: AllCleared(),
    KDA_STORED: _checkpoint_stored,
    KDA_REMOVED: _checkpoint_removed,
}
