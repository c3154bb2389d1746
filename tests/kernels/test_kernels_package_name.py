"""`k3_sglang.kernels` (ours) and `kernels` (Hugging Face, imported by SGLang) must stay different packages,
even when the repo root is on sys.path (as under `python -m pytest` from the checkout)."""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_k3_kernels_is_not_hf_kernels():
    ours = importlib.import_module("k3_sglang.kernels")
    assert Path(ours.__file__).resolve() == REPO / "kernels" / "__init__.py"
    try:
        hf = importlib.import_module("kernels")
    except ModuleNotFoundError:
        pytest.skip("Hugging Face `kernels` is not installed")
    assert hf is not ours
    assert Path(hf.__file__).resolve() != REPO / "kernels" / "__init__.py"
    assert hasattr(hf, "get_kernel") and not hasattr(hf, "kda")


def test_bare_kernels_from_repo_root_is_hf():
    code = ("import kernels, k3_sglang.kernels as k3, sys; "
            "print(kernels.__file__); print(k3.__file__); print(sys.path[0] == '')")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    if out.returncode and "No module named 'kernels'" in out.stderr:
        pytest.skip("Hugging Face `kernels` is not installed")
    assert out.returncode == 0, out.stderr
    hf_file, k3_file, _ = out.stdout.splitlines()
    assert Path(hf_file).resolve() != REPO / "kernels" / "__init__.py"
    assert Path(k3_file).resolve() == REPO / "kernels" / "__init__.py"


def test_conftest_interpreter_is_honoured():
    """TRITON_INTERPRET=1 set by conftest (before any kernel import) turns @triton.jit kernels into interpreted ones."""
    import os

    if os.environ.get("K3_KERNEL_TESTS_ON_GPU") == "1":
        pytest.skip("compiled mode")
    from triton.runtime.interpreter import InterpretedFunction

    from k3_sglang.kernels.mla.decode import merge_states_kernel

    assert os.environ["TRITON_INTERPRET"] == "1"
    assert isinstance(merge_states_kernel, InterpretedFunction)
