"""`k3 bench kernels --static`: every Triton kernel a GPU server of ours runs, compiled on this (CPU) machine for
sm_90a and sm_100a at K3's production shapes (static_cases.py), with registers, spills, shared memory and resident
blocks per SM; exit 1 if any launch spills or needs more shared memory than its architecture allows.

Results are cached per entry, keyed by the Triton version and a hash of the kernel sources plus these tools: the
committed k3_sglang/tooling/bench/kernels_static.json (written by `--write`, which also rewrites the table in
docs/kernels.md), then $K3_CACHE_DIR/kernels_static.json (else ~/.cache/k3_sglang/), where fresh compiles go.
A kernel edit changes its hash, so the next run compiles it again (about 2-5 s per launch and architecture).

    k3 bench kernels --static                 # table; compiles only what no cache holds
    k3 bench kernels --static --refresh       # compile everything again
    k3 bench kernels --static --write         # and rewrite the committed cache and docs/kernels.md's table
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from k3_sglang.tooling.bench import static_cases, static_compile
from k3_sglang.tooling.bench.static_compile import ARCHS, Usage, blocks_per_sm, problems

COMMITTED = Path(__file__).with_name("kernels_static.json")
ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "kernels.md"
BEGIN, END = "<!-- static-table:begin -->", "<!-- static-table:end -->"
_TOOLS = (Path(static_cases.__file__), Path(static_compile.__file__))


def user_cache() -> Path:
    base = os.environ.get("K3_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "k3_sglang")
    return Path(base) / "kernels_static.json"


def source_hash(case: static_cases.Case) -> str:
    """Triton version + the sources a case compiles from + these tools: a change in any of them recompiles."""
    import triton

    h = hashlib.sha256(triton.__version__.encode())
    for rel in case.modules:
        h.update((ROOT / rel).read_bytes())
    for tool in _TOOLS:
        h.update(tool.read_bytes())
    return h.hexdigest()[:16]


def entry_key(case: static_cases.Case, arch: str) -> str:
    import triton

    return f"triton {triton.__version__} | {source_hash(case)} | {arch} | {case.id}"


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())["entries"]
    except (OSError, ValueError, KeyError):
        return {}


def _save(path: Path, entries: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"entries": dict(sorted(entries.items()))}, indent=1) + "\n")
    tmp.replace(path)


def compile_case(case: static_cases.Case, arch: str) -> list[dict]:
    """Compile one case for arch: one dict per launch (kernel name and Usage fields)."""
    with static_compile.capture(ARCHS[arch]) as launches:
        case.call()
    if not launches:
        raise RuntimeError(f"static compile: case {case.id!r} launched no Triton kernel")
    return [{"kernel": name, **asdict(static_compile.usage_of(k, ARCHS[arch]))} for name, k in launches]


def results(refresh: bool = False, log=None) -> list[tuple[str, str, dict]]:
    """(case id, arch, launch dict) for every case and architecture; cached entries unless refresh."""
    cached = {} if refresh else {**_load(COMMITTED), **_load(user_cache())}
    fresh, rows = {}, []
    for case in static_cases.cases():
        for arch in ARCHS:
            key = entry_key(case, arch)
            if key not in cached:
                if log:
                    log(f"compiling {arch}: {case.id}")
                fresh[key] = cached[key] = compile_case(case, arch)
            rows += [(case.id, arch, launch) for launch in cached[key]]
    if fresh:
        _save(user_cache(), {**_load(user_cache()), **fresh})
    return rows


def current_entries(rows) -> dict:
    """The cache entries of these rows (what --write commits: stale keys are dropped)."""
    by_key: dict = {}
    cases = {c.id: c for c in static_cases.cases()}
    for case_id, arch, launch in rows:
        by_key.setdefault(entry_key(cases[case_id], arch), []).append(launch)
    return by_key


def verdicts(rows) -> list[str]:
    """One line per launch that is not acceptable (spills, shared memory over the limit)."""
    bad = []
    for case_id, arch, launch in rows:
        u = _usage(launch)
        bad += [f"{arch} {case_id} {launch['kernel']}: {p}" for p in problems(u, ARCHS[arch])]
    return bad


def _usage(launch: dict) -> Usage:
    return Usage(**{k: v for k, v in launch.items() if k != "kernel"})


def table(rows) -> str:
    """Markdown table: one row per launch and architecture."""
    lines = ["| case | kernel | arch | regs | spill st/ld B | shared KB | warps | stages | blocks/SM | warps/SM |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for case_id, arch, launch in rows:
        u = _usage(launch)
        blocks = blocks_per_sm(u, ARCHS[arch])
        lines.append(f"| {case_id} | {launch['kernel']} | {arch} | {u.regs} | {u.spill_stores}/{u.spill_loads} | "
                     f"{u.shared / 1024:.1f} | {u.num_warps} | {u.num_stages} | {blocks} | {blocks * u.num_warps} |")
    return "\n".join(lines)


def write_doc(rows, doc: Path = DOC) -> None:
    """Replace the text between the static-table markers in docs/kernels.md."""
    import triton

    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise RuntimeError(f"{doc}: markers {BEGIN} / {END} missing")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    body = (f"\nTriton {triton.__version__}, ptxas from the triton wheel (`k3 bench kernels --static --write`).\n\n"
            f"{table(rows)}\n")
    doc.write_text(head + BEGIN + body + END + tail)


def run(args) -> int:
    rows = results(refresh=getattr(args, "refresh", False), log=lambda m: print(m, file=sys.stderr, flush=True))
    print(table(rows))
    if getattr(args, "write", False):
        _save(COMMITTED, current_entries(rows))
        write_doc(rows)
        print(f"wrote {COMMITTED} and the table in {DOC}", file=sys.stderr)
    bad = verdicts(rows)
    print(f"\n{len(rows)} launches compiled for {', '.join(ARCHS)}; "
          + ("no spills, shared memory within limits" if not bad else f"{len(bad)} problems:\n" + "\n".join(bad)))
    return 1 if bad else 0
