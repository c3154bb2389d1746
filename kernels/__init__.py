"""K3 kernels: a pure-PyTorch reference per family (`<family>/naive.py`), portable Triton kernels beside it, and
`dispatch` choosing between them by device.

Import as `k3_sglang.kernels` (setup.py maps this folder there). The bare name `kernels` belongs to Hugging Face's
package, which SGLang imports (`from kernels import get_kernel`). When the repo root is on sys.path (`python -m`
from the checkout, or a test runner inserting it) a bare `import kernels` would find this folder first, so in that
case this file hands the import over to the installed Hugging Face package instead of shadowing it.
Nothing heavy is imported here: Triton modules load only when a Triton op is first dispatched.
"""
if __name__ == "kernels":  # imported by the bare name: defer to Hugging Face's `kernels`
    import importlib.machinery as _machinery
    import importlib.util as _util
    import os as _os
    import sys as _sys

    _root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    _search = [p for p in _sys.path if _os.path.abspath(p or _os.getcwd()) != _root]
    _spec = _machinery.PathFinder.find_spec("kernels", _search)
    if _spec is None or _spec.loader is None:
        del _sys.modules["kernels"]
        raise ModuleNotFoundError("No module named 'kernels' (this checkout's kernels/ is k3_sglang.kernels)",
                                  name="kernels")
    _module = _util.module_from_spec(_spec)
    _sys.modules["kernels"] = _module
    _spec.loader.exec_module(_module)
