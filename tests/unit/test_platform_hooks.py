"""The SGLang hooks that carry DCP onto the CPU platform (k3_sglang/platform_hooks.py), against the installed
SGLang: every target exists where the hook says, the plugin stays inert off the k3_cpu platform, and each hook does
only what it claims."""
from __future__ import annotations

import pkgutil
from types import SimpleNamespace

from k3_sglang import platform_hooks as hooks


def test_every_hook_target_exists_in_the_installed_sglang():
    for target, hook, kind in hooks.installed_hooks() + [(hooks.ALLOC_PAGE_TARGET, hooks.alloc_page_size, "REPLACE"),
                                                         (hooks.PARALLEL_INIT_TARGET, hooks.init_parallel_with_cpu_dcp,
                                                          "AROUND")]:
        module, attr = target.rsplit(".", 1)
        assert callable(getattr(pkgutil.resolve_name(module), attr)), target
        assert kind in ("AROUND", "REPLACE") and callable(hook)


def test_the_gate_is_still_where_the_hook_expects_it():
    import inspect

    from sglang.srt.distributed import parallel_state

    source = inspect.getsource(parallel_state.initialize_model_parallel)
    assert "is_hip() or is_cuda()" in source  # the platform check the AROUND hook passes


def test_inert_off_k3_cpu(monkeypatch):
    registered = []
    from sglang.srt.plugins import hook_registry

    monkeypatch.setattr(hook_registry.HookRegistry, "register", classmethod(lambda cls, *a, **k: registered.append(a)))
    monkeypatch.delenv("K3_DEPLOYMENT", raising=False)
    monkeypatch.delenv("K3_SERVE_HOOKS", raising=False)
    for platform in ("", "cuda"):
        monkeypatch.setenv("SGLANG_PLATFORM", platform)
        hooks.register()
    assert registered == []
    monkeypatch.setenv("SGLANG_PLATFORM", "k3_cpu")
    hooks.register()  # SGLang's own K3 on k3_cpu: the pageable decode-prep copy
    assert [a[0] for a in registered] == [hooks.DECODE_PREP_TARGET]


def test_alloc_page_size_reads_the_widened_allocator_only_under_dcp(monkeypatch):
    import sglang.srt.runtime_context as rc

    batch = SimpleNamespace(tree_cache=SimpleNamespace(page_size=1, token_to_kv_pool_allocator=SimpleNamespace(page_size=4)))
    for enabled, want in ((True, 4), (False, 1)):
        monkeypatch.setattr(rc, "get_parallel", lambda enabled=enabled: SimpleNamespace(dcp_enabled=enabled))
        assert hooks.alloc_page_size(batch) == want


def test_parallel_init_hook_restores_is_cuda():
    from sglang.srt.distributed import parallel_state

    before = parallel_state.is_cuda
    seen = hooks.init_parallel_with_cpu_dcp(lambda: parallel_state.is_cuda())
    assert seen is True and parallel_state.is_cuda is before
