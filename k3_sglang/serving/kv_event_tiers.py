"""KDA checkpoint events for SGLang's HiCache host tier (issue 42), in the same stream as the device-tier ones.

`serving/kv_event_hooks.py` publishes a KDA state checkpoint when the radix tree keeps a state on the device and
its removal when the device slot is freed. With `--enable-hierarchical-cache` a state also lives in the host tier
(SGLang's `MambaPoolHost`): it is written there with its node's KV (write-through), it stays after the device copy
is evicted, and a resumed turn loads it back. SGLang publishes the KV blocks' host copies (BlockStored/Removed with
medium CPU_PINNED) but says nothing about the states. Three methods of the `k3` cache (serving/radix_cache.py), on
the cache's Python layer (the same for the Python and the Rust tree core), publish them with the tier in `medium`:

1. `_execute_kv_backup` (AROUND): a backup that got host slots for a node's KDA state (the MAMBA
   transfer in `comp_xfers`, host indices filled in place by the host pool group) -> `K3KdaCheckpointStored`
   medium CPU_PINNED for that node's checkpoint, and host slot -> checkpoint remembered.
2. `_drain_host_frees` (BEFORE; SGLang's one caller of `MambaComponent.free_host_values`): every MAMBA host slot we
   know that is freed -> `K3KdaCheckpointRemoved`
   medium CPU_PINNED.
3. `load_back` (AROUND): a load-back that gave the node a device state slot we do not map yet ->
   `K3KdaCheckpointStored` medium GPU (loaded back), device slot remembered, so its later eviction is published by
   the device hook as before.
A node's checkpoint is (SGLang's hash of its last block, the node's depth in tokens from `collect_path_info`).
Inert where the device hooks are (no events, no KDA states). Not covered: the storage tier (L3), whose objects
SGLang publishes no block events for; a state prefetched from L3 into the host tier is not announced.
"""

from __future__ import annotations

from typing import Any

from k3_sglang.serving.kv_event_hooks import DEVICE_MEDIUM, HOST_MEDIUM, _slot, event_log


def checkpoint_of(cache: Any, node_id: Any) -> tuple[int, int] | None:
    """(block hash, tokens) of the checkpoint a state on `node_id` is: the hash SGLang publishes for the node's last
    block and the node's depth in tokens; None without a hash."""
    from sglang.srt.mem_cache.utils import hash_str_to_int64

    hash_value = cache.tree_core.get_last_hash_value(node_id)
    if not hash_value:
        return None
    paths = cache.tree_core.collect_path_info([node_id])
    if not paths or not paths[0]:
        return None
    return hash_str_to_int64(hash_value), int(paths[0][-1].path_end)


def _mamba_transfers(comp_xfers: Any) -> list:
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    return list((comp_xfers or {}).get(ComponentType.MAMBA, ()))


def backup_with_checkpoint_event(original, cache, node_id, device_value, comp_xfers, *args, **kwargs):
    """(1) around SGLang's backup: SGLang's backup of one node, then the host-tier checkpoint event for its KDA state."""
    host_indices = original(cache, node_id, device_value, comp_xfers, *args, **kwargs)
    if host_indices is None:
        return host_indices
    states = [x for x in _mamba_transfers(comp_xfers) if x.host_indices is not None and x.host_indices.numel()]
    events = event_log(cache) if states else None
    if events is None:
        return host_indices
    checkpoint = checkpoint_of(cache, node_id)
    if checkpoint is not None:
        for transfer in states:
            events.stored(cache, _slot(transfer.host_indices), *checkpoint, None, medium=HOST_MEDIUM)
    return host_indices


def note_freed_host_checkpoints(cache, host_frees) -> None:
    """(2) before SGLang drains a cache's host frees ({component type: [host slot tensors]}): each MAMBA host slot
    we know -> a host-tier checkpoint-removed event."""
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    host_values = (host_frees or {}).get(ComponentType.MAMBA)
    events = event_log(cache) if host_values else None
    if events is None or not events.by_medium[HOST_MEDIUM]:
        return
    for indices in host_values:
        if indices is None:
            continue
        for slot in indices.reshape(-1).tolist():
            events.removed(cache, int(slot), HOST_MEDIUM)


def load_back_with_checkpoint_event(original, cache, node_id, *args, **kwargs):
    """(3) around SGLang's load_back: SGLang's host-to-device load-back, then the device-tier event for the state it restored."""
    loaded = original(cache, node_id, *args, **kwargs)
    if not loaded:
        return loaded
    events = event_log(cache)
    if events is None:
        return loaded
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    value = cache.tree_core.get_component_device_value(node_id, ComponentType.MAMBA)
    if value is None or not value.numel():
        return loaded
    checkpoint = checkpoint_of(cache, node_id)
    slot = _slot(value)
    if checkpoint is not None and events.slots.get(slot) != checkpoint:
        events.stored(cache, slot, *checkpoint, None, medium=DEVICE_MEDIUM)
    return loaded
