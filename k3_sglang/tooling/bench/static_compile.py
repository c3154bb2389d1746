"""Compile Triton kernels for a GPU that is not here: sm_90a (Hopper) and sm_100a (Blackwell) on a CPU machine.

`capture(arch)` swaps Triton's active driver for one that only names the target, and makes every `kernel[grid](...)`
launch inside the block compile without launching (Triton's own warm-up path: the real binder specializes the real
arguments, so constexprs, dtypes and 16-byte alignment hints are exactly what a GPU run would get). The launch
wrappers run unchanged on CPU tensors; what they compute after a launch is garbage and ignored. Each compiled kernel's
PTX then goes through the ptxas shipped in the triton wheel (`ptxas-blackwell` for sm_100a) with -v for registers
and spills, and `blocks_per_sm` turns registers, warps and shared memory into resident blocks per SM.
"""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    """A GPU architecture's per-SM limits (CUDA occupancy calculator figures for compute capability 9.0 / 10.0)."""

    name: str  # ptxas -arch
    capability: int  # GPUTarget arch
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    reg_alloc_unit: int = 256  # registers per warp are allocated in units of this many
    threads_per_sm: int = 2048
    blocks_per_sm: int = 32
    smem_per_sm: int = 228 * 1024
    smem_per_block: int = 227 * 1024  # the most one block may opt in to
    smem_reserved_per_block: int = 1024  # the driver keeps 1 KB of each block's shared memory


ARCHS = {"sm_90a": Arch("sm_90a", 90), "sm_100a": Arch("sm_100a", 100)}


@dataclass(frozen=True)
class Usage:
    """One compiled kernel: registers per thread, spill bytes, shared memory bytes per block, warps per block."""

    regs: int
    spill_stores: int
    spill_loads: int
    stack: int
    shared: int
    num_warps: int
    num_stages: int


class _TargetOnlyDriver:
    """Enough of a Triton driver for compiling: it names the target and never touches a device."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


@contextlib.contextmanager
def capture(arch: Arch):
    """Inside the block every Triton launch compiles for `arch` and is not run. Yields a list that collects
    (kernel name, CompiledKernel) per launch, in launch order."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("static compile: unset TRITON_INTERPRET (the interpreter compiles nothing)")
    launches: list = []
    original = JITFunction.run

    touched = []

    def compile_only(self, *args, grid, warmup, **kwargs):
        touched.append(self)
        kernel = original(self, *args, grid=grid, warmup=True, **kwargs)
        launches.append((self.fn.__name__, kernel))
        return kernel

    previous = driver._active
    driver.set_active(_TargetOnlyDriver(GPUTarget("cuda", arch.capability, 32)))
    JITFunction.run = compile_only
    try:
        yield launches
    finally:
        JITFunction.run = original
        for fn in touched:  # their per-device binders hold this target: a real launch (or another arch) rebuilds them
            fn.device_caches.clear()
        driver._active = previous  # None: Triton picks the real driver on next use


_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas(log: str) -> tuple[int, int, int, int]:
    """ptxas -v stderr of one entry function -> (registers, spill store bytes, spill load bytes, stack bytes)."""
    regs, spill = _REGS.search(log), _SPILL.search(log)
    if regs is None or spill is None:
        raise ValueError(f"ptxas -v output without register/spill lines:\n{log}")
    stack, stores, loads = (int(x) for x in spill.groups())
    return int(regs.group(1)), stores, loads, stack


def ptxas_usage(ptx: str, arch: Arch) -> tuple[int, int, int, int]:
    """Assemble PTX with the triton wheel's ptxas for arch (-v): (registers, spill stores, spill loads, stack)."""
    from triton import knobs

    tool = knobs.nvidia.ptxas_blackwell if arch.capability >= 100 else knobs.nvidia.ptxas
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run([tool.path, f"-arch={arch.name}", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"ptxas failed for {arch.name}:\n{done.stderr[-2000:]}")
    return parse_ptxas(done.stderr)


def usage_of(kernel, arch: Arch) -> Usage:
    """Registers and spills (ptxas -v) and shared memory (Triton's metadata) of one CompiledKernel."""
    regs, stores, loads, stack = ptxas_usage(kernel.asm["ptx"], arch)
    meta = kernel.metadata
    return Usage(regs, stores, loads, stack, int(meta.shared), int(meta.num_warps), int(meta.num_stages))


def blocks_per_sm(u: Usage, arch: Arch) -> int:
    """Resident blocks per SM, the least of the register, thread, block-count and shared-memory limits."""
    per_warp = -(-u.regs * 32 // arch.reg_alloc_unit) * arch.reg_alloc_unit
    by_regs = arch.regs_per_sm // (per_warp * u.num_warps) if u.regs else arch.blocks_per_sm
    by_threads = arch.threads_per_sm // (32 * u.num_warps)
    by_smem = arch.smem_per_sm // (u.shared + arch.smem_reserved_per_block)
    return min(by_regs, by_threads, arch.blocks_per_sm, by_smem)


def problems(u: Usage, arch: Arch) -> list[str]:
    """Why a compiled kernel is not acceptable on arch (empty when it is): spills, shared memory over the limit."""
    out = []
    if u.spill_stores or u.spill_loads:
        out.append(f"spills {u.spill_stores} B stores / {u.spill_loads} B loads")
    if u.shared > arch.smem_per_block:
        out.append(f"shared {u.shared} B > {arch.smem_per_block} B per block")
    if u.regs > arch.max_regs_per_thread:
        out.append(f"{u.regs} registers > {arch.max_regs_per_thread}")
    if blocks_per_sm(u, arch) < 1:
        out.append("no block fits on an SM")
    return out
