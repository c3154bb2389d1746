"""SGLang general plugin (`sglang.srt.plugins` entry point `k3_session_cache`): registers the `k3` radix-cache backend
(serving/radix_cache.py), whose cache publishes KDA checkpoint events in SGLang's KV-event stream (this module) and
keeps finished sessions (serving/retention.py).

SGLang 0.5.23's radix caches publish BlockStored / BlockRemoved for full-attention KV blocks only; for a hybrid
model a prefix is resumable only where a KDA (mamba) state was saved, and SGLang says nothing when such a state
is stored or dropped. In its unified radix cache (K3's: FULL + MAMBA components, Rust or Python tree core) a
state is handed to the tree by `UnifiedRadixCache.insert(params)` with `params.mamba_value` (one state slot),
lands on the node the insert ends on, and leaves the tree only through the cache's `_apply_cache_action(
FreeComponentDeviceSlot(component_type=MAMBA))` (evictions, the per-path state cap, leaf eviction) or a reset. Four
methods of the `k3` cache (K3RadixCache) call the functions here:

1. `insert` (AROUND): after an insert that kept its state (`not result.mamba_exist`), queue
   `K3KdaCheckpointStored{block_hash, tokens, session_id}`: the hash SGLang publishes for the last block of the
   inserted key (`tree_core.get_last_hash_value` of the node it ended on), the key's length, the request's
   session; and remember state slot -> checkpoint.
2. `_apply_cache_action` (BEFORE): for each freed MAMBA slot we know, queue `K3KdaCheckpointRemoved`.
3. `take_events` (AROUND): our queued events go out before what SGLang recorded since, in the
   same batch (`SchedulerKvEventsPublisher.publish_kv_events` takes them once per scheduler step), so one
   sequence number orders both. Before queueing, we first move what SGLang recorded so far into our queue, so
   the order inside a batch is the order things happened.
4. `reset` (AFTER): every slot is forgotten (SGLang publishes AllBlocksCleared).
All four are inert unless the cache records events (`--kv-events-config`, publisher rank) and has a MAMBA
component; the plugin registers nothing unless `k3 serve` started the server (`K3_SERVE_HOOKS=1`).
A slot stored again while we still map it (a free we did not see) first publishes the old checkpoint's removal.
The router reads these events in `k3_sglang/router/kv_events.py` (tags `KDA_STORED`, `KDA_REMOVED`). With HiCache
the same events carry the host tier (medium CPU_PINNED) and loads back to the device: `serving/kv_event_tiers.py`.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from k3_sglang.router.kv_events import KDA_REMOVED, KDA_STORED
from k3_sglang.serving.kv_events_config import HOOKS_ENV
from k3_sglang.sglang_guard import sglang_plugin

log = logging.getLogger(__name__)

LOG_ATTR = "_k3_kda_event_log"
DEVICE_MEDIUM, HOST_MEDIUM = "GPU", "CPU_PINNED"  # SGLang's StorageMedium values


def _event_types():
    """The two msgspec event structs, built on SGLang's tagged KVCacheEvent (imported lazily: SGLang only)."""
    from sglang.srt.disaggregation.kv_events import KVCacheEvent

    class KdaCheckpointStored(KVCacheEvent, tag=KDA_STORED):
        block_hash: int
        tokens: int
        medium: Optional[str] = None
        session_id: Optional[str] = None

    class KdaCheckpointRemoved(KVCacheEvent, tag=KDA_REMOVED):
        block_hash: int
        medium: Optional[str] = None

    return KdaCheckpointStored, KdaCheckpointRemoved


class KdaEventLog:
    """Per cache: our events not yet taken, and per tier, state slot -> (block hash, tokens) of the checkpoint it
    holds (device slots of SGLang's mamba pool under GPU, host slots of its MambaPoolHost under CPU_PINNED)."""

    def __init__(self) -> None:
        self.pending: list = []
        self.by_medium: dict[str, dict[int, tuple[int, int]]] = {DEVICE_MEDIUM: {}, HOST_MEDIUM: {}}
        self.stored_type, self.removed_type = _event_types()
        self.missing_hash = 0

    @property
    def slots(self) -> dict[int, tuple[int, int]]:
        """Device state slot -> (block hash, tokens)."""
        return self.by_medium[DEVICE_MEDIUM]

    def stored(self, cache: Any, slot: int, block_hash: int, tokens: int, session_id: str | None,
               medium: str = DEVICE_MEDIUM) -> None:
        slots = self.by_medium[medium]
        if slot in slots:
            self.removed(cache, slot, medium)
        self._drain(cache)
        slots[slot] = (block_hash, tokens)
        self.pending.append(self.stored_type(block_hash=block_hash, tokens=tokens, medium=medium,
                                             session_id=session_id))

    def removed(self, cache: Any, slot: int, medium: str = DEVICE_MEDIUM) -> None:
        entry = self.by_medium[medium].pop(slot, None)
        if entry is None:
            return
        self._drain(cache)
        self.pending.append(self.removed_type(block_hash=entry[0], medium=medium))

    def clear(self) -> None:
        for slots in self.by_medium.values():
            slots.clear()

    def _drain(self, cache: Any) -> None:
        """Move what SGLang recorded so far ahead of the event about to be queued."""
        self.pending.extend(cache.tree_core.take_events())


def event_log(cache: Any) -> KdaEventLog | None:
    """The cache's log, created on first use; None when the cache publishes no events or keeps no KDA states."""
    found = cache.__dict__.get(LOG_ATTR, False)
    if found is not False:
        return found
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    recorder = getattr(getattr(cache, "tree_core", None), "kv_events", None)
    publishes = bool(getattr(recorder, "enabled", False)) and not getattr(cache, "disable", True)
    has_states = ComponentType.MAMBA in getattr(cache, "components", {})
    found = KdaEventLog() if publishes and has_states else None
    cache.__dict__[LOG_ATTR] = found
    return found


def _slot(value: Any) -> int:
    return int(value.reshape(-1)[0].item())


def insert_with_checkpoint_event(original, cache, params, *args, **kwargs):
    """(1) around SGLang's insert: SGLang's insert, then the checkpoint-stored event when the tree kept the state."""
    result = original(cache, params, *args, **kwargs)
    if params.mamba_value is None or result.mamba_exist or result.last_device_node is None:
        return result
    if getattr(result, "rotation_tail_declined", False) or params.key is None or len(params.key) == 0:
        return result
    events = event_log(cache)
    if events is None:
        return result
    hash_value = cache.tree_core.get_last_hash_value(result.last_device_node)
    if not hash_value:
        events.missing_hash += 1
        if events.missing_hash == 1:
            log.warning("KDA checkpoint without a block hash (node %s): not published", result.last_device_node)
        return result
    from sglang.srt.mem_cache.utils import hash_str_to_int64

    events.stored(cache, _slot(params.mamba_value), hash_str_to_int64(hash_value), len(params.key),
                  params.session_id)
    return result


def note_freed_checkpoints(cache, action) -> None:
    """(2) before SGLang applies a cache action: a MAMBA device slot freed -> the checkpoint-removed event."""
    if type(action).__name__ != "FreeComponentDeviceSlot":
        return
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    if action.component_type != ComponentType.MAMBA:
        return
    queued = event_log(cache)
    if queued is None or not queued.slots:
        return
    for indices in action.indices:
        for slot in indices.reshape(-1).tolist():
            queued.removed(cache, int(slot))


def take_events_with_checkpoints(original, cache, *args, **kwargs):
    """(3) around SGLang's take_events: our queued events, then what SGLang recorded after them."""
    events = original(cache, *args, **kwargs)
    queued = cache.__dict__.get(LOG_ATTR)
    if not queued or not queued.pending:
        return events
    out, queued.pending = queued.pending + list(events), []
    return out


def forget_checkpoints_on_reset(result, cache, *args, **kwargs):
    """(4) after SGLang's reset: the tree is empty; so is our slot map."""
    queued = cache.__dict__.get(LOG_ATTR)
    if queued:
        queued.clear()
    return result


@sglang_plugin
def register() -> None:
    """Entry point `k3_session_cache`: when `k3 serve` started this server, register the `k3` radix-cache backend
    (serving/radix_cache.py) and the CURVE publisher with SGLang."""
    if os.environ.get(HOOKS_ENV) != "1":
        return
    from k3_sglang.serving import radix_cache
    from k3_sglang.serving.kv_events_curve import register_publisher

    radix_cache.register()
    register_publisher()  # `k3_zmq_curve`, the CURVE-protected publisher k3 serve names off loopback
