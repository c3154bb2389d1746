"""Kernel-test setup (torch and Triton only: this folder must run on an image without SGLang, bench/gpu_check.sh).

TRITON_INTERPRET=1 is set here, before any Triton kernel module is imported (Triton reads it when @triton.jit
decorates a function), so a plain `pytest tests/kernels` runs the kernels on CPU and skips the `gpu` tests.
On a CUDA machine, K3_KERNEL_TESTS_ON_GPU=1 leaves TRITON_INTERPRET alone, runs the `gpu` tests compiled and
skips the interpreter (`triton`) tests, whose tensors live on the CPU (tests/utils/kernel_testing.py).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

if os.environ.get("K3_KERNEL_TESTS_ON_GPU") != "1":
    os.environ["TRITON_INTERPRET"] = "1"

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:  # for `tests.utils` under a plain `pytest`
    sys.path.insert(0, _REPO)

from tests.utils.kernel_testing import (  # noqa: E402,F401 - pytest hooks and autouse fixtures
    poison_torch_empty, pytest_collection_modifyitems, pytest_configure, seed)
