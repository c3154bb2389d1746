"""The suite fails loudly when SGLang moves: no test skips on a missing SGLang module (pinned internals are hard
imports), and tests/kernels imports nothing beyond torch, triton and the kernels (it runs on the SGLang-free GPU
image; tests/model holds the layer tests that need SGLang). Static, under 1 s."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
KERNEL_TEST_IMPORTS = ("torch", "triton", "pytest", "numpy", "k3_sglang.kernels", "k3_sglang.tooling.bench", "tests.",
                       "test_")


def _modules(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def test_no_test_skips_on_a_missing_sglang_module():
    offenders = []
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("importorskip") and node.args
                    and "sglang" in ast.unparse(node.args[0])):
                offenders.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert offenders == []


def test_kernel_tests_import_only_torch_triton_and_the_kernels():
    stdlib = {"argparse", "copy", "functools", "importlib", "math", "os", "subprocess", "sys", "time", "types",
              "pathlib", "__future__", "dataclasses", "collections", "itertools"}
    offenders = []
    for path in (TESTS / "kernels").glob("*.py"):
        for module in _modules(ast.parse(path.read_text())):
            if module.split(".")[0] not in stdlib and not module.startswith(KERNEL_TEST_IMPORTS):
                offenders.append(f"{path.name}: {module}")
    assert offenders == []
