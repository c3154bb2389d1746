"""The hooks and registrations that carry SGLang's own K3 onto the k3_cpu platform (k3_sglang/sglang_cpu), against
the installed SGLang: each target is still what the hook assumes (names, parameters, the code it works around),
the plugin is inert unless SGLang's K3 runs on k3_cpu, and it registers exactly its inventory."""
from __future__ import annotations

import inspect

import pytest

from k3_sglang.sglang_cpu import hooks


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_wrapped_functions_keep_the_parameters_the_shims_use():
    from sglang.kernels.ops.attention.fla.fused_norm_gate import FusedRMSNormGated
    from sglang.srt.layers import attn_residual
    from sglang.srt.layers.attention.linear import kda_backend
    from triton_kernels.numerics_details import mxfp

    assert _params(mxfp.upcast_from_mxfp)[:4] == ["tensor", "scale", "target_dtype", "axis"]
    assert _params(attn_residual._mix_fused) == ["prefix_sum", "bank", "nvb", "score_proj", "score_norm"]
    assert callable(attn_residual.aggregate_stream_torch) and attn_residual._BLOCK_H == 1024
    assert _params(FusedRMSNormGated.forward) == ["self", "x", "g", "residual", "prenorm", "residual_in_fp32"]
    conv = _params(kda_backend.causal_conv1d_fn)
    assert conv[:6] == ["x", "weight", "bias", "conv_states", "query_start_loc", "seq_lens_cpu"]
    assert {"cache_indices", "has_initial_state", "activation"} <= set(conv)
    assert _params(kda_backend.causal_conv1d_update)[:5] == ["x", "conv_state", "weight", "bias", "activation"]


def test_the_code_the_shims_work_around_is_still_there():
    from sglang.srt.layers.quantization import mxfp4
    from sglang.srt.models import kimi_k3

    assert "torch.cuda.Stream() for _ in range(3)" in inspect.getsource(kimi_k3.KimiK3LinearModel.__init__)
    assert "upcast_from_mxfp" in inspect.getsource(mxfp4.Mxfp4MoEMethod.process_weights_after_loading)
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    import torch

    # an instance method in 0.5.23 (its first parameter is named cls): called on a config instance
    assert torch.float32 not in CompressedTensorsConfig.get_supported_act_dtypes(object())


def test_the_kda_kernel_honours_sglangs_kernel_interface():
    from sglang.srt.layers.attention.linear import kda_backend
    from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel

    from k3_sglang.sglang_cpu.kda_kernel import K3CpuKDAKernel

    assert issubclass(K3CpuKDAKernel, TritonKDAKernel)  # the dispatcher's isinstance gate for K3's safe gate
    for name in ("decode", "extend", "target_verify"):
        ours, theirs = inspect.signature(getattr(K3CpuKDAKernel, name)), inspect.signature(getattr(TritonKDAKernel, name))
        required = [p for p, v in theirs.parameters.items() if v.default is inspect.Parameter.empty
                    and v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)]
        assert all(p in ours.parameters for p in required), name
    source = inspect.getsource(kda_backend.KDAKernelDispatcher.__init__)
    for attr in ("self.decode_kernel", "self.verify_kernel", "self.extend_kernel", "self.triton_kernel",
                 "self.supports_packed_decode"):
        assert attr in source, attr


def test_the_registries_the_plugin_uses_exist():
    from sglang.srt.arg_groups.choices import add_attention_backend_choices  # noqa: F401
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.layers.moe.moe_runner import runner
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry

    assert isinstance(ATTENTION_BACKENDS, dict) and "triton" in ATTENTION_BACKENDS
    assert callable(runner.register_moe_runner_core) and isinstance(runner._CUSTOM_RUNNER_CORE_FACTORIES, dict)
    assert callable(AttentionBackendRegistry.register)


@pytest.mark.parametrize("platform,active", [("k3_cpu", True), ("", False), ("cuda", False)])
def test_active_only_for_sglangs_k3_on_k3_cpu(monkeypatch, platform, active):
    monkeypatch.delenv("K3_DEPLOYMENT", raising=False)
    monkeypatch.setenv("SGLANG_PLATFORM", platform)
    assert hooks.active() is active


def test_register_installs_exactly_the_inventory(monkeypatch):
    from sglang.srt.plugins import hook_registry

    from k3_sglang.sglang_cpu import fast_ops, mla_backend, moe_runner

    registered, others = [], []
    monkeypatch.setattr(hook_registry.HookRegistry, "register", classmethod(lambda cls, *a, **k: registered.append(a)))
    monkeypatch.setattr(fast_ops, "flush_denormals", lambda: others.append("ftz"))  # not in the test process
    monkeypatch.setattr(mla_backend, "register", lambda: others.append("mla"))
    monkeypatch.setattr(moe_runner, "register", lambda: others.append("moe"))
    monkeypatch.setenv("SGLANG_PLATFORM", "cuda")
    hooks.register()
    assert registered == [] and others == []
    monkeypatch.setenv("SGLANG_PLATFORM", "k3_cpu")
    hooks.register()
    assert [a[0] for a in registered] == [t for t, _, _ in hooks.installed_hooks()]
    assert others == ["ftz", "mla", "moe"]


def test_the_backend_and_runner_core_register_with_sglang():
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.layers.moe.moe_runner import runner
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry

    from k3_sglang.sglang_cpu import mla_backend, moe_runner

    mla_backend.register()
    moe_runner.register()
    moe_runner.register()  # idempotent (SGLang loads plugins once per process, tests may do it twice)
    assert "k3_cpu_mla" in ATTENTION_BACKEND_CHOICES and ATTENTION_BACKENDS["k3_cpu_mla"] is mla_backend.create_backend
    assert AttentionBackendRegistry.get_handler("k3_cpu_mla") is mla_backend.forward_method
    assert runner._CUSTOM_RUNNER_CORE_FACTORIES["triton"] is moe_runner.K3CpuMoeRunnerCore


def test_last_loc_shim_answers_cpu_tensors_with_sglangs_torch_path():
    """K3_CSV under DCP (allocator page > 1) reaches `get_last_loc`; on CPU tensors the shim must give each request's
    last slot (and -1 for an empty prefix) without the Triton launch; the original is never called."""
    import torch

    from sglang.srt.mem_cache import allocation

    from k3_sglang.sglang_cpu import shims

    assert _params(allocation.get_last_loc) == ["req_to_token", "req_pool_indices_tensor", "prefix_lens_tensor"]
    assert "get_last_loc_triton" in inspect.getsource(allocation.get_last_loc)
    assert "get_last_loc(" in inspect.getsource(allocation.alloc_for_spec_decode)
    gen = torch.Generator().manual_seed(7)
    table = torch.randint(0, 10_000, (6, 40), generator=gen, dtype=torch.int32)
    idx = torch.tensor([4, 0, 5, 2], dtype=torch.int64)
    lens = torch.tensor([17, 0, 40, 1], dtype=torch.int64)

    def never(*args):
        raise AssertionError("the Triton path was called for CPU tensors")

    got = shims.last_loc_on_cpu(never, table, idx, lens)
    want = [int(table[i, n - 1]) if n > 0 else -1 for i, n in zip(idx.tolist(), lens.tolist())]
    assert got.tolist() == want


def test_the_platform_compressed_tensors_config_accepts_float32(monkeypatch):
    """SGLang's own lookup (`get_quantization_config`, public seam `SRTPlatform.get_quantization_config` on an
    out-of-tree platform) hands the k3_cpu platform's config out, replacing the old AFTER hook on
    `CompressedTensorsConfig.get_supported_act_dtypes`: float32 added, SGLang's own list kept, every other method
    left to SGLang."""
    import torch
    from sglang.srt.layers import quantization
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

    from k3_sglang.platform_cpu import K3CpuPlatform
    from k3_sglang.sglang_cpu.quant_config import K3CpuCompressedTensorsConfig

    platform = K3CpuPlatform()
    assert platform.get_quantization_config("compressed-tensors") is K3CpuCompressedTensorsConfig
    assert platform.get_quantization_config("fp8") is None
    monkeypatch.setattr(quantization, "current_platform", platform)
    assert quantization.get_quantization_config("compressed-tensors") is K3CpuCompressedTensorsConfig
    assert quantization.get_quantization_config("fp8") is quantization.QUANTIZATION_METHODS["fp8"]
    assert issubclass(K3CpuCompressedTensorsConfig, CompressedTensorsConfig)
    config = K3CpuCompressedTensorsConfig.__new__(K3CpuCompressedTensorsConfig)
    theirs = CompressedTensorsConfig.get_supported_act_dtypes(config)
    assert torch.float32 not in theirs
    assert config.get_supported_act_dtypes() == [*theirs, torch.float32]
    assert {k for k in K3CpuCompressedTensorsConfig.__dict__ if not k.startswith("_")} == {"get_supported_act_dtypes"}
