"""Package layout: the top-level folders kernels/, parallel/ and launch/ install as
k3_sglang.kernels, k3_sglang.parallel and k3_sglang.launch, so that the import name
`kernels` stays free for Hugging Face's `kernels` package (an SGLang dependency)."""
from setuptools import find_packages, setup

NAMESPACED_FOLDERS = {"kernels": "k3_sglang.kernels", "parallel": "k3_sglang.parallel", "launch": "k3_sglang.launch"}


def _packages_and_dirs():
    packages = find_packages(include=["k3_sglang", "k3_sglang.*"])
    package_dir = {"k3_sglang": "k3_sglang"}
    for folder, name in NAMESPACED_FOLDERS.items():
        package_dir[name] = folder
        packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]
    return packages, package_dir


PACKAGES, PACKAGE_DIR = _packages_and_dirs()

setup(
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    package_data={"": ["*.json", "*.jinja", "*.yaml", "*.sh", "*.md", "*.txt"]},
    include_package_data=True,
)
