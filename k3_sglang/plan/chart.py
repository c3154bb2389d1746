"""The capacity chart: logical KV tokens and sessions against DCP size, one line per GPU count."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from k3_sglang.plan.capacity import make_plan
from k3_sglang.plan.errors import PlanError
from k3_sglang.plan.spec import PlanSpec
from k3_sglang.plan.topology import Group, Topology

SWEEP_TP = (4, 8, 16, 32)
SWEEP_DCP = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class SweepPoint:
    """One TP x DCP configuration of a single group on the spec's system."""

    gpus: int
    dcp: int
    logical_kv_tokens: int
    sessions: int
    binding: str


def capacity_sweep(spec: PlanSpec, tps: tuple[int, ...] = SWEEP_TP,
                   dcps: tuple[int, ...] = SWEEP_DCP) -> list[SweepPoint]:
    """Every valid unified TP x DCP group (EP = TP) that fits the spec's system; invalid ones are skipped."""
    model = spec.load_model()
    points = []
    for tp in tps:
        for dcp in dcps:
            group = Group(role="unified", tp=tp, dcp=dcp, ep=tp)
            trial = dataclasses.replace(spec, topology=Topology((group,)), name=f"sweep-tp{tp}-dcp{dcp}")
            try:
                plan = make_plan(trial, model).groups[0]
            except PlanError:
                continue
            points.append(SweepPoint(tp, dcp, plan.bound.logical_kv_tokens or 0, plan.sessions, plan.binding))
    return points


def draw_chart(spec: PlanSpec, path: str | Path, points: list[SweepPoint] | None = None) -> Path:
    """Write the two-panel PNG; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = capacity_sweep(spec) if points is None else points
    if not points:
        raise PlanError("chart", f"no TP x DCP configuration fits {spec.system.name}")
    fig, (kv_ax, sess_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for gpus in sorted({p.gpus for p in points}):
        line = sorted((p for p in points if p.gpus == gpus), key=lambda p: p.dcp)
        dcps = [p.dcp for p in line]
        kv_ax.plot(dcps, [p.logical_kv_tokens / 1e6 for p in line], marker="o", label=f"{gpus} GPUs (TP{gpus})")
        sess_ax.plot(dcps, [p.sessions for p in line], marker="o", label=f"{gpus} GPUs (TP{gpus})")
    w = spec.workload
    for ax, title in ((kv_ax, "logical KV tokens per group (millions)"),
                      (sess_ax, f"sessions of {w.session_tokens:,} tokens per group")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({p.dcp for p in points}), [str(d) for d in sorted({p.dcp for p in points})])
        ax.set_xlabel("DCP size")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    p = spec.precision
    fig.suptitle(f"K3 on {spec.system.name}: KV {p.kv_cache}, KDA state {p.kda_state}, experts {p.experts}, "
                 f"mamba ratio {spec.serving.mamba_full_memory_ratio}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
