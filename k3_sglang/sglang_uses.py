"""Find, in our source, every place that reaches into SGLang (or torch) beyond calling it: an attribute assigned on an
SGLang module, class or torch object, a `setattr` on one, a private (`_name`) SGLang name read, a subclass of an
SGLang class, an `SGLANG_*` environment variable set. `k3 hooks check` and tests/unit/test_hook_inventory.py hold
what this finds against the rows of k3_sglang/hook_inventory.py, so a new reach into SGLang without a row fails.

A static scan (Python's `ast`): names are resolved through each file's imports (`import sglang.x as m`,
`from sglang.x import y`), so `m.f = g`, `setattr(m, ...)`, `m._private`, `class C(y)` and `env["SGLANG_X"] = ...`
are found; a reach through a local variable (an object SGLang handed us) is not, and is listed by hand.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# source folders installed as k3_sglang packages (setup.py), scanned alike
SOURCE_ROOTS = ("k3_sglang", "kernels", "parallel", "launch")
REACHED = ("sglang", "torch", "triton_kernels")  # packages whose objects we must not change unlisted
ENV_NAME = re.compile(r"^SGLANG_[A-Z0-9_]+$")
ENV_WORD = re.compile(r"^(SGLANG_[A-Z0-9_]+)=")


@dataclass(frozen=True)
class Use:
    """One reach into SGLang: kind (SETATTR, PRIVATE_READ, SUBCLASS, ENV), the dotted target, where it is."""

    kind: str
    target: str
    module: str
    line: int


def _module_name(path: Path, repo: Path) -> str:
    parts = list(path.relative_to(repo).with_suffix("").parts)
    if parts[0] != "k3_sglang":
        parts.insert(0, "k3_sglang")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


class _Scanner(ast.NodeVisitor):
    def __init__(self, module: str):
        self.module = module
        self.aliases: dict[str, str] = {}
        self.uses: list[Use] = []

    def _add(self, kind: str, target: str, node: ast.AST) -> None:
        self.uses.append(Use(kind, target, self.module, node.lineno))

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name.split(".")[0] in REACHED:
                self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.level == 0 and node.module.split(".")[0] in REACHED:
            for a in node.names:
                self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                if _private(a.name):
                    self._add("PRIVATE_READ", f"{node.module}.{a.name}", node)

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted path an expression names through this file's imports, or None."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base = self.resolve(node.value)
        if base and base.startswith("sglang") and _private(node.attr) and isinstance(node.ctx, ast.Load):
            self._add("PRIVATE_READ", f"{base}.{node.attr}", node)
        self.generic_visit(node)

    def _assigned(self, target: ast.AST, node: ast.AST) -> None:
        if isinstance(target, ast.Attribute):
            base = self.resolve(target.value)
            if base:
                self._add("SETATTR", f"{base}.{target.attr}", node)
        elif isinstance(target, ast.Subscript) and _env_key(target.slice):
            self._add("ENV", target.slice.value, node)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._assigned(t, node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._assigned(t, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._assigned(node.target, node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "setattr" and node.args:
            base = self.resolve(node.args[0])
            name = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else "*"
            self._add("SETATTR", f"{base or '<object>'}.{name}", node)
        if isinstance(func, ast.Attribute) and func.attr in ("setdefault", "pop") and node.args \
                and _env_key(node.args[0]):
            self._add("ENV", node.args[0].value, node)
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        """A rendered `SGLANG_X=...` word (launch scripts)."""
        first = node.values[0] if node.values else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            match = ENV_WORD.match(first.value)
            if match:
                self._add("ENV", match.group(1), node)
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        for key in node.keys:
            if key is not None and _env_key(key):
                self._add("ENV", key.value, node)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            path = self.resolve(base)
            if path and path.startswith("sglang"):
                self._add("SUBCLASS", path, node)
        self.generic_visit(node)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _env_key(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(ENV_NAME.match(node.value))


def scan_file(path: Path, repo: Path = REPO) -> list[Use]:
    """The uses in one source file under `repo` (its module name taken from its path there)."""
    scanner = _Scanner(_module_name(path, repo))
    tree = ast.parse(path.read_text(), str(path))
    # imports first (a function-level `from sglang... import m` counts for the whole file: names are not reused)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            scanner.visit(node)
    scanner.uses.clear()
    scanner.visit(tree)
    return scanner.uses


def scan(repo: Path = REPO) -> list[Use]:
    """Every use in our source folders, the tooling package included (benchmarks start servers too)."""
    uses: list[Use] = []
    for root in SOURCE_ROOTS:
        for path in sorted((repo / root).rglob("*.py")):
            uses += scan_file(path, repo)
    return uses
