"""SGLang general plugin (`sglang.srt.plugins` entry point `k3_platform_hooks`): narrow hooks where SGLang gates
device-independent machinery to GPU builds, for SGLang's K3 on the k3_cpu platform (a CUDA host and plain `sglang
serve` are never touched).

1. `mem_cache.allocation._alloc_page_size`: under DCP the allocator's page is page_size * c; SGLang reads that only
   when `_is_cuda or _is_hip or _is_xpu or _is_npu`, and on any other platform would allocate extend pages at the
   tree's page size, misaligned with the widened allocator. The hook gives the allocator's page whenever DCP is on.
2. `distributed.parallel_state.initialize_model_parallel` (called through `distributed.bootstrap`) refuses
   `decode_context_parallel_size > 1` unless `is_hip() or is_cuda() or npu or xpu`; the group construction after
   that check is device-independent (gloo here). The hook answers True to that module's `is_cuda` for the duration
   of this one call (the check is its only use in the module) and restores it.
   (1) and (2) are installed by the k3_sglang_k3_cpu plugin (k3_sglang/sglang_cpu/hooks.py).
3. `managers.schedule_batch.ScheduleBatch.prepare_for_decode`: with the `extra_buffer` KDA prefix cache (which
   DCP needs: its tree pages hold page_size * c tokens) it copies the decode track mask with an unconditional
   `.pin_memory()`, which raises without an NVIDIA driver (every other copy there asks `is_pin_memory_available`,
   False on k3_cpu). The hook makes `Tensor.pin_memory` the identity (a pageable copy, what that check gives) for
   the duration of the call and restores it. Installed here, on the k3_cpu platform.

`installed_hooks()` lists what `register()` installs (tested against the installed SGLang).
"""
from __future__ import annotations

from k3_sglang.sglang_guard import sglang_plugin

ALLOC_PAGE_TARGET = "sglang.srt.mem_cache.allocation._alloc_page_size"
PARALLEL_INIT_TARGET = "sglang.srt.distributed.bootstrap.initialize_model_parallel"
DECODE_PREP_TARGET = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode"


def on_k3_cpu() -> bool:
    """True when SGLang runs on our CPU platform (k3_sglang/deployment.py's decision)."""
    from k3_sglang.deployment import current

    deployment = current()
    return deployment is not None and deployment.on_cpu


def alloc_page_size(batch) -> int:
    """REPLACE hook of (1): the allocator's (widened) page under DCP, the tree's page otherwise."""
    from sglang.srt.runtime_context import get_parallel

    if get_parallel().dcp_enabled:
        return batch.tree_cache.token_to_kv_pool_allocator.page_size
    return batch.tree_cache.page_size


def init_parallel_with_cpu_dcp(original, *args, **kwargs):
    """AROUND hook of (2): SGLang's group construction with its DCP platform check passed."""
    from sglang.srt.distributed import parallel_state

    saved = parallel_state.is_cuda
    parallel_state.is_cuda = lambda: True
    try:
        return original(*args, **kwargs)
    finally:
        parallel_state.is_cuda = saved


def prepare_for_decode_pageable(original, *args, **kwargs):
    """AROUND hook of (3): SGLang's decode preparation with `Tensor.pin_memory` as the identity (no pinned memory
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


def installed_hooks():
    """(target, hook, hook type name) of every hook `register` installs: (3) on the k3_cpu platform. (1) and (2) are
    installed by the k3_sglang_k3_cpu plugin (k3_sglang/sglang_cpu/hooks.py) with the rest of SGLang's K3 on CPU."""
    return [(DECODE_PREP_TARGET, prepare_for_decode_pageable, "AROUND")]


@sglang_plugin
def register() -> None:
    """Entry point: register the hooks with SGLang's HookRegistry (it applies them), or do nothing off k3_cpu."""
    if not on_k3_cpu():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook, kind in installed_hooks():
        HookRegistry.register(target, hook, HookType[kind])
