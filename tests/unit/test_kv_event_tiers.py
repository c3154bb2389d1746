"""KDA checkpoint events for the HiCache host tier (serving/kv_event_tiers.py) on a stand-in cache: a backup that
got a host slot for a node's state publishes it with medium CPU_PINNED, a freed host slot publishes its removal, a
load-back publishes the state it restored to the device (whose later eviction the device hook publishes), all in
the router's decoding and in the order things happened. The hook targets and the SGLang fields they read are
checked against the installed SGLang in test_kv_event_hooks.py (PARAMETERS) and here."""

from __future__ import annotations

import inspect
import pkgutil
from types import SimpleNamespace

import torch

from k3_sglang.router.kv_events import CheckpointRemoved, CheckpointStored, TIERS
from k3_sglang.serving import kv_event_hooks as hooks
from k3_sglang.serving import kv_event_tiers as tiers

from tests.unit.test_kv_event_hooks import FakeCache, _free, _insert, _published

HOST, DEVICE = TIERS["CPU_PINNED"], TIERS["GPU"]


class TieredCache(FakeCache):
    """FakeCache plus what the tier hooks read: node depths and the device state slot of each node."""

    def __init__(self):
        super().__init__()
        self.depths, self.device_values = {}, {}
        self.tree_core.collect_path_info = lambda ids: tuple(
            (SimpleNamespace(path_start=0, path_end=self.depths[i]),) for i in ids)
        self.tree_core.get_component_device_value = lambda node, ct: self.device_values.get(node)

    def node(self, node: int, tokens: int) -> None:
        self.hashes[node] = f"{node:016x}" + "0" * 48
        self.depths[node] = tokens


def _mamba_xfer(host_slot, device_slot):
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    xfer = PoolTransfer(name=PoolName.MAMBA, device_indices=torch.tensor([device_slot]))
    assigned = torch.tensor([host_slot]) if host_slot is not None else None

    def write(cache, node_id, device_value, comp_xfers, sidecar):  # SGLang's host pool group fills host_indices
        comp_xfers[ComponentType.MAMBA][0].host_indices = assigned
        return torch.arange(3) if host_slot is not None else None

    return {ComponentType.MAMBA: [xfer]}, write


def _backup(cache, node, host_slot, device_slot=0):
    comp_xfers, write = _mamba_xfer(host_slot, device_slot)
    return tiers.backup_with_checkpoint_event(write, cache, node, torch.arange(3), comp_xfers, [])


def _free_host(cache, *slots):
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    assert tiers.note_freed_host_checkpoints(cache, {ComponentType.MAMBA: [torch.tensor(list(slots))]}) is None


def test_host_tier_checkpoints_are_published_stored_removed_and_loaded_back():
    cache = TieredCache()
    cache.node(0x20, 300)
    _insert(cache, node=0x20, tokens=300, slot=3)
    assert _backup(cache, 0x20, host_slot=41) is not None
    assert _published(cache) == [CheckpointStored(0x20, 300, DEVICE, "s"), CheckpointStored(0x20, 300, HOST)]
    _free(cache, 3)  # the device copy is evicted: the host copy stays
    assert _published(cache) == [CheckpointRemoved(0x20, DEVICE)]
    cache.device_values[0x20] = torch.tensor([7])  # loaded back into device slot 7
    assert tiers.load_back_with_checkpoint_event(lambda c, n, *a, **k: True, cache, 0x20, None) is True
    assert tiers.load_back_with_checkpoint_event(lambda c, n, *a, **k: True, cache, 0x20, None) is True  # no repeat
    assert _published(cache) == [CheckpointStored(0x20, 300, DEVICE)]
    _free(cache, 7)
    _free_host(cache, 41, 99)  # 99: a host slot never announced (e.g. a state prefetched from L3)
    assert _published(cache) == [CheckpointRemoved(0x20, DEVICE), CheckpointRemoved(0x20, HOST)]


def test_nothing_is_published_for_failed_or_stateless_transfers():
    cache = TieredCache()
    cache.node(0x30, 64)
    assert _backup(cache, 0x30, host_slot=None) is None  # the host tier had no room
    assert tiers.load_back_with_checkpoint_event(lambda c, n, *a, **k: False, cache, 0x30, None) is False
    cache.device_values[0x30] = None
    assert tiers.load_back_with_checkpoint_event(lambda c, n, *a, **k: True, cache, 0x30, None) is True
    assert _published(cache) == []
    quiet = TieredCache()
    quiet.recorder.enabled = False
    quiet.node(0x31, 64)
    _backup(quiet, 0x31, host_slot=5)
    assert _published(quiet) == []
    hooks.forget_checkpoints_on_reset(None, cache)


def test_the_sglang_code_the_tier_hooks_rely_on_is_still_there():
    from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import TreePathNodeInfo, UnifiedTreeCoreInterface

    assert "path_end" in TreePathNodeInfo.__struct_fields__
    for name in ("collect_path_info", "get_component_device_value", "get_last_hash_value"):
        assert callable(getattr(UnifiedTreeCoreInterface, name)), name
    cache_cls = pkgutil.resolve_name("sglang.srt.mem_cache.unified_radix_cache").UnifiedRadixCache
    backup = inspect.getsource(cache_cls._execute_and_commit_kv_backup)
    assert "self._execute_kv_backup(" in backup and "commit_backup(node_id, host_indices, comp_xfers)" in backup
    assert "self._load_back_transfers(" in inspect.getsource(cache_cls.load_back)
    group = inspect.getsource(pkgutil.resolve_name("sglang.srt.mem_cache.pool_host.group").HostPoolGroup
                              .resolve_host_transfers)
    assert "transfer.host_indices = indices" in group  # the host slot is filled into the caller's transfer
    apply = inspect.getsource(cache_cls._apply_eviction_result)
    assert "free_host_values" in inspect.getsource(cache_cls) and apply
