"""The SGLang hooks that carry DCP onto the CPU platform (k3_sglang/platform_hooks.py), against the installed
SGLang: every target exists where the hook says, the hooks stay inert unless both the k3_cpu platform and the
portable model are selected, and each hook does only what it claims."""
from __future__ import annotations

import pkgutil
from types import SimpleNamespace

import pytest

from k3_sglang import platform_hooks as hooks


def test_every_hook_target_exists_in_the_installed_sglang():
    for target, hook, kind in hooks.installed_hooks():
        module, attr = target.rsplit(".", 1)
        assert callable(getattr(pkgutil.resolve_name(module), attr)), target
        assert kind in ("AROUND", "REPLACE") and callable(hook)


def test_the_gates_are_still_where_the_hooks_expect_them():
    import inspect

    from sglang.srt.arg_groups import model_override_base
    from sglang.srt.arg_groups.model_overrides import kimi_k3  # noqa: F401 - registers the provider
    from sglang.srt.distributed import parallel_state

    names = [fn.__name__ for fn in model_override_base._MODEL_OVERRIDE_FNS["KimiK3ForConditionalGeneration"]]
    assert hooks.DCP_OVERRIDE_PROVIDER in names
    source = inspect.getsource(parallel_state.initialize_model_parallel)
    assert "is_hip() or is_cuda()" in source  # the platform check the AROUND hook passes


def test_inert_off_k3_cpu_and_dcp_gates_only_for_the_portable_model(monkeypatch):
    registered = []
    from sglang.srt.plugins import hook_registry

    monkeypatch.setattr(hook_registry.HookRegistry, "register", classmethod(lambda cls, *a, **k: registered.append(a)))
    for platform, package in (("", "k3_sglang.models"), ("cuda", "k3_sglang.models"), ("cuda", "")):
        monkeypatch.setenv("SGLANG_PLATFORM", platform)
        monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", package)
        hooks.register()
    assert registered == []
    monkeypatch.setenv("SGLANG_PLATFORM", "k3_cpu")
    monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", "")
    hooks.register()  # SGLang's own K3 on k3_cpu: the pageable decode-prep copy only
    assert [a[0] for a in registered] == [hooks.DECODE_PREP_TARGET]
    registered.clear()
    monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", "k3_sglang.models")
    hooks.register()
    assert [a[0] for a in registered] == [t for t, _, _ in hooks.installed_hooks()]


@pytest.mark.parametrize("dcp,architecture,dropped", [
    (2, "KimiK3ForConditionalGeneration", True), (1, "KimiK3ForConditionalGeneration", False),
    (2, "DeepseekV3ForCausalLM", False)])
def test_override_hook_leaves_out_only_the_gpu_dcp_provider(monkeypatch, dcp, architecture, dropped):
    from sglang.srt.arg_groups import model_override_base

    def _kimi_k3_overrides(*_):
        return {}

    def other(*_):
        return {}

    monkeypatch.setitem(model_override_base._MODEL_OVERRIDE_FNS, architecture, [other, _kimi_k3_overrides])
    monkeypatch.setattr(model_override_base, "resolving_view", lambda args: SimpleNamespace(dcp_size=args.dcp_size))
    seen = []

    def original(arch, server_args, hf_config):
        seen.append([fn.__name__ for fn in model_override_base._MODEL_OVERRIDE_FNS[arch]])
        return "result"

    assert hooks.collect_overrides_without_gpu_dcp(original, architecture, SimpleNamespace(dcp_size=dcp), None) == "result"
    assert seen == [["other"] if dropped else ["other", "_kimi_k3_overrides"]]
    assert [f.__name__ for f in model_override_base._MODEL_OVERRIDE_FNS[architecture]] == ["other", "_kimi_k3_overrides"]


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
