"""The portable model's layers through `kernels.dispatch` (these need SGLang: its RadixAttention, parallel state).
Same set-up as tests/kernels (TRITON_INTERPRET first, markers, poisoned torch.empty: tests/utils/kernel_testing.py);
bench/gpu_check.sh runs them compiled on CUDA only where SGLang 0.5.23 imports."""
from __future__ import annotations

import os
import sys
from pathlib import Path

if os.environ.get("K3_KERNEL_TESTS_ON_GPU") != "1":
    os.environ["TRITON_INTERPRET"] = "1"

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tests.utils.kernel_testing import (  # noqa: E402,F401 - pytest hooks and autouse fixtures
    poison_torch_empty, pytest_collection_modifyitems, pytest_configure, seed)
