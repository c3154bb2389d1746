"""The k3_dcp_mla hooks and registrations against the installed SGLang: every target exists, the seams the backend
relies on are still where it expects them, the model-override hook picks the backend exactly where it should, the
plugins stay inert where they must, and `k3 serve` / the CPU limits compose SGLang's K3 under DCP."""
from __future__ import annotations

import inspect
import pkgutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from k3_sglang import platform_hooks
from k3_sglang.dcp_mla import BACKEND_NAME, cpu_kernels, overrides, plugin
from k3_sglang.sglang_cpu import hooks as sglang_cpu_hooks

ALL_DCP_HOOKS = (plugin.installed_hooks() + cpu_kernels.COLLECTIVE_HOOKS + cpu_kernels.MERGE_HOOKS
                 + cpu_kernels.EXTEND_HOOKS + cpu_kernels.TRACK_HOOKS)


@pytest.mark.parametrize("target,hook,kind", ALL_DCP_HOOKS, ids=[t.rsplit(".", 1)[-1] for t, _, _ in ALL_DCP_HOOKS])
def test_every_hook_target_exists_in_the_installed_sglang(target, hook, kind):
    module, attr = target.rsplit(".", 1)
    try:
        owner = pkgutil.resolve_name(module)
    except (ImportError, AttributeError):  # a class attribute: resolve the class, then the method
        mod, cls = module.rsplit(".", 1)
        owner = getattr(pkgutil.resolve_name(mod), cls)
    assert callable(getattr(owner, attr)), target
    assert kind in ("AROUND", "REPLACE") and callable(hook)


def test_sglang_k3_on_cpu_lists_every_dcp_hook():
    listed = {t for t, _, _ in sglang_cpu_hooks.installed_hooks()}
    assert {t for t, _, _ in ALL_DCP_HOOKS} <= listed
    assert {platform_hooks.ALLOC_PAGE_TARGET, platform_hooks.PARALLEL_INIT_TARGET} <= listed
    assert {t for t, _, _ in cpu_kernels.COLLECTIVE_HOOKS + cpu_kernels.MERGE_HOOKS} <= listed


def test_the_seams_are_still_where_the_backend_expects_them():
    from sglang.srt.arg_groups import model_override_base
    from sglang.srt.arg_groups.model_overrides import kimi_k3  # noqa: F401 - registers the provider
    from sglang.srt.layers.attention.trtllm_mla_backend import TRTLLMMLABackend
    from sglang.srt.models.deepseek_common import utils
    from sglang.srt.models.deepseek_common.attention_forward_methods import forward_mla

    from k3_sglang.dcp_mla.backend import K3DcpMLABackend

    names = [fn.__name__ for fn in model_override_base._MODEL_OVERRIDE_FNS["KimiK3ForConditionalGeneration"]]
    assert overrides.SGLANG_PROVIDER in names
    assert isinstance(utils.FORWARD_ABSORB_CORE_ATTENTION_BACKENDS, list)
    source = inspect.getsource(forward_mla)
    for needle in ("attn_mqa_for_dcp_decode", "FORWARD_ABSORB_CORE_ATTENTION_BACKENDS", "cp_lse_ag_out_rs_mla",
                   "dcp_a2a_lse_reduce", "is_mla_dcp_lse_base_on_e(", "all_gather_kv_cache_for_mla_extend"):
        assert needle in source, needle
    assert forward_mla.is_mla_dcp_lse_base_on_e("cutedsl_mla") is True
    # the contract of cutedsl_mla / trtllm_mla's DCP decode kernel hook, which ours implements
    want = list(inspect.signature(TRTLLMMLABackend._run_decode_kernel).parameters)
    assert list(inspect.signature(K3DcpMLABackend._run_decode_kernel).parameters) == want


def test_registration_puts_the_backend_where_sglang_looks():
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.models.deepseek_common import utils
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    from k3_sglang.dcp_mla import backend

    backend.register()
    backend.register()  # idempotent
    assert ATTENTION_BACKENDS[BACKEND_NAME] is backend.create_backend
    assert utils.FORWARD_ABSORB_CORE_ATTENTION_BACKENDS.count(BACKEND_NAME) == 1
    assert AttentionBackendRegistry.get_handler(BACKEND_NAME)(None, None) is AttnForwardMethod.MLA
    assert backend.merge_lse_base_e() is False  # so the backend hands SGLang's merge a base-2 LSE


@pytest.mark.parametrize("decode,cuda,hip,sm100,uses", [
    (None, True, False, False, True),            # Hopper, unset
    ("fa3", True, False, False, True),           # Hopper, a backend SGLang's K3 DCP would assert on
    ("cutedsl_mla", True, False, False, False),  # asked for cutedsl off Blackwell: SGLang's own refusal stands
    (None, True, False, True, False),            # Blackwell keeps cutedsl_mla
    (BACKEND_NAME, True, False, True, True),     # ... unless asked
    (None, False, True, False, False),           # ROCm: aiter
    ("k3_cpu_mla", False, False, False, True),   # the k3_cpu platform
])
def test_override_picks_k3_dcp_mla(decode, cuda, hip, sm100, uses):
    assert overrides.uses_k3_dcp_mla(decode, cuda=cuda, hip=hip, sm100=sm100) is uses


def _cfg(**kw):
    base = dict(dcp_size=2, attention_backend=None, prefill_attention_backend=None, decode_attention_backend=None,
                enable_symm_mem=False, speculative_algorithm=None, dcp_replicate_q_proj=None, dcp_comm_backend="ag_rs")
    return SimpleNamespace(**{**base, **kw})


def test_override_declarations(monkeypatch):
    from sglang.srt.arg_groups import model_override_base
    import sglang.srt.runtime_context as rc

    hopper = SimpleNamespace(is_cuda=True, is_hip=False, is_sm100=False)
    monkeypatch.setattr(rc, "get_platform", lambda: hopper)
    monkeypatch.setattr(model_override_base, "resolving_view", lambda args: args)
    sglang_calls = []

    def sglang_provider(server_args, hf_config):
        sglang_calls.append(server_args)
        return {"from": "sglang"}

    got = overrides.kimi_k3_dcp_overrides(sglang_provider, _cfg(dcp_comm_backend="a2a", enable_symm_mem=True), None)
    assert got == {"decode_attention_backend": BACKEND_NAME, "prefill_attention_backend": BACKEND_NAME,
                   "enable_symm_mem": False, "dcp_replicate_q_proj": True} and not sglang_calls
    got = overrides.kimi_k3_dcp_overrides(sglang_provider, _cfg(prefill_attention_backend="fa3"), None)
    assert got == {"decode_attention_backend": BACKEND_NAME}  # a prefill backend the user named stays
    assert overrides.kimi_k3_dcp_overrides(sglang_provider, _cfg(dcp_size=1), None) == {"from": "sglang"}
    monkeypatch.setattr(rc, "get_platform", lambda: SimpleNamespace(is_cuda=False, is_hip=False, is_sm100=False))
    got = overrides.kimi_k3_dcp_overrides(sglang_provider, _cfg(attention_backend="k3_cpu_mla"), None)
    assert got["attention_backend"] == got["decode_attention_backend"] == BACKEND_NAME


def test_override_hook_swaps_sglangs_provider_for_the_call_only(monkeypatch):
    from sglang.srt.arg_groups import model_override_base

    def _kimi_k3_overrides(*_):
        return {"sglang": True}

    def other(*_):
        return {}

    monkeypatch.setitem(model_override_base._MODEL_OVERRIDE_FNS, "KimiK3ForConditionalGeneration",
                        [other, _kimi_k3_overrides])
    seen = []

    def original(arch, server_args, hf_config):
        seen.append([fn.__qualname__ for fn in model_override_base._MODEL_OVERRIDE_FNS[arch]])
        return "result"

    assert overrides.collect_overrides_with_k3_dcp_mla(original, "KimiK3ForConditionalGeneration", None, None) \
        == "result"
    assert seen[0][1] == "k3_dcp_mla._kimi_k3_overrides"
    assert model_override_base._MODEL_OVERRIDE_FNS["KimiK3ForConditionalGeneration"] == [other, _kimi_k3_overrides]
    overrides.collect_overrides_with_k3_dcp_mla(original, "DeepseekV3ForCausalLM", None, None)  # other models: as is


def test_plugins_are_inert_where_they_must_be(monkeypatch):
    registered = []
    from sglang.srt.plugins import hook_registry

    from k3_sglang.dcp_mla import backend

    monkeypatch.setattr(hook_registry.HookRegistry, "register", classmethod(lambda cls, *a, **k: registered.append(a)))
    monkeypatch.setattr(backend, "register", lambda: registered.append("backend"))
    monkeypatch.setattr("k3_sglang.sglang_guard.guard_process", lambda: None)  # no apply-time check in this process
    monkeypatch.delenv("K3_SERVE_HOOKS", raising=False)
    monkeypatch.setenv("SGLANG_PLATFORM", "")
    monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", "")
    plugin.register()
    assert registered == []  # plain `sglang serve` on a GPU host: not started by `k3 serve`, untouched
    monkeypatch.setenv("K3_SERVE_HOOKS", "1")
    monkeypatch.setenv("SGLANG_PLATFORM", "k3_cpu")
    plugin.register()
    assert registered == []  # k3_cpu: the SGLang-K3-on-CPU plugin installs it
    monkeypatch.setenv("SGLANG_PLATFORM", "")
    monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", "")
    plugin.register()
    assert [a if a == "backend" else a[0] for a in registered] == [overrides.OVERRIDES_TARGET, "backend"]


def test_k3_serve_composes_sglangs_k3_under_dcp_on_cpu():
    from k3_sglang.serving import sglang_cpu_limits
    from k3_sglang.serving.cli import sglang_argv
    from k3_sglang.deployment import parse_sglang_argv

    argv = sglang_argv(Path("/m"), "127.0.0.1", 1, ["--tp-size", "2", "--dcp-size", "2"], on_cpu=True)
    args = parse_sglang_argv(argv)
    assert args.attention_backend == BACKEND_NAME and args.mamba_radix_cache_strategy == "extra_buffer"
    assert sglang_cpu_limits.refusals(args) == []
    plain = parse_sglang_argv(sglang_argv(Path("/m"), "127.0.0.1", 1, ["--tp-size", "2"], on_cpu=True))
    assert plain.attention_backend == "k3_cpu_mla" and plain.mamba_radix_cache_strategy == "no_buffer"


def test_k3_csv_under_dcp_keeps_no_buffer_and_drops_the_radix_cache_on_sglangs_k3():
    """K3_CSV's commit leaves no extra_buffer track snapshot: a speculative DCP server on SGLang's K3 serves on
    k3_dcp_mla with no_buffer and no radix cache, which both the CPU limits and the verify contract accept."""
    from k3_sglang.serving import sglang_cpu_limits
    from k3_sglang.serving.cli import sglang_argv
    from k3_sglang.deployment import parse_sglang_argv
    from k3_sglang.spec.contract import contract_refusals

    argv = sglang_argv(Path("/m"), "127.0.0.1", 1, ["--tp-size", "2", "--dcp-size", "2", "--speculative-algorithm",
                                                    "K3_CSV"], on_cpu=True)
    args = parse_sglang_argv(argv)
    assert args.attention_backend == BACKEND_NAME and args.mamba_radix_cache_strategy == "no_buffer"
    assert args.disable_radix_cache
    assert sglang_cpu_limits.refusals(args) == [] and contract_refusals(args) == []


@pytest.mark.parametrize("extra,message", [
    (["--tp-size", "16", "--dcp-size", "16"], "--dcp-size 16: decode context parallelism"),
    (["--tp-size", "2", "--dcp-size", "2", "--mamba-radix-cache-strategy", "no_buffer"],
     "no_buffer under --dcp-size > 1"),
    (["--tp-size", "2", "--dcp-size", "2", "--dcp-comm-backend", "fi_a2a"], "--dcp-comm-backend fi_a2a"),
])
def test_cpu_limits_refuse_what_dcp_cannot_serve(extra, message):
    from k3_sglang.serving import sglang_cpu_limits
    from k3_sglang.serving.cli import sglang_argv
    from k3_sglang.deployment import parse_sglang_argv

    args = parse_sglang_argv(sglang_argv(Path("/m"), "127.0.0.1", 1, extra, on_cpu=True))
    assert any(message in r for r in sglang_cpu_limits.refusals(args)), sglang_cpu_limits.refusals(args)
