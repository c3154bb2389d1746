"""Product apart from tooling: what a server or router process imports holds no benchmark, simulator or mock module
of ours; the runtime never imports k3_sglang.tooling (only the CLI reaches it, lazily); serving and spec do not
import each other both ways (no cycle). About 15 s (two subprocess imports, one of them SGLang's plugin modules)."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLING_NAME = re.compile(r"(^|[._])(bench|benchmark|sim|simulator|mock|mock_worker|tooling)([._]|$)")
# folders installed as runtime packages (setup.py maps kernels/, parallel/, launch/ under k3_sglang.)
RUNTIME_ROOTS = {"k3_sglang": REPO / "k3_sglang", "k3_sglang.kernels": REPO / "kernels",
                 "k3_sglang.parallel": REPO / "parallel", "k3_sglang.launch": REPO / "launch"}
# the only runtime modules allowed to reach the tooling package, and only inside a function (lazy)
LAZY_TOOLING_ENTRIES = {"k3_sglang.cli", "k3_sglang.router.cli"}


def _imported_modules(code: str) -> list[str]:
    """Every module `python -X importtime -c CODE` imported, in order."""
    run = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    return [line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")][1:]


def _ours(modules: list[str]) -> list[str]:
    return [m for m in modules if m == "k3_sglang" or m.startswith("k3_sglang.")]


def test_launch_imports_no_bench_sim_or_mock_module():
    modules = _imported_modules("import k3_sglang.serving.launch")
    ours = _ours(modules)
    assert "k3_sglang.serving.launch" in ours and "k3_sglang.serving.guards" in ours  # the parse saw our imports
    assert [m for m in ours if TOOLING_NAME.search(m.removeprefix("k3_sglang"))] == []


def test_server_and_router_processes_import_no_tooling():
    """What SGLang's server processes load of ours (plugins, the CPU kernels and backends, the K3_CSV worker) and the
    router."""
    code = ("import k3_sglang.serving.launch, k3_sglang.spec.plugin, k3_sglang.platform_hooks, k3_sglang.platform, "
            "k3_sglang.sglang_cpu.hooks, k3_sglang.sglang_cpu.mla_backend, k3_sglang.dcp_mla.backend, k3_sglang.spec.worker, k3_sglang.spec.pp_hooks, k3_sglang.router.app, "
            "k3_sglang.router.cli")
    ours = _ours(_imported_modules(code))
    assert "k3_sglang.spec.worker" in ours and "k3_sglang.router.proxy" in ours
    assert [m for m in ours if TOOLING_NAME.search(m.removeprefix("k3_sglang"))] == []


def _runtime_modules():
    """(module name, path) of every runtime source file (the tooling package excluded)."""
    for package, root in RUNTIME_ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            if not name.startswith("k3_sglang.tooling"):
                yield name, path


def _imports(path: Path, module: str) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import statement of one file, relative ones resolved."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}".rstrip(".")
            found += [(base, id(node) in top_level)] + [(f"{base}.{a.name}", id(node) in top_level) for a in node.names]
    return found


def test_runtime_never_imports_the_tooling_package():
    offenders = []
    for module, path in _runtime_modules():
        for imported, top in _imports(path, module):
            if imported.startswith("k3_sglang.tooling") and (top or module not in LAZY_TOOLING_ENTRIES):
                offenders.append(f"{module} -> {imported}")
    assert offenders == []


def test_no_import_cycle_between_serving_and_spec():
    edges = set()
    for module, path in _runtime_modules():
        src = module.split(".")[1] if module.count(".") else ""
        for imported, _ in _imports(path, module):
            dst = imported.split(".")[1] if imported.startswith("k3_sglang.") else ""
            if {src, dst} == {"serving", "spec"}:
                edges.add((src, dst))
    assert ("spec", "serving") not in edges, "spec imports serving"
    assert not ({("serving", "spec"), ("spec", "serving")} <= edges)


def test_the_checks_see_a_violation(tmp_path):
    """The AST reader resolves the import forms the checks depend on (so an empty offender list means something)."""
    path = tmp_path / "mod.py"
    path.write_text("from k3_sglang.tooling.bench import serve\nfrom ..serving import settings\n"
                    "def f():\n    import k3_sglang.tooling.router.replay\n")
    found = _imports(path, "k3_sglang.spec.mod")
    assert ("k3_sglang.tooling.bench", True) in found and ("k3_sglang.serving.settings", True) in found
    assert ("k3_sglang.tooling.router.replay", False) in found
    assert TOOLING_NAME.search(".router.mock_worker") and TOOLING_NAME.search(".tooling.spec.sim")
    assert not TOOLING_NAME.search(".spec.similarity") and not TOOLING_NAME.search(".serving.launch")
