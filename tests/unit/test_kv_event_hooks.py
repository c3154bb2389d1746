"""The KDA-checkpoint events and session retention of the `k3` radix cache (serving/kv_event_hooks.py,
serving/retention.py, serving/radix_cache.py) against the installed SGLang: every SGLang method the cache overrides
is there with the parameters the feature functions use, the events ride SGLang's own batch encoding to the router's
decoder, and the functions do what they claim on stand-in caches."""

from __future__ import annotations

import inspect
import pkgutil
import time
from types import SimpleNamespace

import msgspec
import pytest
import torch

from k3_sglang.router.kv_events import CheckpointRemoved, CheckpointStored, decode_batch
from k3_sglang.serving import kv_event_hooks as hooks
from k3_sglang.serving import kv_event_tiers, retention

CACHE = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache"
PARAMETERS = {  # overridden SGLang method -> the parameters its override passes on by position
    CACHE + ".insert": ["self", "params"],
    CACHE + "._apply_cache_action": ["self", "action"],
    CACHE + ".take_events": ["self"],
    CACHE + ".reset": ["self"],
    CACHE + "._execute_kv_backup": ["self", "node_id", "device_value", "comp_xfers"],
    CACHE + "._drain_host_frees": ["self", "host_frees"],
    CACHE + ".load_back": ["self", "node_id"],
    CACHE + ".checkpoint_into_tree": ["self", "req"],
    CACHE + "._evict": ["self", "params"],
    CACHE + ".match_prefix": ["self", "params"],
    "sglang.srt.mem_cache.unified_cache.unified_tree_core.UnifiedTreeCore.drive_host_eviction":
        ["self", "component_type", "num_tokens"],
}


def test_every_overridden_method_exists_with_the_parameters_the_override_uses():
    from k3_sglang.serving import radix_cache

    assert sorted(radix_cache.overridden()) == sorted(PARAMETERS)
    for target, expected in PARAMETERS.items():
        module, attr = target.rsplit(".", 1)
        fn = getattr(pkgutil.resolve_name(module), attr)
        names = list(inspect.signature(inspect.unwrap(fn)).parameters)
        assert names[:len(expected)] == expected, (target, names)


def test_the_sglang_fields_the_hooks_read_are_still_there():
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, InsertResult
    from sglang.srt.mem_cache.unified_cache.cache_action import FreeComponentDeviceSlot
    from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import UnifiedTreeCoreInterface
    from sglang.srt.mem_cache.utils import hash_str_to_int64

    params = InsertParams()
    assert {"mamba_value", "key", "session_id"} <= set(vars(params))
    assert {"mamba_exist", "last_device_node", "rotation_tail_declined"} <= set(vars(InsertResult(prefix_len=0)))
    assert "indices" in FreeComponentDeviceSlot.__struct_fields__
    assert callable(UnifiedTreeCoreInterface.get_last_hash_value) and callable(UnifiedTreeCoreInterface.take_events)
    assert hash_str_to_int64("f" * 64) == -1
    source = inspect.getsource(pkgutil.resolve_name("sglang.srt.mem_cache.unified_cache.components.mamba")
                               .MambaComponent.apply_component_action)
    assert "FreeComponentDeviceSlot" in source and "_free_mamba_value" in source


class FakeRecorder:
    def __init__(self):
        self.enabled, self.queue = True, []

    def take(self):
        out, self.queue = self.queue, []
        return out


class FakeCache:
    """What the hooks touch of a UnifiedRadixCache: tree core (events, hashes), components, locks."""

    def __init__(self):
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        self.disable = False
        self.recorder = FakeRecorder()
        self.hashes = {}
        self.tree_core = SimpleNamespace(kv_events=self.recorder, take_events=self.recorder.take,
                                         get_last_hash_value=lambda node: self.hashes.get(node))
        self.components = {ComponentType.FULL: None, ComponentType.MAMBA: None}
        self.token_to_kv_pool_allocator = SimpleNamespace(size=1000)
        self.req_to_token_pool = SimpleNamespace(mamba_allocator=SimpleNamespace(size=8))
        self.locked: list = []

    def lock(self, node):
        self.locked.append(node)
        return ("lock", node)

    def unlock(self, lock):
        self.locked.remove(lock[1])


def _insert(cache, node, tokens, slot, session="s", exist=False):
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, InsertResult

    cache.hashes[node] = f"{node:016x}" + "0" * 48
    params = InsertParams(key=list(range(tokens)), mamba_value=torch.tensor([slot]), session_id=session)
    result = InsertResult(prefix_len=0, last_device_node=node, mamba_exist=exist)
    return hooks.insert_with_checkpoint_event(lambda c, p: result, cache, params)


def _free(cache, *slots):
    from sglang.srt.mem_cache.unified_cache.cache_action import FreeComponentDeviceSlot
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    action = FreeComponentDeviceSlot([torch.tensor(list(slots))], component_type=ComponentType.MAMBA)
    assert hooks.note_freed_checkpoints(cache, action) is None


def _published(cache) -> list:
    """What SGLang's publisher would send for the next batch, decoded by the router."""
    from sglang.srt.disaggregation.kv_events import KVEventBatch

    events = hooks.take_events_with_checkpoints(lambda c: c.tree_core.take_events(), cache)
    payload = msgspec.msgpack.Encoder().encode(KVEventBatch(ts=0.0, events=events))
    return list(decode_batch(payload).events)


def test_checkpoint_events_follow_the_tree_in_order():
    from sglang.srt.disaggregation.kv_events import BlockRemoved, BlockStored

    cache = FakeCache()
    cache.recorder.queue.append(BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[5], block_size=1,
                                            lora_id=None))
    _insert(cache, node=0x10, tokens=40, slot=3)
    _insert(cache, node=0x11, tokens=50, slot=4, exist=True)  # the tree kept its own state: nothing new
    cache.recorder.queue.append(BlockRemoved(block_hashes=[1]))
    events = _published(cache)
    assert [type(e).__name__ for e in events] == ["BlocksStored", "CheckpointStored", "BlocksRemoved"]
    assert events[1] == CheckpointStored(0x10 << 0, 40, 1, "s")
    _free(cache, 3, 99)  # 99: a slot the tree never held as a checkpoint
    _insert(cache, node=0x12, tokens=60, slot=5)
    _insert(cache, node=0x13, tokens=70, slot=5)  # slot 5 again without a free we saw: the old one is gone
    assert _published(cache) == [CheckpointRemoved(0x10, 1), CheckpointStored(0x12, 60, 1, "s"),
                                 CheckpointRemoved(0x12, 1), CheckpointStored(0x13, 70, 1, "s")]
    hooks.forget_checkpoints_on_reset(None, cache)
    _free(cache, 5)
    assert _published(cache) == []


def test_hooks_are_inert_without_events_or_kda_states(monkeypatch):
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    quiet = FakeCache()
    quiet.recorder.enabled = False
    _insert(quiet, node=1, tokens=4, slot=1)
    no_states = FakeCache()
    del no_states.components[ComponentType.MAMBA]
    _insert(no_states, node=1, tokens=4, slot=1)
    assert _published(quiet) == [] and _published(no_states) == []
    from k3_sglang.serving import radix_cache

    registered = []
    monkeypatch.setattr(radix_cache, "register", lambda: registered.append("k3"))
    monkeypatch.delenv("K3_SERVE_HOOKS", raising=False)
    hooks.register()
    assert registered == []
    monkeypatch.setenv("K3_SERVE_HOOKS", "1")
    hooks.register()
    assert registered == ["k3"]


def _req(session, tokens, seconds, node, finished=True):
    custom = {"__k3_retain_s": seconds} if seconds else None
    return SimpleNamespace(sampling_params=SimpleNamespace(custom_params=custom), finished=lambda: finished,
                           last_node=node, kv=SimpleNamespace(cache_protected_len=tokens), session_id=session,
                           rid=f"rid-{node}")


def test_retention_hooks_lock_the_finished_turn_and_release_it_when_due(monkeypatch):
    monkeypatch.setenv("K3_RETAIN_SHARE", "0.5")  # 500 tokens, 4 sessions
    cache = FakeCache()
    retention.retain_finished_turn(None, cache, _req("a", 100, 30, node=1))
    retention.retain_finished_turn(None, cache, _req("b", 100, 0, node=2))  # asked for nothing
    retention.retain_finished_turn(None, cache, _req("c", 100, 30, node=3, finished=False))
    assert cache.locked == [1]
    retention.retain_finished_turn(None, cache, _req("a", 150, 30, node=4))  # the next turn replaces the lock
    assert cache.locked == [4]
    retention.retain_finished_turn(None, cache, _req("d", 600, 30, node=5))  # above the share: trimmed
    assert cache.locked == [4] and retention.book_of(cache).trimmed == 1
    book = retention.book_of(cache)
    book.entries["a"].until = time.monotonic() - 1
    retention.release_expired(cache)
    assert cache.locked == [] and book.tokens == 0
    retention.retain_finished_turn(None, cache, _req("e", 10, 30, node=6))
    retention.forget_on_reset(None, cache)
    assert book.entries == {} and cache.locked == [6]  # a reset tree holds no locks: nothing to unlock


@pytest.mark.parametrize("share", ["0", "1.5", "x"])
def test_retention_settings_refuse_bad_values(monkeypatch, share):
    monkeypatch.setenv("K3_RETAIN_SHARE", share)
    with pytest.raises(ValueError, match="K3_RETAIN_SHARE"):
        retention.RetentionSettings.from_env()


def test_k3_serve_composes_the_kv_events_flag(monkeypatch):
    import json

    from k3_sglang.serving.kv_events_config import KvEventsSettings, kv_events_flags

    on = KvEventsSettings()
    flag, value = kv_events_flags(["--port", "1"], on, pick_ports=lambda n: 40000 + n)
    config = json.loads(value)
    assert flag == "--kv-events-config" and config["endpoint"] == "tcp://127.0.0.1:40002" and config["bind"] is True
    assert config["replay_endpoint"] == "tcp://127.0.0.1:40003" and config["publisher"] == "zmq"
    dp = json.loads(kv_events_flags(["--dp-size", "2"], on, pick_ports=lambda n: 50000)[1])
    assert (dp["endpoint"], dp["replay_endpoint"]) == ("tcp://127.0.0.1:50000", "tcp://127.0.0.1:50002")
    assert kv_events_flags(["--kv-events-config", "{}"], on) == []
    assert kv_events_flags(["--disaggregation-mode", "decode"], on) == []
    assert kv_events_flags([], KvEventsSettings(kv_events="off")) == []
    monkeypatch.setenv("K3_KV_EVENTS", "maybe")
    with pytest.raises(ValueError, match="K3_KV_EVENTS"):
        KvEventsSettings.from_env()
    monkeypatch.setenv("K3_KV_EVENTS", "off")
    assert KvEventsSettings.from_env().enabled is False
