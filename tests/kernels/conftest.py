"""Kernel-test setup: Triton's CPU interpreter, NaN-poisoned torch.empty, seeds, markers.

TRITON_INTERPRET=1 is set here, before any Triton kernel module is imported (Triton reads it when @triton.jit
decorates a function), so a plain `pytest tests/kernels` runs the kernels on CPU and skips the `gpu` tests.
On a CUDA machine, K3_KERNEL_TESTS_ON_GPU=1 leaves TRITON_INTERPRET alone, runs the `gpu` tests compiled and
skips the interpreter (`triton`) tests, whose tensors live on the CPU.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

if os.environ.get("K3_KERNEL_TESTS_ON_GPU") != "1":
    os.environ["TRITON_INTERPRET"] = "1"

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:  # for `tests.utils.numerics` under a plain `pytest`
    sys.path.insert(0, _REPO)

import pytest  # noqa: E402
import torch  # noqa: E402

_POISONED = ("empty", "empty_like", "empty_strided")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "triton: runs a Triton kernel (interpreted on CPU, compiled on CUDA)")
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped elsewhere")
    # the interpreter evaluates masked-off lanes too (log(0), inf * 0); kernels mask those results explicitly
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    on_gpu = os.environ.get("K3_KERNEL_TESTS_ON_GPU") == "1" and torch.cuda.is_available()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device and K3_KERNEL_TESTS_ON_GPU=1")
    skip_interp = pytest.mark.skip(reason="interpreter test (CPU tensors); K3_KERNEL_TESTS_ON_GPU=1 is set")
    for item in items:
        if "gpu" in item.keywords and not on_gpu:
            item.add_marker(skip_gpu)
        elif "triton" in item.keywords and os.environ.get("K3_KERNEL_TESTS_ON_GPU") == "1":
            item.add_marker(skip_interp)


def _poison(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point() or t.is_complex():
        return t.fill_(float("nan"))
    if t.dtype == torch.bool:
        return t.fill_(True)
    return t.fill_(torch.iinfo(t.dtype).max)


@pytest.fixture(autouse=True)
def poison_torch_empty(monkeypatch: pytest.MonkeyPatch):
    """Every torch.empty* in a kernel test returns NaN (floats) or the dtype's max (ints), so unwritten outputs fail."""
    for name in _POISONED:
        original = getattr(torch, name)

        def poisoned(*args, __original=original, **kwargs):
            return _poison(__original(*args, **kwargs))

        monkeypatch.setattr(torch, name, poisoned)
    yield


@pytest.fixture(autouse=True)
def seed() -> None:
    torch.manual_seed(42)
