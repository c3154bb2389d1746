"""Which kernel tests run where (tests/utils/kernel_testing.py): a `gpu` test inside a `triton` module runs on a GPU,
interpreter tests stay off the GPU run."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.utils import kernel_testing
from tests.utils.kernel_testing import SKIP_GPU, SKIP_INTERPRETER, skip_reason


@pytest.mark.parametrize("keywords,requested,cuda,reason", [
    ({"gpu", "triton"}, True, True, None),  # a compiled test in an interpreter module, on a GPU run
    ({"gpu"}, True, True, None),
    ({"gpu", "triton"}, False, True, SKIP_GPU),
    ({"gpu"}, True, False, SKIP_GPU),
    ({"triton"}, True, True, SKIP_INTERPRETER),
    ({"triton"}, False, False, None),
    (set(), True, True, None),
])
def test_skip_reason(keywords, requested, cuda, reason):
    assert skip_reason(keywords, requested, cuda) == reason


def test_collection_hook_applies_it(monkeypatch):
    monkeypatch.setenv("K3_KERNEL_TESTS_ON_GPU", "1")
    monkeypatch.setattr(kernel_testing.torch.cuda, "is_available", lambda: True)
    items = [SimpleNamespace(keywords={"gpu", "triton"}, marks=[]), SimpleNamespace(keywords={"triton"}, marks=[])]
    for item in items:
        item.add_marker = item.marks.append
    kernel_testing.pytest_collection_modifyitems(None, items)
    assert items[0].marks == [] and items[1].marks[0].kwargs["reason"] == SKIP_INTERPRETER
