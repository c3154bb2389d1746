"""SGLang general plugin `k3_sglang_k3_cpu` (entry point in pyproject.toml): SGLang's own K3 on the k3_cpu platform.

Active only when SGLang runs on our CPU platform (`k3 serve` on a host without CUDA); inert everywhere else. It plugs our CPU kernels into SGLang's seams:

- MLA: the `k3_cpu_mla` attention backend (mla_backend.py), registered in SGLang's attention-backend registry, its
  argument choices and the deepseek forward-method registry; under `--dcp-size > 1` the `k3_dcp_mla` backend
  (k3_sglang/dcp_mla) through the K3 model-override hook, SGLang's DCP gates passed on CPU (platform_hooks 2-3),
  and torch paths for SGLang's DCP Triton helpers (LSE merges, the gathered extend's indices; dcp_mla/cpu_kernels.py);
- MoE: a runner core for SGLang's "triton" runner name (moe_runner.py) through `register_moe_runner_core`;
- KDA: our torch kernel in SGLang's KDA kernel dispatcher, and the backend's short-conv functions (kda_kernel.py,
  kda_ops.py); the extra_buffer prefix cache's decode-time state tracking in torch (dcp_mla/cpu_kernels.py);
- and, where SGLang has no seam, the narrow hooks below (shims.py), each registered with SGLang's HookRegistry;
- small bf16 linears in float32 on a cached float32 weight (shims.small_linear: decode-sized GEMMs) and KDA's gated
  output norm in torch, through the platform's public `post_load_model` (cpu_layers.py);
- float denormals flushed to zero in the worker (fast_ops.flush_denormals: KDA's chunked prefill runs ~3x faster).
No Triton kernel runs: nothing here needs the Triton interpreter.
"""
from __future__ import annotations


from k3_sglang import platform_hooks
from k3_sglang.dcp_mla import cpu_kernels
from k3_sglang.dcp_mla.overrides import OVERRIDES_TARGET, collect_overrides_with_k3_dcp_mla
from k3_sglang.sglang_cpu import shims
from k3_sglang.sglang_guard import sglang_plugin

_KDA = "sglang.srt.layers.attention.linear.kda_backend"


def active() -> bool:
    """True on the k3_cpu platform when SGLang's own K3 serves (k3_sglang/deployment.py's decision)."""
    from k3_sglang.deployment import current

    deployment = current()
    return deployment is not None and deployment.sglang_cpu


def installed_hooks():
    """(target, hook, hook type name) of every hook `register` installs."""
    return [("sglang.srt.models.kimi_k3.KimiK3LinearModel.__init__", shims.model_init_without_streams, "AROUND"),
            ("triton_kernels.numerics_details.mxfp.upcast_from_mxfp", shims.upcast_mxfp4, "AROUND"),
            (f"{_KDA}.KDAKernelDispatcher.__init__", shims.kda_dispatcher_on_cpu, "AROUND"),
            (f"{_KDA}.causal_conv1d_fn", shims.conv1d_fn, "REPLACE"),
            (f"{_KDA}.causal_conv1d_update", shims.conv1d_update, "REPLACE"),
            ("sglang.srt.layers.attn_residual._mix_fused", shims.attn_res_mix, "AROUND"),
            ("sglang.srt.layers.moe.moe_runner.base.FusedOpPool.get_fused_func", shims.no_fused_triton_moe,
             "AROUND"),
            # DCP (k3_dcp_mla) and the extra_buffer prefix cache it needs
            ("sglang.srt.mem_cache.allocation.get_last_loc", shims.last_loc_on_cpu, "AROUND"),
            (OVERRIDES_TARGET, collect_overrides_with_k3_dcp_mla, "AROUND"),
            (platform_hooks.ALLOC_PAGE_TARGET, platform_hooks.alloc_page_size, "REPLACE"),
            (platform_hooks.PARALLEL_INIT_TARGET, platform_hooks.init_parallel_with_cpu_dcp, "AROUND"),
            *cpu_kernels.COLLECTIVE_HOOKS, *cpu_kernels.MERGE_HOOKS, *cpu_kernels.EXTEND_HOOKS,
            *cpu_kernels.TRACK_HOOKS]


@sglang_plugin
def register() -> None:
    """Entry point: the hooks, the MLA backends and the MoE runner core, or nothing when inactive."""
    if not active():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from k3_sglang.dcp_mla import backend as dcp_mla_backend
    from k3_sglang.sglang_cpu import fast_ops, mla_backend, moe_runner

    fast_ops.flush_denormals()  # before SGLang's worker starts torch's thread pool (fast_ops.flush_denormals)

    for target, hook, kind in installed_hooks():
        HookRegistry.register(target, hook, HookType[kind])
    mla_backend.register()
    dcp_mla_backend.register()
    moe_runner.register()
