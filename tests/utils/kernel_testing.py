"""Shared set-up of the kernel and model-through-dispatch tests (tests/kernels/, tests/model/): markers, which tests
run where, NaN-poisoned torch.empty, seeds. Each folder's conftest sets TRITON_INTERPRET first, then imports these.

Where tests run: on CPU (the default) the `triton` tests run interpreted and the `gpu` tests are skipped; with
K3_KERNEL_TESTS_ON_GPU=1 on a CUDA machine the `gpu` tests run compiled, including `gpu` tests inside a `triton`
module, and the interpreter-only `triton` tests (CPU tensors) are skipped.
"""
from __future__ import annotations

import os
from collections.abc import Container

import pytest
import torch

GPU_ENV = "K3_KERNEL_TESTS_ON_GPU"
SKIP_GPU = "needs a CUDA device and K3_KERNEL_TESTS_ON_GPU=1"
SKIP_INTERPRETER = "interpreter test (CPU tensors); K3_KERNEL_TESTS_ON_GPU=1 is set"
_POISONED = ("empty", "empty_like", "empty_strided")


def gpu_requested() -> bool:
    return os.environ.get(GPU_ENV) == "1"


def skip_reason(keywords: Container[str], on_gpu_requested: bool, cuda_available: bool) -> str | None:
    """Why a test with these marker keywords does not run here (None: it runs)."""
    if "gpu" in keywords:
        return None if on_gpu_requested and cuda_available else SKIP_GPU
    if "triton" in keywords and on_gpu_requested:
        return SKIP_INTERPRETER
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "triton: runs a Triton kernel (interpreted on CPU, compiled on CUDA)")
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped elsewhere")
    # the interpreter evaluates masked-off lanes too (log(0), inf * 0); kernels mask those results explicitly
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    requested = gpu_requested()
    cuda = requested and torch.cuda.is_available()
    for item in items:
        reason = skip_reason(item.keywords, requested, cuda)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


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
