"""A source checkout used without installing it (the repo root on PYTHONPATH: a GPU image that runs only the
kernels, bench/gpu_check.sh): the top-level folders kernels/, parallel/ and launch/ import as k3_sglang.kernels,
k3_sglang.parallel and k3_sglang.launch, as setup.py's package_dir maps them for an install. Inert when installed:
an install (or an editable install's finder) answers those names before this finder is asked."""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

FOLDERS = ("kernels", "parallel", "launch")  # setup.py NAMESPACED_FOLDERS (tests/unit/test_checkout_imports.py)


class CheckoutFolders(importlib.abc.MetaPathFinder):
    """Finds k3_sglang.<folder> in the checkout root; submodules then resolve through the package's __path__."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        parent, _, name = fullname.rpartition(".")
        init = os.path.join(self.root, name, "__init__.py")
        if parent != "k3_sglang" or name not in FOLDERS or not os.path.isfile(init):
            return None
        return importlib.util.spec_from_file_location(fullname, init,
                                                      submodule_search_locations=[os.path.dirname(init)])


def install(package_dir: str) -> None:
    """Register the finder when k3_sglang/ sits in a checkout (setup.py beside it), once per process."""
    root = os.path.dirname(os.path.abspath(package_dir))
    if not os.path.isfile(os.path.join(root, "setup.py")):
        return  # an installed copy: setup.py mapped the folders into the package
    if not any(isinstance(finder, CheckoutFolders) for finder in sys.meta_path):
        sys.meta_path.append(CheckoutFolders(root))
