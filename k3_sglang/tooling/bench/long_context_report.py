"""docs/bench-long-context.md and its plot for `k3 bench long-context`."""
from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path

from k3_sglang.tooling.bench.long_context import GOAL_RATIO, Point, fit_linear_quadratic
from k3_sglang.tooling.bench.serve import _machine


def _plot(points: list[Point], a: float, b: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [p.length for p in points]
    ax.plot(xs, [p.prefill_s for p in points], "o-", label="SGLang's K3, k3_cpu_mla chunk-only extend (measured)")
    grid = [xs[0] + (xs[-1] - xs[0]) * i / 50 for i in range(51)]
    ax.plot(grid, [a * x for x in grid], ":", color="gray", label=f"fit: linear part {a * 1e3:.3f} ms/token")
    ax.plot(grid, [a * x + b * x * x for x in grid], "--", color="tab:blue", alpha=0.5, label="fit: a L + b L^2")
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("prefill time, time to first token (s)")
    ax.set_title("k3-tiny prefill on CPU (SGLang 0.5.23, k3_cpu platform)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(args: argparse.Namespace, started: datetime.datetime, points: list[Point], ratio: float | None,
                 kda: dict[int, float]) -> None:
    a, b = fit_linear_quadratic(points)
    plot = args.out.with_suffix(".png")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    _plot(points, a, b, plot)
    rows = ["| length (tokens) | prefill (s), median | rounds (s) | prefill (tok/s) | decode at that context (tok/s) | "
            "quadratic share of the fit |", "|---|---|---|---|---|---|"]
    for p in points:
        quad = b * p.length ** 2 / (a * p.length + b * p.length ** 2)
        each = ", ".join(f"{x:.1f}" for x in p.prefill_runs)
        rows.append(f"| {p.length:,} | {p.prefill_s:.2f} | {each} | {p.prefill_tps:,.0f} | {p.decode_tps:.1f} | {quad:.0%} |")
    cmd = "k3 bench long-context --lengths " + " ".join(map(str, args.lengths))
    cmd += f" --decode-tokens {args.decode_tokens} --repeats {args.repeats}"
    if args.chunked_prefill_size:
        cmd += f" --chunked-prefill-size {args.chunked_prefill_size}"
    if args.serve_args:
        cmd += " -- " + " ".join(args.serve_args)
    goal = ("not measured (16K and 64K must both be in --lengths)" if ratio is None else
            f"**{ratio:.2f}x** (goal <= {GOAL_RATIO:.0f}x: {'met' if ratio <= GOAL_RATIO else 'not met'})")
    load = os.getloadavg()[0]
    text = f"""# `k3 bench long-context`

Measured {started:%Y-%m-%d %H:%M} UTC on {_machine()} (1-min load average at the end: {load:.1f}).

Command: `{cmd}`

Model: the embedded default (tiny K3 with random weights, bf16 unless `--dtype` was passed, served by SGLang's own
K3 (0.5.23) on CPU through the k3_cpu platform plugin, `k3 serve` defaults otherwise). Each length is one fresh random prompt (no
radix-cache hit; the cache is flushed between lengths) sent as a streamed greedy request; prefill time is the
time to the first token, decode is the streamed rate of the {args.decode_tokens} tokens after it. {args.repeats} rounds over
all lengths on the same server, medians reported (this VM's timings vary run to run; the rounds column shows how much).

## Prefill and decode by prompt length (the `k3_cpu_mla` backend's chunk-only MLA extend)

{chr(10).join(rows)}

Prefill time 16K -> 64K: {goal}. For reference, linear cost would give 4x, and exact attention's own cost
(every query against every earlier key) grows 16x over the same range. A least-squares fit
`prefill_s = a L + b L^2` over the lengths gives a = {a * 1e3:.4f} ms/token (everything but attention's
quadratic term: projections, KDA, MoE, scheduler) and b = {b * 1e9:.4f} ms per million token pairs; the last
column is the fit's quadratic share at each length.

![prefill time vs prompt length]({plot.name})

## KDA chunked prefill alone

One KDA layer at k3-tiny's geometry (4 heads x 32), in the bench process, fed in prefill chunks of
{args.chunked_prefill_size or 512} tokens with the state carried between them as the server does:
25,000 tokens {kda[25_000]:.2f} s, 100,000 tokens {kda[100_000]:.2f} s: **{kda[100_000] / kda[25_000]:.2f}x** for 4x the
tokens (linear: 4x).
"""
    args.out.write_text(text + _history(args.out))
    print(f"wrote {args.out} and {plot}")


HISTORY = "\n## History"


def _history(out: Path) -> str:
    """The hand-written `## History` section of the report being replaced (earlier runs), kept below the new run."""
    old = out.read_text() if out.exists() else ""
    return old[old.index(HISTORY):] if HISTORY in old else ""
