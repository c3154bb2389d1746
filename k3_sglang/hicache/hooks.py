"""SGLang general plugin (`sglang.srt.plugins` entry point `k3_hicache_cpu`): SGLang's own HiCache (host tier L2,
storage tier L3) for SGLang's own K3 on the k3_cpu platform (no_buffer KDA
states). Inert unless the k3_cpu platform is selected (a CUDA host is never touched).

SGLang 0.5.23 builds its hybrid host pools (MLA latent pages + KDA state slots, `hybrid_pool_assembler.
build_hybrid_mamba_stack`), cache controller, transfer engine and storage backends on any platform; a CPU host
lacks four things, each passed by one narrow hook (and a fifth hook keys storage by what wrote it):

1. Pinned host memory. `HostKVCache.__init__` (the MLA host pool) and `MambaPoolHost.__init__` (the KDA state host
   pool) default to `pin_memory=True`: cudaHostRegister of the buffers at start, and `torch.zeros(pin_memory=True)`
   for the staging page of every L3 read; both need an NVIDIA driver ("Found no NVIDIA driver"). AROUND hooks
   construct them with `pin_memory=False` (pageable host memory, which the platform's `is_pin_memory_available`
   reports).
2. The host<->device copy ops. `pool_host/mla.py` and `pool_host/mamba.py` import their transfer ops from
   sgl_kernel (CUDA/ROCm builds only), so on CPU the names are unbound. `k3 serve` selects SGLang's `direct` IO
   backend with the `page_first_direct` host layout on CPU (hicache/serve_flags.py), whose three ops are
   supplied in torch (hicache/transfer_ops.py, checked against a per-token reference and through SGLang's own
   host pools) by an AROUND hook on the stack assembly that binds the names those modules lack, once, before any
   pool is built.
3. A GPU server's host-memory headroom. `pool_host.base.host_memory_budget_bytes` (every host pool's allocation
   check) keeps 10 GiB of host RAM free (`HICACHE_HOST_MEMORY_RESERVE_BYTES`) beside a GPU server; on a CPU host
   the device pools already live in that RAM, and on a 24 GB machine with less than 10 GiB free SGLang refuses
   even a 10 MB host tier ("Not enough host memory available ... -1.63 GB free"). The AROUND hook runs the check
   with CPU_HOST_RESERVE_BYTES (1 GiB) in that constant for the call.

4. Prefaulted host buffers. SGLang allocates every host pool with a MAP_POPULATE'd (or MADV_POPULATE_WRITE) mmap,
   since cudaHostRegister must pin real pages; so the whole tier is committed at start (measured: a 5 GB tier made
   a 6 GB scheduler before the first request). Pageable CPU buffers need no prefault: an AROUND hook on
   `pool_host.common.alloc_with_host_register` maps SGLang's default-allocator, unpinned buffers with a plain
   anonymous mmap (zero-filled, committed page by page as the tier fills).

5. Storage keys that name what wrote them. SGLang keys L3 objects by the served model name and rank layout only;
   an AROUND hook on `cache_controller.storage_model_name` appends a digest of the checkpoint, page size, parallel
   layout, dtypes and SGLang version (hicache/storage_identity.py), so a restarted worker resumes its own objects
   and never loads another checkpoint's, layout's or version's.

With `K3_HICACHE_FAULT=corrupt-restored-kda` (tests only, hicache/settings.py) one more hook corrupts every KDA state
the host tier restores, the sabotage control of the end-to-end tests. `installed_hooks()` lists what `register()`
installs (tests/unit/test_hicache_hooks.py checks each target and the code it expects there).
"""
from __future__ import annotations

import importlib
import math
import os

import torch

from k3_sglang.hicache.serve_flags import file_storage_dir
from k3_sglang.hicache.transfer_ops import DIRECT_OPS
from k3_sglang.sglang_guard import sglang_plugin

KV_HOST_POOL_TARGET = "sglang.srt.mem_cache.pool_host.base.HostKVCache.__init__"
STATE_HOST_POOL_TARGET = "sglang.srt.mem_cache.pool_host.mamba.MambaPoolHost.__init__"
MAMBA_STACK_TARGET = "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler.build_hybrid_mamba_stack"
HOST_BUDGET_TARGET = "sglang.srt.mem_cache.pool_host.base.host_memory_budget_bytes"
HOST_ALLOC_TARGET = "sglang.srt.mem_cache.pool_host.common.alloc_with_host_register"
CPU_HOST_RESERVE_BYTES = 1 << 30
STORAGE_NAME_TARGET = "sglang.srt.managers.cache_controller.storage_model_name"
STATE_LOAD_TARGET = "sglang.srt.mem_cache.pool_host.mamba.MambaPoolHost.load_to_device_per_layer"
TRANSFER_MODULES = ("sglang.srt.mem_cache.pool_host.mla", "sglang.srt.mem_cache.pool_host.mamba")


def active() -> bool:
    """True when SGLang runs on our CPU platform."""
    from k3_sglang.platform_hooks import on_k3_cpu

    return on_k3_cpu()


def pageable_host_pool(original, *args, **kwargs):
    """AROUND a host pool's constructor (`HostKVCache`, `MambaPoolHost`): pin_memory=False, so no cudaHostRegister
    of its buffers and no pinned staging page per L3 read (both need an NVIDIA driver)."""
    kwargs["pin_memory"] = False
    return original(*args, **kwargs)


def bind_direct_transfer_ops() -> list[str]:
    """Give the host-pool modules the direct copy ops their CUDA import would have bound (only names they lack).
    Returns 'module.name' for each name bound now."""
    bound = []
    for name in TRANSFER_MODULES:
        module = importlib.import_module(name)
        for op_name, op in DIRECT_OPS.items():
            if getattr(module, op_name, None) is None:
                setattr(module, op_name, op)
                bound.append(f"{name}.{op_name}")
    return bound


def build_stack_with_cpu_ops(original, *args, **kwargs):
    """AROUND SGLang's MLA + KDA host-pool assembly: first binds torch versions of the three `direct` copy ops
    (hicache/transfer_ops.py) into pool_host.mla / pool_host.mamba, which import them from sgl_kernel on CUDA only."""
    bind_direct_transfer_ops()
    return original(*args, **kwargs)


def budget_with_cpu_reserve(original, *args, **kwargs):
    """AROUND every host pool's allocation check: a 1 GiB host-RAM reserve instead of a GPU server's 10 GiB for
    this call (on CPU the device pools already live in that RAM)."""
    from sglang.srt.mem_cache.pool_host import base

    saved = base.HICACHE_HOST_MEMORY_RESERVE_BYTES
    base.HICACHE_HOST_MEMORY_RESERVE_BYTES = min(saved, CPU_HOST_RESERVE_BYTES)
    try:
        return original(*args, **kwargs)
    finally:
        base.HICACHE_HOST_MEMORY_RESERVE_BYTES = saved


def lazy_host_buffer(dims: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled host tensor [*dims] on an anonymous private mmap that is not prefaulted: RAM is committed page by
    page as the tensor is written."""
    import mmap

    numel = math.prod(dims)
    nbytes = max(1, numel * torch.empty([], dtype=dtype).element_size())
    mapping = mmap.mmap(-1, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(mapping, dtype=dtype, count=numel).reshape(dims)


def lazy_pageable_host_alloc(original, dims, dtype, device, pin_memory, allocator, *args, **kwargs):
    """AROUND SGLang's host-pool buffer allocation: an unpinned buffer of SGLang's default allocator on CPU is mapped
    without prefaulting (lazy_host_buffer); anything else (pinned, shared-memory or storage allocators) is SGLang's."""
    from sglang.srt.mem_cache.pool_host.common import HostTensorAllocator

    if pin_memory or device != "cpu" or type(allocator) is not HostTensorAllocator or not math.prod(dims):
        return original(dims, dtype, device, pin_memory, allocator, *args, **kwargs)
    allocator.dtype, allocator.dims = dtype, dims
    return lazy_host_buffer(tuple(dims), dtype)


_IDENTITY = None  # this process's StorageIdentity, computed once from its ServerArgs


def storage_name_with_identity(original, model_name, host_pool):
    """AROUND the model name SGLang's storage backends key L3 objects on (`cache_controller.storage_model_name`):
    that name plus a digest of the checkpoint, page size, TP/PP/DCP sizes, dtypes and SGLang version
    (hicache/storage_identity.py), so an object written by anything else is never looked up. Writes the file
    backend's manifest beside its objects."""
    global _IDENTITY
    from sglang.srt.runtime_context import get_server_args

    from k3_sglang.hicache.storage_identity import identity_from_server_args, write_manifest

    args = get_server_args()
    if _IDENTITY is None:
        _IDENTITY = identity_from_server_args(args)
    if getattr(args, "hicache_storage_backend", None) == "file":
        try:
            directory = file_storage_dir(args, os.environ)
            os.makedirs(directory, exist_ok=True)
            write_manifest(directory, _IDENTITY)
        except OSError:
            pass  # for people only; the keys carry the identity
    return _IDENTITY.keyed_model_name(original(model_name, host_pool))


def corrupt_restored_kda(original, self, device_pool, host_indices, device_indices, layer_id, *args, **kwargs):
    """AROUND (K3_HICACHE_FAULT=corrupt-restored-kda only): restore one layer's KDA states, then overwrite the
    restored recurrent states (temporal [layers, slots, H, K, V], the slots in device_indices) with NaN. (k3-tiny's
    random-weight KDA forgets within a few tokens, so a small perturbation would not reach the answers; NaN does.)"""
    result = original(self, device_pool, host_indices, device_indices, layer_id, *args, **kwargs)
    temporal = self.buffer_info.temporal
    if temporal.numel() and layer_id < temporal.shape[0]:
        slots = device_indices.reshape(-1).to(device=temporal.device, dtype=torch.long)
        temporal[layer_id].index_fill_(0, slots, float("nan"))
    return result


def installed_hooks(fault: str = "none"):
    """(target, hook, hook type name) of every hook `register` installs (the fault hook only when asked for)."""
    hooks = [(KV_HOST_POOL_TARGET, pageable_host_pool, "AROUND"),
             (STATE_HOST_POOL_TARGET, pageable_host_pool, "AROUND"),
             (MAMBA_STACK_TARGET, build_stack_with_cpu_ops, "AROUND"),
             (HOST_BUDGET_TARGET, budget_with_cpu_reserve, "AROUND"),
             (HOST_ALLOC_TARGET, lazy_pageable_host_alloc, "AROUND"),
             (STORAGE_NAME_TARGET, storage_name_with_identity, "AROUND")]
    if fault == "corrupt-restored-kda":
        hooks.append((STATE_LOAD_TARGET, corrupt_restored_kda, "AROUND"))
    return hooks


@sglang_plugin
def register() -> None:
    """Entry point: register the hooks with SGLang's HookRegistry (it applies them), or do nothing when inactive."""
    if not active():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from k3_sglang.hicache.settings import HiCacheSettings

    settings = HiCacheSettings.from_env()
    for target, hook, kind in installed_hooks(settings.fault):
        HookRegistry.register(target, hook, HookType[kind])
