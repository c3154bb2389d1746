"""A stand-in for the lent GPU image's Python, for bench/gpu_check.sh's tests: this interpreter with its torch, triton
and pytest, but no sglang (importing it fails as on the image) and no install of this project (the editable
install's finder is removed, so k3_sglang comes only from PYTHONPATH, as the script sets it).

    <python> tests/utils/stand_in_python.py (-c CODE | -m MODULE | FILE | --version) [ARGS...]
"""
from __future__ import annotations

import importlib.abc
import os
import runpy
import sys


class NoSglang(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "sglang" or fullname.startswith("sglang."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (stand-in image without sglang)", name=fullname)
        return None


def _bare() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
    sys.meta_path.insert(0, NoSglang())
    for name in [m for m in sys.modules if m == "k3_sglang" or m.startswith(("k3_sglang.", "sglang"))]:
        del sys.modules[name]
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]


def main() -> None:
    _bare()
    args = sys.argv[1:]
    if not args or args[0] == "--version":
        print(f"Python {sys.version.split()[0]} (stand-in: no sglang, project not installed)")
        return
    if args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        sys.path.insert(0, "")
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
    elif args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
        runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
