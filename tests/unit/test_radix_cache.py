"""The `k3` radix-cache backend (serving/radix_cache.py) against the installed SGLang: registered through SGLang's
public registries, built by SGLang's own `create_unified_radix_cache`, and, as a real SGLang cache (SGLang's test kit
builds its pools on CPU), publishing KDA checkpoint events in the order the tree changes; `k3 serve` selects it
unless the user picked a cache of their own."""

from __future__ import annotations

from array import array
from types import SimpleNamespace
from unittest import mock

import msgspec
import pytest

from k3_sglang.router.kv_events import CheckpointRemoved, CheckpointStored, decode_batch
from k3_sglang.serving import radix_cache
from k3_sglang.serving.radix_cache import K3RadixCache, K3SessionTreeCore


def test_register_uses_sglangs_registries_once():
    from sglang.srt.mem_cache.registry import get_radix_cache_factory
    from sglang.srt.mem_cache.unified_cache.tree_core_registry import get_tree_core_factory

    radix_cache.register()
    radix_cache.register()  # a second plugin load in the same process is harmless
    assert get_radix_cache_factory("k3") is radix_cache.create
    params = SimpleNamespace()
    with mock.patch.object(K3SessionTreeCore, "__init__", lambda self, p, c: setattr(self, "args", (p, c))):
        core = get_tree_core_factory("k3_sessions")(params, {})
    assert isinstance(core, K3SessionTreeCore) and core.args == (params, {})


@pytest.mark.parametrize("hicache, eviction, session", [(False, "sessions", False), (True, "lru", False),
                                                        (True, "sessions", True)])
def test_create_builds_sglangs_unified_cache_of_our_class(monkeypatch, hicache, eviction, session):
    from sglang.srt.mem_cache import registry

    built = []

    def create_unified(ctx, *, cache_class=None):
        built.append((ctx.params.tree_core_backend, cache_class))
        return object.__new__(cache_class)

    monkeypatch.setattr(registry, "create_unified_radix_cache", create_unified)
    monkeypatch.setenv("K3_HICACHE_EVICTION", eviction)
    ctx = SimpleNamespace(enable_hierarchical_cache=hicache, params=SimpleNamespace(tree_core_backend=None))
    cache = radix_cache.create(ctx)
    assert built == [("k3_sessions" if session else None, K3RadixCache)]
    assert isinstance(cache, K3RadixCache) and cache.k3_session_eviction is session


def _real_cache():
    """A real K3RadixCache (FULL + MAMBA, KV events on) on SGLang's own unit-test pools, on CPU."""
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.test.kits.unified_radix_cache import fixtures
    from sglang.test.kits.unified_radix_cache.config import CacheConfig

    cfg = CacheConfig(components=(ComponentType.FULL, ComponentType.MAMBA))
    with mock.patch.object(fixtures, "UnifiedRadixCache", K3RadixCache), \
            mock.patch.object(fixtures, "get_device", lambda: "cpu"):
        return fixtures.build_fixture(cfg, enable_kv_cache_events=True)


def _insert(cache, allocator, pool, tokens, rid, session):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid=rid, origin_input_text="", origin_input_ids=array("q"),
              sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
    pool.alloc([req])
    cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=allocator.alloc(len(tokens)),
                              mamba_value=req.kv.mamba_pool_idx.unsqueeze(0), session_id=session))


def _published(cache) -> list:
    """The next batch SGLang's publisher would send, as the router decodes it."""
    from sglang.srt.disaggregation.kv_events import KVEventBatch

    payload = msgspec.msgpack.Encoder().encode(KVEventBatch(ts=0.0, events=cache.take_events()))
    return list(decode_batch(payload).events)


def test_a_real_k3_cache_publishes_kda_checkpoints_in_tree_order():
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    cache, allocator, pool = _real_cache()
    assert isinstance(cache, K3RadixCache)
    _insert(cache, allocator, pool, list(range(1, 40)), "a", "s1")
    _insert(cache, allocator, pool, list(range(100, 130)), "b", "s2")
    kinds = [type(e).__name__ for e in _published(cache)]
    assert kinds == ["AllCleared", "BlocksStored", "CheckpointStored", "BlocksStored", "CheckpointStored"], kinds
    stored = [e for e in _published(cache)]  # taken: nothing twice
    assert stored == []
    result = cache.evict(EvictParams(num_tokens=1000))
    assert result.mamba_num_evicted == 2
    events = _published(cache)
    assert [type(e).__name__ for e in events] == ["BlocksRemoved", "CheckpointRemoved"] * 2
    assert all(isinstance(e, CheckpointRemoved) for e in events[1::2])


def test_a_real_k3_cache_names_the_session_and_forgets_checkpoints_on_reset():
    cache, allocator, pool = _real_cache()
    _insert(cache, allocator, pool, list(range(1, 20)), "a", "agent-7")
    checkpoints = [e for e in _published(cache) if isinstance(e, CheckpointStored)]
    assert len(checkpoints) == 1 and checkpoints[0].tokens == 19 and checkpoints[0].session_id == "agent-7"
    cache.reset()
    assert [type(e).__name__ for e in _published(cache)] == ["AllCleared"]
    assert not cache.__dict__["_k3_kda_event_log"].slots


def test_k3_serve_selects_the_k3_cache_unless_the_user_picked_another(monkeypatch, capsys, tmp_path):
    from k3_sglang.cli import main

    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path))
    assert main(["serve", "--dry-run", "--dtype", "float32"]) == 0
    assert "--radix-cache-backend k3" in capsys.readouterr().out
    assert main(["serve", "--dry-run", "--dtype", "float32", "--radix-cache-backend", "theirs"]) == 0
    captured = capsys.readouterr()
    assert "--radix-cache-backend k3" not in captured.out and "--radix-cache-backend theirs" in captured.out
    assert "--radix-cache-backend: SGLang's own radix cache serves" in captured.err
