"""What each K3 model serves on each platform, as data: one `PlatformLimits` table per platform, one engine that reads
any of them, and docs/serving.md's refusal lists generated from the tables.

A table holds the parallel sizes (largest served), the flags with a closed set of served values, the switches that
must stay off or on, whether CUDA graphs are refused (eager only), and the few rules that span several flags (each a
documented function). The CPU table lives beside its plugin: `serving/sglang_cpu_limits.py` (SGLang's K3 on the
k3_cpu platform). On CUDA, SGLang's K3 checks its own arguments; only K3_CSV's verify contract is ours there
(`spec/contract.py`).

`deployment_refusals` picks the table from the `Deployment` (k3_sglang/deployment.py) and lists every reason at once;
`k3 serve` and `serving/launch.py` both call it. `python -m k3_sglang.serving.limits_table` prints the markdown of
every table; `--write` puts it into docs/serving.md between the `<!-- limits:KEY:begin/end -->` markers (a test keeps
them equal).
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

GRAPH_PHASES = ("decode", "prefill")


@dataclass(frozen=True)
class ParallelLimit:
    """One SGLang parallel size: its flag, the largest size served, what it is and why."""

    flag: str
    supported: int
    what: str
    why: str


@dataclass(frozen=True)
class AllowedValues:
    """A flag with a closed set of served values (None stands for SGLang's default); `upper`: compared upper-case."""

    flag: str
    values: tuple
    why: str
    upper: bool = False


@dataclass(frozen=True)
class Rule:
    """A refusal that spans several flags: `doc` for serving.md, `check(args)` the reasons (SGLang argument names)."""

    doc: str
    check: Callable[[object], list[str]]


@dataclass(frozen=True)
class PlatformLimits:
    """What one model serves on one platform. Messages: "{flag} {size}: {what} {parallel_phrase} (supported: N;
    why)", "{flag} {value}: {why} (served: ...)", "{flag}: {why}" for a switch that must stay off, the switch's own
    text for one that must be on, "CUDA graphs for PHASE (...): {eager}" when graphs are refused."""

    key: str
    title: str
    parallel: Mapping[str, ParallelLimit]
    parallel_phrase: str
    allowed: Mapping[str, AllowedValues] = field(default_factory=dict)
    must_be_off: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    must_be_on: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    eager: str | None = None
    rules: tuple[Rule, ...] = ()


def _value(args, name: str):
    value = getattr(args, name, None)
    return getattr(value, "value", value)  # enums (e.g. a resolved backend) compare by their string value


def graph_backend(args, phase: str) -> str | None:
    """The CUDA graph backend SGLang would pick for phase from these arguments, by its own precedence
    (legacy --disable-cuda-graph < --disable-<phase>-cuda-graph < --cuda-graph-backend-<phase> < --cuda-graph-config);
    None means SGLang's default (graphs on, on CUDA)."""
    backend = None
    if getattr(args, "disable_cuda_graph", False) or getattr(args, f"disable_{phase}_cuda_graph", False):
        backend = "disabled"
    explicit = getattr(args, f"cuda_graph_backend_{phase}", None)
    if explicit is not None:
        backend = str(explicit)
    config = getattr(args, "cuda_graph_config", None)
    phase_config = config.get(phase) if isinstance(config, dict) else getattr(config, phase, None)
    phase_backend = phase_config.get("backend") if isinstance(phase_config, dict) else getattr(phase_config, "backend", None)
    return backend if phase_backend is None else str(phase_backend)


def table_refusals(table: PlatformLimits, args) -> list[str]:
    """Every reason `table` refuses `args` (SGLang argument names: a parsed command line or a ServerArgs)."""
    reasons = []
    for name, limit in table.parallel.items():
        size = getattr(args, name, 1)
        if size is not None and int(size) > limit.supported:
            reasons.append(f"{limit.flag} {size}: {limit.what} {table.parallel_phrase} (supported: "
                           f"{limit.supported}; {limit.why})")
    for name, allowed in table.allowed.items():
        value = _value(args, name)
        seen = str(value).upper() if allowed.upper and value is not None else value
        if seen not in allowed.values:
            shown = ", ".join(str(a) for a in allowed.values if a is not None) or "none"
            reasons.append(f"{allowed.flag} {value}: {allowed.why} (served: {shown})")
    for rule in table.rules:
        reasons += rule.check(args)
    for name, (flag, text) in table.must_be_on.items():
        if not getattr(args, name, False):
            reasons.append(text)
    for name, (flag, why) in table.must_be_off.items():
        if getattr(args, name, False):
            reasons.append(f"{flag}: {why}")
    if table.eager:
        for phase in GRAPH_PHASES:
            backend = graph_backend(args, phase)
            if backend != "disabled":
                shown = backend or "SGLang's default: on"
                reasons.append(f"CUDA graphs for {phase} ({shown}): {table.eager} "
                               f"(--cuda-graph-backend-{phase} disabled, k3 serve's default there)")
    return reasons


def deployment_refusals(deployment, args, cpu_env: Mapping[str, str] | None = None) -> list[str]:
    """Every reason SGLang's K3 cannot serve `args` on the deployment's platform (empty when it can); with cpu_env (a
    CPU host: the server's environment) also what HiCache cannot do there (hicache/serve_flags.py)."""
    from k3_sglang.hicache.serve_flags import cpu_hicache_refusals

    hicache = cpu_hicache_refusals(args, cpu_env) if cpu_env is not None and deployment.on_cpu else []
    if deployment.on_cpu:
        from k3_sglang.serving import sglang_cpu_limits

        return sglang_cpu_limits.refusals(args) + hicache
    if deployment.k3_csv:
        from k3_sglang.spec.contract import contract_refusals

        return contract_refusals(args)
    return []  # SGLang's K3 on CUDA checks its own arguments


def refusal_message(deployment, reasons: list[str]) -> str:
    """The one error `k3 serve` and the launcher print for the deployment's reasons."""
    if deployment.on_cpu:
        from k3_sglang.serving import sglang_cpu_limits

        return sglang_cpu_limits.refusal_message(reasons)
    return "SGLang's K3 cannot serve this configuration:\n  - " + "\n  - ".join(reasons)


# -- docs/serving.md --------------------------------------------------------------------------------------------------
DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def tables() -> list[PlatformLimits]:
    from k3_sglang.serving import sglang_cpu_limits

    return [sglang_cpu_limits.limits()]


def _served(values: tuple) -> str:
    return ", ".join("unset (SGLang's default)" if v is None else f"`{v}`" for v in values)


def markdown(table: PlatformLimits) -> str:
    """The table's refusal list as serving.md shows it."""
    rows = ["| flag | served | why |", "|---|---|---|"]
    rows += [f"| `{p.flag}` | up to {p.supported} | {p.what}: {p.why} |" for p in table.parallel.values()]
    rows += [f"| `{a.flag}` | {_served(a.values)} | {a.why} |" for a in table.allowed.values()]
    rows += [f"| `{flag}` | on | {text} |" for flag, text in table.must_be_on.values()]
    rows += [f"| `{flag}` | off | {why} |" for flag, why in table.must_be_off.values()]
    if table.eager:
        rows.append(f"| `--cuda-graph-backend-{{decode,prefill}}`, `--cuda-graph-config`, `--disable-cuda-graph` "
                    f"| `disabled` (CUDA graphs off) | {table.eager} |")
    lines = [f"{table.title}:", "", *rows]
    if table.rules:
        lines += ["", "And across flags:", ""] + [f"- {rule.doc}" for rule in table.rules]
    return "\n".join(lines)


def markers(table: PlatformLimits) -> tuple[str, str]:
    return f"<!-- limits:{table.key}:begin -->", f"<!-- limits:{table.key}:end -->"


def rendered_doc(text: str) -> str:
    """serving.md's text with every table's block regenerated (ValueError when a marker pair is missing)."""
    for table in tables():
        begin, end = markers(table)
        if begin not in text or end not in text:
            raise ValueError(f"docs/serving.md has no {begin} ... {end} block")
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{markdown(table)}\n{end}{tail}"
    return text


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        DOC.write_text(rendered_doc(DOC.read_text()))
        print(f"wrote the limits tables into {DOC}")
        return 0
    if argv:
        print("usage: python -m k3_sglang.serving.limits_table [--write]", file=sys.stderr)
        return 2
    for table in tables():
        begin, end = markers(table)
        print(f"{begin}\n{markdown(table)}\n{end}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
