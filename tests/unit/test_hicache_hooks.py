"""The HiCache-on-CPU plugin (k3_sglang/hicache/hooks.py) against the installed SGLang: every target exists and still
looks the way the hook expects (drift), the plugin is inert unless SGLang runs on k3_cpu (either K3 model), each
hook does only what it says; and what `k3 serve` adds and refuses for HiCache on CPU (hicache/serve_flags.py). About 5 s."""
from __future__ import annotations

import inspect
import pkgutil
from types import SimpleNamespace

import pytest
import torch

from k3_sglang.hicache import hooks
from k3_sglang.hicache.serve_flags import cpu_hicache_env, cpu_hicache_flags, cpu_hicache_refusals
from k3_sglang.hicache.settings import HiCacheSettings
from k3_sglang.hicache.transfer_ops import DIRECT_OPS


def test_every_hook_target_exists_in_the_installed_sglang():
    for target, hook, kind in hooks.installed_hooks("corrupt-restored-kda"):
        owner, attr = target.rsplit(".", 1)
        assert callable(getattr(pkgutil.resolve_name(owner), attr)), target
        assert kind == "AROUND" and callable(hook)
    assert len(hooks.installed_hooks()) == 6


def test_host_pools_still_take_pin_memory_as_a_keyword_and_default_to_pinned():
    from sglang.srt.mem_cache.pool_host.base import HostKVCache
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    for init in (HostKVCache.__init__, MambaPoolHost.__init__):
        param = inspect.signature(init).parameters["pin_memory"]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY or param.default is True
    assert "pin_memory=pin_memory" in inspect.getsource(MLATokenToKVPoolHost.__init__)  # reaches HostKVCache
    for t in ("MLATokenToKVPoolHost", "MambaPoolHost"):
        cls = MLATokenToKVPoolHost if t.startswith("MLA") else MambaPoolHost
        assert "pin_memory=self.pin_memory" in inspect.getsource(cls.get_dummy_flat_data_page), t


def test_the_direct_ops_are_still_cuda_only_imports_of_the_host_pool_modules():
    for name in hooks.TRANSFER_MODULES:
        module = pkgutil.resolve_name(name)
        source = inspect.getsource(module)
        assert "from sgl_kernel.kvcacheio import" in source and "_is_cuda or _is_hip" in source, name
        for op in DIRECT_OPS:
            assert f"{op}(" in source, f"{name} no longer calls {op}"
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler

    assert "MambaPoolHost(" in inspect.getsource(hybrid_pool_assembler.build_mamba_host_pool)
    assert "build_mamba_host_pool(" in inspect.getsource(hybrid_pool_assembler.build_hybrid_mamba_stack)


def test_binding_fills_only_missing_names(monkeypatch):
    from sglang.srt.mem_cache.pool_host import mamba, mla

    sentinel = object()
    monkeypatch.setattr(mla, "transfer_kv_direct", sentinel, raising=False)
    monkeypatch.setattr(mamba, "transfer_kv_direct", None, raising=False)
    hooks.bind_direct_transfer_ops()
    assert mla.transfer_kv_direct is sentinel and mamba.transfer_kv_direct is DIRECT_OPS["transfer_kv_direct"]
    seen = []
    assert hooks.build_stack_with_cpu_ops(lambda *a, **k: seen.append((a, k)) or "stack", 1, x=2) == "stack"
    assert seen == [((1,), {"x": 2})]


def test_host_budget_runs_with_the_cpu_reserve_and_restores_it():
    from sglang.srt.mem_cache.pool_host import base

    assert base.HICACHE_HOST_MEMORY_RESERVE_BYTES == 10 * (1 << 30)  # SGLang's GPU-server headroom, still there
    assert "HICACHE_HOST_MEMORY_RESERVE_BYTES" in inspect.getsource(base.host_memory_budget_bytes)
    seen = hooks.budget_with_cpu_reserve(lambda *a, **k: base.HICACHE_HOST_MEMORY_RESERVE_BYTES, 5)
    assert seen == hooks.CPU_HOST_RESERVE_BYTES and base.HICACHE_HOST_MEMORY_RESERVE_BYTES == 10 * (1 << 30)
    free = base.available_host_memory_bytes(allow_cgroup_fallback=True)
    budget = hooks.budget_with_cpu_reserve(base.host_memory_budget_bytes)
    assert abs(budget - (free - hooks.CPU_HOST_RESERVE_BYTES)) < (512 << 20)  # free memory moves a little


def _rss_bytes() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_unpinned_host_buffers_are_committed_as_they_fill_not_at_start():
    from sglang.srt.mem_cache.pool_host import common

    source = inspect.getsource(common.alloc_with_host_register)
    assert "allocator.allocate(dims, dtype=dtype, device=device)" in source  # the call the hook stands in for
    assert "alloc_mmap(dims, dtype)" in inspect.getsource(common.HostTensorAllocator.allocate)
    size = 256 << 20
    dims = (size // 4 // 1024, 1024)
    before = _rss_bytes()
    lazy = hooks.lazy_pageable_host_alloc(None, dims, torch.float32, "cpu", False, common.HostTensorAllocator())
    assert lazy.shape == dims and lazy.dtype == torch.float32
    assert _rss_bytes() - before < size // 8  # nothing committed yet
    assert not lazy[:: 4096 // 4].any()  # zero-filled where read
    lazy[-1].fill_(7.0)
    assert float(lazy[-1, 0]) == 7.0 and not lazy[0].any()
    del lazy
    before = _rss_bytes()
    populated = hooks.lazy_pageable_host_alloc(common.alloc_with_host_register, (size // 4 // 1024, 1024),
                                               torch.float32, "cpu", False, _PrefaultingAllocator())
    assert _rss_bytes() - before > size // 2  # control: SGLang's own allocation is prefaulted
    del populated
    passed = []
    hooks.lazy_pageable_host_alloc(lambda *a, **k: passed.append(a), (4,), torch.float32, "cpu", True,
                                   common.HostTensorAllocator())
    assert passed  # a pinned buffer is SGLang's to allocate


class _PrefaultingAllocator:
    """Not SGLang's default allocator class: the hook passes it through to SGLang's path (its prefaulted mmap)."""

    def allocate(self, dims, dtype, device):
        from sglang.srt.mem_cache.storage.mmap import alloc_mmap

        return alloc_mmap(dims, dtype)


def test_pageable_hook_forces_pin_memory_off():
    assert hooks.pageable_host_pool(lambda *a, **k: k, 1, pin_memory=True) == {"pin_memory": False}
    assert hooks.pageable_host_pool(lambda *a, **k: k, 1) == {"pin_memory": False}


def test_inert_unless_sglang_runs_on_k3_cpu(monkeypatch):
    registered = []
    from sglang.srt.plugins import hook_registry

    monkeypatch.setattr(hook_registry.HookRegistry, "register", classmethod(lambda cls, *a, **k: registered.append(a)))
    monkeypatch.delenv("K3_HICACHE_FAULT", raising=False)
    monkeypatch.delenv("SGLANG_EXTERNAL_MODEL_PACKAGE", raising=False)
    for platform in ("", "cuda"):
        monkeypatch.setenv("SGLANG_PLATFORM", platform)
        hooks.register()
    assert registered == []
    monkeypatch.setenv("SGLANG_PLATFORM", "k3_cpu")
    for eviction in ("lru", "sessions"):  # the session policy lives in the `k3` radix cache: no hooks here
        monkeypatch.setenv("K3_HICACHE_EVICTION", eviction)
        registered.clear()
        hooks.register()
        assert [a[0] for a in registered] == [t for t, _, _ in hooks.installed_hooks()]
    monkeypatch.delenv("K3_HICACHE_EVICTION", raising=False)
    assert hooks.STATE_LOAD_TARGET not in [a[0] for a in registered]  # the fault hook only when asked for
    registered.clear()
    monkeypatch.setenv("K3_HICACHE_FAULT", "corrupt-restored-kda")
    hooks.register()
    assert hooks.STATE_LOAD_TARGET in [a[0] for a in registered]


def test_fault_setting_is_typed():
    assert HiCacheSettings().fault == "none"
    with pytest.raises(ValueError, match="K3_HICACHE_FAULT must be one of"):
        HiCacheSettings.from_env({"K3_HICACHE_FAULT": "flip-bits"})


def test_corrupt_hook_touches_only_the_restored_slots_of_its_layer():
    temporal = torch.zeros(2, 5, 1, 2, 2)
    pool = SimpleNamespace(buffer_info=SimpleNamespace(temporal=temporal))
    hooks.corrupt_restored_kda(lambda *a, **k: None, pool, None, None, torch.tensor([1, 3]), 1)
    assert temporal[1, [1, 3]].isnan().all() and temporal.isnan().sum() == 8


def _args(**kw):
    base = dict(enable_hierarchical_cache=True, hicache_io_backend="direct", hicache_mem_layout="page_first_direct",
                hicache_write_policy="write_through", hicache_host_memory_mode="cache", hicache_storage_backend=None)
    return SimpleNamespace(**{**base, **kw})


def test_serve_defaults_and_refusals():
    assert cpu_hicache_flags(["--dtype", "float32"]) == []
    assert cpu_hicache_flags(["--enable-hicache"]) == ["--hicache-io-backend", "direct", "--hicache-mem-layout",
                                                       "page_first_direct", "--hicache-ratio", "2"]
    assert cpu_hicache_flags(["--enable-hierarchical-cache", "--hicache-io-backend=kernel", "--hicache-size", "1"]) == [
        "--hicache-mem-layout", "page_first_direct"]
    assert cpu_hicache_refusals(_args(enable_hierarchical_cache=False, hicache_io_backend="kernel")) == []
    assert cpu_hicache_refusals(_args(hicache_storage_backend="file")) == []
    reasons = cpu_hicache_refusals(_args(hicache_io_backend="kernel", hicache_mem_layout="page_first",
                                         hicache_write_policy="write_back", hicache_host_memory_mode="buffer_only",
                                         hicache_storage_backend="hf3fs"))
    assert len(reasons) == 5 and "kernel" in reasons[0] and "hf3fs" in reasons[4]


def test_mooncake_needs_a_master_that_answers():
    from k3_sglang.net import free_port

    mooncake = _args(hicache_storage_backend="mooncake")
    assert "set MOONCAKE_MASTER" in cpu_hicache_refusals(mooncake, {})[0]
    assert "does not answer" in cpu_hicache_refusals(mooncake, {"MOONCAKE_MASTER": f"127.0.0.1:{free_port()}"})[0]
    assert "not host:port" in cpu_hicache_refusals(mooncake, {"MOONCAKE_MASTER": "nohost"})[0]
    assert cpu_hicache_refusals(mooncake, {"SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": "/x.json"}) == []
    env = cpu_hicache_env(["--enable-hicache", "--hicache-storage-backend", "mooncake"], "127.0.0.1",
                          {"MOONCAKE_PROTOCOL": "rdma"})
    assert env["MOONCAKE_PROTOCOL"] == "rdma" and env["MOONCAKE_LOCAL_HOSTNAME"] == "127.0.0.1"
    assert env["MC_TCP_BIND_ADDRESS"] == "127.0.0.1" and env["MOONCAKE_GLOBAL_SEGMENT_SIZE"] == str(512 << 20)
    assert cpu_hicache_env(["--enable-hicache"], "127.0.0.1", {}) == {}  # no Mooncake variables without it


def test_hicache_needs_the_radix_cache_and_no_draft_under_dcp():
    assert cpu_hicache_refusals(_args(dcp_size=2, mamba_radix_cache_strategy="extra_buffer")) == []
    (spec,) = cpu_hicache_refusals(_args(dcp_size=2, speculative_algorithm="K3_CSV", disable_radix_cache=True))
    assert "--speculative-algorithm K3_CSV under --dcp-size 2" in spec
    (pd,) = cpu_hicache_refusals(_args(dcp_size=2, disaggregation_mode="decode", disable_radix_cache=True))
    assert "--disaggregation-mode under --dcp-size 2" in pd
    (off,) = cpu_hicache_refusals(_args(disable_radix_cache=True))
    assert "--disable-radix-cache" in off


def test_k3_serve_composes_dcp2_hicache_with_extra_buffer_or_exits_2(capsys):
    from k3_sglang.cli import main

    dcp2 = ["serve", "--dry-run", "--tp-size", "2", "--dcp-size", "2", "--enable-hierarchical-cache"]
    assert main(dcp2) == 0
    out = capsys.readouterr().out
    assert "--mamba-radix-cache-strategy extra_buffer" in out and "--hicache-io-backend direct" in out
    assert main(dcp2 + ["--speculative-algorithm", "K3_CSV"]) == 2
    assert "--speculative-algorithm K3_CSV under --dcp-size 2" in capsys.readouterr().err
    assert main(dcp2 + ["--mamba-radix-cache-strategy", "no_buffer"]) == 2
    assert "--mamba-radix-cache-strategy no_buffer" in capsys.readouterr().err


def test_storage_name_target_still_takes_the_name_and_pool_and_keys_every_backend():
    """The storage-identity hook wraps `storage_model_name(model_name, host_pool)`, which the controller calls once
    to build the one storage config every backend keys on (file: config_suffix; Mooncake: its key prefix)."""
    import inspect

    from sglang.srt.managers import cache_controller

    assert list(inspect.signature(cache_controller.storage_model_name).parameters) == ["model_name", "host_pool"]
    source = inspect.getsource(cache_controller.HiCacheController._generate_storage_config)
    assert "storage_model_name(model_name, self.storage_host_pool)" in source and "model_name=model_name" in source


def test_mooncake_under_dcp_is_refused_on_the_sglang_whose_store_cannot_start_there():
    """docs/sglang-bugs.md, 3: SGLang 0.5.23's Mooncake store dies at start under DCP; `k3 serve` says so instead."""
    from k3_sglang.hicache.serve_flags import mooncake_dcp_refusals

    config = {"SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": "/x.json"}  # a master that needs no probe here
    reasons = cpu_hicache_refusals(_args(hicache_storage_backend="mooncake", dcp_size=2), config)
    assert len(reasons) == 1 and "--dcp-size 2" in reasons[0] and "sglang-bugs.md, 3" in reasons[0]
    assert cpu_hicache_refusals(_args(hicache_storage_backend="mooncake", dcp_size=1), config) == []
    assert mooncake_dcp_refusals(_args(dcp_size=2), version="0.5.24") == []  # a fixed release serves it
    assert cpu_hicache_refusals(_args(hicache_storage_backend="file", dcp_size=2)) == []
