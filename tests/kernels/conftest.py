"""Kernel-test setup: Triton's CPU interpreter, NaN-poisoned torch.empty, seeds, markers.

TRITON_INTERPRET=1 is set here, before any Triton kernel module is imported (Triton reads it when @triton.jit
decorates a function), so a plain `pytest tests/kernels` runs the kernels on CPU. On a CUDA machine export
K3_KERNEL_TESTS_ON_GPU=1 to keep the env untouched and run the same tests compiled.
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
