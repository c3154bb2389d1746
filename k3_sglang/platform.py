"""Out-of-tree SGLang platform that runs the real SGLang server on a CPU-only host.

SGLang discovers platforms through the `sglang.srt.platforms` entry-point group; our
entry point `k3_cpu` returns the dotted name of `K3CpuPlatform`, or None to stay inert.
It activates when `SGLANG_PLATFORM=k3_cpu` is set (what `k3 serve` does on a host with
no GPU), so a CUDA host is never affected unless asked for.

The platform uses the OOT enum, so `is_cpu()` / `is_cuda()` stay False and SGLang never
loads sgl_kernel's CPU ops (absent from the PyPI wheel); attention resolves to
torch_native, sampling to pytorch, graphs off, collectives over gloo.
"""

from __future__ import annotations

import os

PLATFORM_NAME = "k3_cpu"


def k3_cpu_platform() -> str | None:
    """Entry point: the platform class path when selected, else None (inert)."""
    if os.environ.get("SGLANG_PLATFORM", "") == PLATFORM_NAME:
        return "k3_sglang.platform_cpu.K3CpuPlatform"
    return None


def cuda_available() -> bool:
    """True when a usable CUDA device is present (checked without importing sglang)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)
    except Exception:  # noqa: BLE001 - a broken driver counts as "no CUDA"
        return False
