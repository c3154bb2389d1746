"""SGLang general plugin (`sglang.srt.plugins` entry point `k3_portable_dcp`): the narrow hooks that let SGLang's
own DCP machinery (groups, widened virtual allocator, owner-filtered MLA writes) run for the portable K3 on CPU.

SGLang 0.5.23 builds DCP groups, the virtual page allocator (page P * c, owner v mod c, physical v // c) and the
owner-filtered `set_mla_kv_buffer` on every platform; four places gate it (or the KDA prefix cache it needs) to GPU
builds and are hooked here; (1)-(3) only when both the k3_cpu platform and the portable model are selected, (4) on
the k3_cpu platform for either K3 model (a CUDA host and plain `sglang serve` are never touched):

1. `arg_groups.model_hook.collect_model_override_declarations` (the name its caller bound): for K3 architectures under `--dcp-size > 1` the
   provider `_kimi_k3_overrides` forces the `cutedsl_mla`/`aiter` GPU decode backends and raises on any other. Our
   model runs MLA attention itself (`k3_sglang.model.mla_attention`) and uses SGLang's pools only, so that provider
   is left out of the call; every other provider still applies.
2. `mem_cache.allocation._alloc_page_size`: under DCP the allocator's page is page_size * c; SGLang reads that only
   when `_is_cuda or _is_hip or _is_xpu or _is_npu`, and on any other platform would allocate extend pages at the
   tree's page size, misaligned with the widened allocator. The hook gives the allocator's page whenever DCP is on.

3. `distributed.parallel_state.initialize_model_parallel` (called through `distributed.bootstrap`) refuses `decode_context_parallel_size > 1` unless
   `is_hip() or is_cuda() or npu or xpu`; the group construction after that check is device-independent (gloo
   here). The hook answers True to that module's `is_cuda` for the duration of this one call (the check is its
   only use in the module) and restores it.

4. `managers.schedule_batch.ScheduleBatch.prepare_for_decode`: with the `extra_buffer` KDA prefix cache (which
   DCP needs: its tree pages hold page_size * c tokens) it copies the decode track mask with an unconditional
   `.pin_memory()`, which raises without an NVIDIA driver (every other copy there asks `is_pin_memory_available`,
   False on k3_cpu). The hook makes `Tensor.pin_memory` the identity (a pageable copy, what that check gives) for
   the duration of the call and restores it.

`installed_hooks()` lists what `register()` installs (tested against the installed SGLang).
"""
from __future__ import annotations

from k3_sglang.sglang_guard import sglang_plugin

K3_ARCHITECTURES = ("KimiK3ForConditionalGeneration", "KimiK3LinearForCausalLM")
DCP_OVERRIDE_PROVIDER = "_kimi_k3_overrides"
OVERRIDES_TARGET = "sglang.srt.arg_groups.model_hook.collect_model_override_declarations"
ALLOC_PAGE_TARGET = "sglang.srt.mem_cache.allocation._alloc_page_size"
PARALLEL_INIT_TARGET = "sglang.srt.distributed.bootstrap.initialize_model_parallel"
DECODE_PREP_TARGET = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode"


def on_k3_cpu() -> bool:
    """True when SGLang runs on our CPU platform (either K3 model; k3_sglang/deployment.py's decision)."""
    from k3_sglang.deployment import current

    deployment = current()
    return deployment is not None and deployment.on_cpu


def active() -> bool:
    """True when SGLang runs on our CPU platform with the portable model (what `k3 serve` sets on CPU)."""
    from k3_sglang.deployment import current

    deployment = current()
    return deployment is not None and deployment.on_cpu and deployment.portable


def collect_overrides_without_gpu_dcp(original, *args, **kwargs):
    """AROUND hook of (1): SGLang's override collection (architecture, server_args, hf_config) with the GPU-only
    K3 DCP provider left out."""
    from sglang.srt.arg_groups import model_override_base
    from sglang.srt.arg_groups.model_override_base import resolving_view

    architecture = args[0] if args else kwargs.get("architecture")
    server_args = args[1] if len(args) > 1 else kwargs.get("server_args")
    providers = model_override_base._MODEL_OVERRIDE_FNS.get(architecture)
    if architecture not in K3_ARCHITECTURES or not providers or resolving_view(server_args).dcp_size <= 1:
        return original(*args, **kwargs)
    saved = list(providers)
    providers[:] = [fn for fn in saved if getattr(fn, "__name__", "") != DCP_OVERRIDE_PROVIDER]
    try:
        return original(*args, **kwargs)
    finally:
        providers[:] = saved


def alloc_page_size(batch) -> int:
    """REPLACE hook of (2): the allocator's (widened) page under DCP, the tree's page otherwise."""
    from sglang.srt.runtime_context import get_parallel

    if get_parallel().dcp_enabled:
        return batch.tree_cache.token_to_kv_pool_allocator.page_size
    return batch.tree_cache.page_size


def init_parallel_with_cpu_dcp(original, *args, **kwargs):
    """AROUND hook of (3): SGLang's group construction with its DCP platform check passed."""
    from sglang.srt.distributed import parallel_state

    saved = parallel_state.is_cuda
    parallel_state.is_cuda = lambda: True
    try:
        return original(*args, **kwargs)
    finally:
        parallel_state.is_cuda = saved


def prepare_for_decode_pageable(original, *args, **kwargs):
    """AROUND hook of (4): SGLang's decode preparation with `Tensor.pin_memory` as the identity (no pinned memory
    on a CPU host)."""
    import torch

    saved = torch.Tensor.pin_memory
    torch.Tensor.pin_memory = _pageable
    try:
        return original(*args, **kwargs)
    finally:
        torch.Tensor.pin_memory = saved


def _pageable(tensor, *args, **kwargs):
    return tensor


def dcp_cpu_hooks():
    """SGLang's DCP collectives and LSE-merge kernels for CPU tensors (k3_sglang/dcp_mla/cpu_kernels.py), which the
    portable model's DCP attention calls (SGLang's K3 gets them from the k3_sglang_k3_cpu plugin)."""
    from k3_sglang.dcp_mla import cpu_kernels

    return cpu_kernels.COLLECTIVE_HOOKS + cpu_kernels.MERGE_HOOKS


def installed_hooks(portable: bool = True):
    """(target, hook, hook type name) of every hook `register` installs: (4) on the k3_cpu platform for either K3
    model, (1)-(3) and SGLang's DCP merges on CPU as well for the portable model (SGLang's K3 takes DCP through
    the k3_dcp_mla backend and the k3_sglang_k3_cpu plugin)."""
    dcp = [(OVERRIDES_TARGET, collect_overrides_without_gpu_dcp, "AROUND"),
           (ALLOC_PAGE_TARGET, alloc_page_size, "REPLACE"),
           (PARALLEL_INIT_TARGET, init_parallel_with_cpu_dcp, "AROUND")]
    platform = [(DECODE_PREP_TARGET, prepare_for_decode_pageable, "AROUND")]
    return dcp + dcp_cpu_hooks() + platform if portable else platform


@sglang_plugin
def register() -> None:
    """Entry point: register the hooks with SGLang's HookRegistry (it applies them), or do nothing off k3_cpu."""
    if not on_k3_cpu():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook, kind in installed_hooks(portable=active()):
        HookRegistry.register(target, hook, HookType[kind])
