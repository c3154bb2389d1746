"""Fingerprints of every SGLang (and torch / triton_kernels) target we hook or reach into, against a committed snapshot.

A target's fingerprint is its signature and the sha256 of its source (for a module or class, the whole text), or its
type and value for a constant. k3_sglang/sglang_fingerprints.json holds them as read against SGLang 0.5.23; `k3 hooks
check` prints each target whose fingerprint changed (with the inventory rows that depend on it), so an SGLang upgrade
names exactly the hooks to re-read; `k3 hooks snapshot` rewrites the file once they are re-read.
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import pkgutil
import re
import sys
from pathlib import Path

SNAPSHOT = Path(__file__).with_name("sglang_fingerprints.json")
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # a default's repr names its memory address: not part of the fingerprint


def watched_targets() -> dict[str, list[str]]:
    """Every watched dotted path -> the inventory rows that depend on it ('KIND target (owner)')."""
    from k3_sglang import hook_inventory
    from k3_sglang.sglang_reaches import REACHES

    out: dict[str, list[str]] = {}
    for h in hook_inventory.all_hooks():
        out.setdefault(h.target, []).append(f"{h.kind} {h.target} ({h.owner})")
    for r in REACHES:
        for path in r.watched:
            out.setdefault(path, []).append(f"{r.kind} {r.target} ({r.owner})")
    return out


def resolve(path: str) -> object:
    """The object a dotted path names, SGLang's original under any hook wrapper (classmethods unwrapped)."""
    owner_path, _, attr = path.rpartition(".")
    try:
        owner = pkgutil.resolve_name(owner_path)
    except (ImportError, AttributeError, ValueError):
        return pkgutil.resolve_name(path)  # a module
    if not hasattr(owner, attr):
        return pkgutil.resolve_name(path)  # a submodule not yet imported
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else None
    obj = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else getattr(owner, attr)
    return inspect.unwrap(obj) if callable(obj) else obj


def fingerprint(obj: object) -> dict[str, str | None]:
    """{'type', 'signature', 'source_sha256'} of a function, class or module; {'type', 'value'} of a constant."""
    kind = type(obj).__name__
    if not (callable(obj) or inspect.ismodule(obj)):
        value = repr(obj) if isinstance(obj, (int, float, str, bool, tuple)) or obj is None else None
        return {"type": kind, "value": value}
    try:
        signature = ADDRESS.sub("", str(inspect.signature(obj))) if callable(obj) else None
    except (TypeError, ValueError):
        signature = None
    try:
        source = hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()
    except (TypeError, OSError):
        source = None
    return {"type": kind, "signature": signature, "source_sha256": source}


def current() -> dict[str, dict]:
    """Fingerprint of every watched target in the installed SGLang ({'missing': reason} where it does not resolve)."""
    out = {}
    for path in sorted(watched_targets()):
        try:
            out[path] = fingerprint(resolve(path))
        except (ImportError, AttributeError, ValueError) as exc:
            out[path] = {"missing": f"{type(exc).__name__}: {exc}"}
    return out


def load_snapshot(path: Path = SNAPSHOT) -> dict:
    return json.loads(path.read_text())


def differences(snapshot: dict, now: dict[str, dict], rows: dict[str, list[str]] | None = None) -> list[str]:
    """One line per target whose fingerprint differs from the snapshot's, naming what changed and the rows to re-read."""
    rows = rows or {}
    lines = []
    before = snapshot.get("targets", {})
    for path in sorted(set(before) | set(now)):
        old, new = before.get(path), now.get(path)
        if old == new:
            continue
        if old is None:
            what = "new target, not in the snapshot"
        elif new is None:
            what = "no longer watched (row removed)"
        elif "missing" in new:
            what = f"gone: {new['missing']}"
        else:
            changed = [k for k in ("type", "signature", "source_sha256", "value") if old.get(k) != new.get(k)]
            what = "; ".join(f"signature {old.get(k)} -> {new.get(k)}" if k == "signature" else f"{k} changed"
                             for k in changed)
        lines.append(f"{path}: {what}" + "".join(f"\n    re-read: {r}" for r in rows.get(path, [])))
    return lines


def snapshot_document(now: dict[str, dict]) -> dict:
    from k3_sglang.sglang_guard import installed_sglang_version

    return {"sglang": installed_sglang_version(), "targets": now}


def check(args: argparse.Namespace) -> int:
    from k3_sglang.sglang_guard import SGLANG_PIN, installed_sglang_version

    snapshot = load_snapshot(Path(args.snapshot))
    lines = differences(snapshot, current(), watched_targets())
    installed = installed_sglang_version()
    print(f"k3 hooks check: SGLang {installed} (pinned {SGLANG_PIN}, snapshot of {snapshot.get('sglang')}), "
          f"{len(snapshot.get('targets', {}))} targets in the snapshot")
    for line in lines:
        print(f"CHANGED {line}")
    print(f"{len(lines)} target(s) changed" if lines else "no target changed")
    return 1 if lines else 0


def write_snapshot(args: argparse.Namespace) -> int:
    document = snapshot_document(current())
    Path(args.snapshot).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(f"k3 hooks snapshot: {len(document['targets'])} targets of SGLang {document['sglang']} -> {args.snapshot}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("hooks", help="check the SGLang targets we hook against the committed snapshot")
    sub = parser.add_subparsers(dest="hooks_command", metavar="ACTION", required=True)
    for name, func, help_text in (("check", check, "print every hooked or reached target that changed (exit 1)"),
                                  ("snapshot", write_snapshot, "rewrite the snapshot from the installed SGLang")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--snapshot", default=str(SNAPSHOT), help="fingerprint file (default: the committed one)")
        p.set_defaults(func=func)


if __name__ == "__main__":
    main_parser = argparse.ArgumentParser(prog="python -m k3_sglang.sglang_fingerprints")
    register(main_parser.add_subparsers(dest="command", required=True))
    parsed = main_parser.parse_args()
    sys.exit(parsed.func(parsed))
