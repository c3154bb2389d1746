"""A checkout on PYTHONPATH without an install (the lent GPU image): kernels/, parallel/ and launch/ import as
k3_sglang.kernels/.parallel/.launch exactly as setup.py maps them (k3_sglang/_checkout.py). About 10 s."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from k3_sglang import _checkout

REPO = Path(__file__).resolve().parents[2]


def test_folders_match_setup_py():
    tree = ast.parse((REPO / "setup.py").read_text())
    mapping = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                   and getattr(node.targets[0], "id", "") == "NAMESPACED_FOLDERS")
    assert mapping == {folder: f"k3_sglang.{folder}" for folder in _checkout.FOLDERS}


def test_uninstalled_checkout_resolves_the_mapped_folders():
    code = ("import k3_sglang.kernels.dispatch, k3_sglang.parallel.tp, k3_sglang.launch.render, sys\n"
            "mods = [sys.modules[m] for m in ('k3_sglang.kernels.dispatch', 'k3_sglang.parallel.tp', "
            "'k3_sglang.launch.render')]\nprint('\\n'.join(m.__file__ for m in mods))")
    run = subprocess.run([sys.executable, str(REPO / "tests/utils/stand_in_python.py"), "-c", code], cwd="/",
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == [str(REPO / "kernels/dispatch.py"), str(REPO / "parallel/tp.py"),
                                  str(REPO / "launch/render.py")]


def test_inert_for_an_installed_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, _checkout.CheckoutFolders)])
    (tmp_path / "k3_sglang").mkdir()
    _checkout.install(str(tmp_path / "k3_sglang"))  # no setup.py beside it: site-packages
    assert not any(isinstance(f, _checkout.CheckoutFolders) for f in sys.meta_path)
    finder = _checkout.CheckoutFolders(str(REPO))
    assert finder.find_spec("k3_sglang.tests") is None and finder.find_spec("kernels") is None
    assert finder.find_spec("k3_sglang.kernels").origin == str(REPO / "kernels" / "__init__.py")
