"""docs/bench-pp-prefill.md and its chart for `k3 bench pp-prefill`."""
from __future__ import annotations

import argparse
import datetime
import statistics
from pathlib import Path

from k3_sglang.tooling.bench.pp_prefill import GOAL_VS_ONE_CORE, PRESET, BenchConfig, Run, ServerNotes
from k3_sglang.tooling.bench.serve import _machine


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _stage_rows(configs: list[BenchConfig], runs: list[Run]) -> list[str]:
    rows = ["| configuration | stage busy (s), median | forward span (s) | bubble | imbalance (max/mean busy) | "
            "exposed hand-off (s) |", "|---|---|---|---|---|---|"]
    for cfg in configs:
        timed = [r.timing for r in runs if r.config == cfg.name and r.timing is not None]
        if not timed:
            errors = {r.trace_error for r in runs if r.config == cfg.name}
            rows.append(f"| {cfg.name} | no matched trace ({'; '.join(sorted(errors))[:120]}) | | | | |")
            continue
        stages = len(timed[0].busy_s)
        busy = " / ".join(f"{_median([t.busy_s[s] for t in timed]):.2f}" for s in range(stages))
        exposed = " / ".join(f"{_median([t.exposed_handoff_s[h] for t in timed]):.3f}" for h in range(stages - 1))
        rows.append(f"| {cfg.name} | {busy} | {_median([t.span_s for t in timed]):.2f} | "
                    f"{_median([t.bubble for t in timed]):.1%} | {_median([t.imbalance for t in timed]):.2f} | "
                    f"{exposed or '-'} |")
    return rows


def _plot(configs: list[BenchConfig], runs: list[Run], med: dict[str, float], length: int, path: Path) -> None:
    """Left: median prefill time per configuration. Right: the stages' forwards of the last PP2 prefill."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, gantt) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.6]})
    names = [c.name for c in configs]
    bars.barh(names, [med[n] for n in names], color=["tab:gray" if n.startswith("pp1") else "tab:blue" for n in names])
    for i, n in enumerate(names):
        bars.text(med[n], i, f" {med[n]:.1f} s", va="center", fontsize=8)
    bars.invert_yaxis()
    bars.set_xlabel(f"prefill of {length:,} tokens (s), median")
    bars.set_xlim(0, max(med.values()) * 1.25)
    shown = next((r for r in reversed(runs) if r.config == "pp2" and r.stage_spans), None)
    if shown is not None:
        for stage, spans in enumerate(shown.stage_spans):
            gantt.broken_barh([(a, b - a) for a, b in spans], (stage - 0.35, 0.7),
                              facecolors=["tab:blue", "tab:orange"][stage % 2], edgecolor="white", linewidth=0.5)
        gantt.set_yticks(range(len(shown.stage_spans)), [f"stage {s}" for s in range(len(shown.stage_spans))])
        gantt.invert_yaxis()
        gantt.set_xlabel("seconds from the first chunk's forward (pp2, last round): one bar per chunk")
        gantt.set_title(f"bubble {shown.timing.bubble:.1%}", fontsize=9)
    else:
        gantt.set_axis_off()
    fig.suptitle(f"k3 bench pp-prefill ({PRESET}, SGLang 0.5.23 on CPU)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(args: argparse.Namespace, started: datetime.datetime, load_start: tuple, load_end: tuple,
                 configs: list[BenchConfig], runs: list[Run], notes: dict[str, ServerNotes]) -> None:
    from k3_sglang.config import preset
    from k3_sglang.tooling.bench.pp_stages import hop_bytes_per_token, stage_bounds

    cfg_model = preset(PRESET)
    med = {c.name: _median([r.seconds for r in runs if r.config == c.name]) for c in configs}
    base1, base2 = med.get("pp1-1core"), med.get("pp1-2core")
    rows = ["| configuration | what | prefill (s), median | rounds (s) | prefill (tok/s) | vs PP1 1 core | "
            "vs PP1 2 cores | server CPU (s), median | 1-min load before |", "|---|---|---|---|---|---|---|---|---|"]
    for c in configs:
        mine = [r for r in runs if r.config == c.name]
        each = ", ".join(f"{r.seconds:.2f}" for r in mine)
        loads = ", ".join(f"{r.load_before:.2f}" for r in mine)
        v1 = f"{base1 / med[c.name]:.2f}x" if base1 else "-"
        v2 = f"{base2 / med[c.name]:.2f}x" if base2 else "-"
        rows.append(f"| {c.name} | {c.what} | {med[c.name]:.2f} | {each} | {args.length / med[c.name]:,.0f} | {v1} | "
                    f"{v2} | {_median([r.cpu_seconds for r in mine]):.1f} | {loads} |")
    goals = []
    if "pp2" in med and base1:
        ratio = base1 / med["pp2"]
        goals.append(f"- PP2 vs PP1 on one core: **{ratio:.2f}x** (goal >= {GOAL_VS_ONE_CORE}x: "
                     f"{'met' if ratio >= GOAL_VS_ONE_CORE else 'not met'}; pipeline efficiency "
                     f"{ratio / 2:.0%} of two ideal stages).")
    if "pp2" in med and base2:
        ratio = base2 / med["pp2"]
        goals.append(f"- PP2 vs PP1 on two cores: **{ratio:.2f}x** (goal > 1x: {'met' if ratio > 1 else 'not met'}).")
    if "pp2-dynamic" in med and "pp2-fixed-big" in med:
        state = "on" if notes["pp2-dynamic"].active else "OFF (SGLang's fit failed, see below)"
        goals.append(f"- Dynamic vs fixed chunks (PP2, base {args.dynamic_base_chunk}; dynamic chunking {state}): "
                     f"{med['pp2-fixed-big'] / med['pp2-dynamic']:.2f}x (> 1: dynamic faster).")
    stages = stage_bounds(cfg_model.num_layers, 2)
    dtype_bytes = 4 if args.dtype == "float32" else 2
    hop = hop_bytes_per_token(stages[0][1], cfg_model.attn_res.block_size, cfg_model.hidden_size, dtype_bytes)
    chunk_lines = []
    for c in configs:
        sizes = notes[c.name].chunk_sizes
        if sizes:
            chunk_lines.append(f"- {c.name}: {len(sizes[-1])} chunks, tokens per chunk (last round): "
                               f"{', '.join(map(str, sizes[-1]))}")
    dynamic = notes.get("pp2-dynamic")
    dynamic_log = ("\n\nSGLang's dynamic-chunking log (PP0, last pp2-dynamic server; the profile's sample list "
                   "cut):\n\n```\n" + dynamic.dynamic + "\n```"
                   if dynamic and dynamic.dynamic else "")
    cmd = (f"k3 bench pp-prefill --length {args.length} --chunked-prefill-size {args.chunked_prefill_size} "
           f"--dynamic-base-chunk {args.dynamic_base_chunk} "
           f"--repeats {args.repeats} --dtype {args.dtype} --configs {' '.join(c.name for c in configs)}")
    plot = args.out.with_suffix(".png")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    _plot(configs, runs, med, args.length, plot)
    text = f"""# `k3 bench pp-prefill`

Measured {started:%Y-%m-%d %H:%M} UTC on {_machine()} (load averages 1/5/15 min: at the start
{load_start[0]:.2f} / {load_start[1]:.2f} / {load_start[2]:.2f}, at the end {load_end[0]:.2f} / {load_end[1]:.2f} /
{load_end[2]:.2f}; the machine is shared, see the per-round loads below).

Command: `{cmd}`

Model: the bench-only `{PRESET}` preset ({cfg_model.num_layers} layers, MLA {', '.join(map(str, cfg_model.mla.layer_ids))},
k3-tiny's widths with {cfg_model.mla.num_heads} MLA heads, random weights, {args.dtype}), SGLang 0.5.23 on CPU through the k3_cpu platform plugin, chunked
prefill of one fresh {args.length:,}-token prompt per round in {args.chunked_prefill_size}-token chunks
({args.dynamic_base_chunk} for the fixed-vs-dynamic pair; max_new_tokens 1:
the request time is the prefill). Each configuration runs on its own server; rounds alternate the configurations
and the tables give medians. PP2 uses SGLang's default split {stages[0][1]},{stages[1][1] - stages[1][0]}
(2 MLA + 6 KDA layers per stage); each hop carries hidden_states + {-(-stages[0][1] // cfg_model.attn_res.block_size)}
AttnRes blocks = {hop:,} bytes per token ({hop * args.length / 1e6:.1f} MB per {args.length:,}-token prompt).

## Prefill time

{chr(10).join(rows)}

{chr(10).join(goals)}

## Stages (from the K3_STAGE_TRACE forward spans)

Busy = the stage's forward time; span = first stage-0 forward start to last stage-1 forward end; bubble =
1 - sum(busy) / (stages x span), for N equal chunks on P equal stages (P-1)/(N+P-1); exposed hand-off = per hop, the
time the receiving stage waited for a chunk after both the sender had finished it and it had finished its own
previous chunk (transfer and scheduling overlapped by nothing).

{chr(10).join(_stage_rows(configs, runs))}

![prefill time per configuration and the PP2 stage timeline]({plot.name})

Chunks:

{chr(10).join(chunk_lines)}{dynamic_log}
"""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
