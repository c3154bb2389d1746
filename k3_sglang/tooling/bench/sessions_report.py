"""docs/bench-sessions.md and its plot for `k3 bench sessions`."""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path

from k3_sglang.tooling.bench.serve import _machine
from k3_sglang.tooling.bench.session_traffic import SessionTraffic
from k3_sglang.tooling.bench.sessions import GOALS, arm_flags
from k3_sglang.tooling.bench.sessions_summary import TIERS, ArmSummary, ratio

ARM_TITLES = {"off": "HiCache off", "host": "host tier (L2)", "host-l3": "host + Mooncake store (L2 + L3)",
              "resident": "all resident (pool holds every session)",
              "restart": "host + file store (L2 + L3), worker restarted before the last turn"}


def _plot(summaries: dict[str, ArmSummary], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(summaries)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    xs = range(len(arms))
    left.bar([x - 0.2 for x in xs], [summaries[a].ttft_p50_s for a in arms], 0.4, label="p50")
    left.bar([x + 0.2 for x in xs], [summaries[a].ttft_p99_s for a in arms], 0.4, label="p99")
    left.set_xticks(list(xs), arms)
    left.set_yscale("log")
    left.set_ylabel("resumed-turn TTFT (s, log)")
    left.legend()
    left.grid(alpha=0.3, axis="y")
    bottom = [0.0] * len(arms)
    for tier in TIERS:
        share = [summaries[a].tier_share[tier] for a in arms]
        right.bar(list(xs), share, 0.6, bottom=bottom, label=f"hit: {tier}")
        bottom = [b + s for b, s in zip(bottom, share)]
    right.bar(list(xs), [1 - b for b in bottom], 0.6, bottom=bottom, label="prefilled", color="lightgray")
    right.set_xticks(list(xs), arms)
    right.set_ylabel("share of resumed-turn prompt tokens")
    right.legend(fontsize=8)
    fig.suptitle("round-robin agent sessions, k3-tiny on CPU (SGLang 0.5.23 HiCache)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _command(args: argparse.Namespace) -> str:
    words = ["k3 bench sessions", f"--sessions {args.sessions}", f"--first-tokens {args.first_tokens}",
             f"--tool-tokens {args.tool_tokens}", f"--output-tokens {args.output_tokens}", f"--turns {args.turns}",
             f"--think-s {args.think_s:g}", f"--oversubscription {args.oversubscription:g}",
             "--arms " + " ".join(args.arms)]
    if args.serve_args:
        words += ["--", *args.serve_args]
    return " ".join(words)


def _ratio_lines(summaries: dict[str, ArmSummary]) -> list[str]:
    """One line per GOALS pair whose arms ran: the ratio of resumed-turn TTFT p50, with its goal and verdict."""
    lines = []
    for slow, fast, goal in GOALS:
        value = ratio(summaries.get(slow), summaries.get(fast))
        if value is None:
            continue
        if goal is None:
            verdict = "no goal set"
        else:
            met = value >= goal[1] if goal[0] == ">=" else value <= goal[1]
            verdict = f"goal {goal[0]} {goal[1]:g}x: {'met' if met else 'NOT met'}"
        lines.append(f"- {slow} / {fast}, resumed-turn TTFT p50: **{value:.2f}x** ({verdict})")
    return lines


def write_report(args: argparse.Namespace, traffic: SessionTraffic, started: datetime.datetime,
                 summaries: dict[str, ArmSummary], workdir: Path) -> None:
    plot = args.out.with_suffix(".png")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    _plot(summaries, plot)
    live = traffic.sessions * traffic.session_tokens()
    rows = []
    for arm, s in summaries.items():
        shares = " / ".join(f"{s.tier_share[t]:.0%}" for t in TIERS)
        flags = " ".join(arm_flags(arm, traffic, args.oversubscription))
        rows.append(f"| {ARM_TITLES[arm]} | `{flags}` | {s.ttft_p50_s:.3f} | {s.ttft_p99_s:.3f} | "
                    f"{s.first_turn_ttft_p50_s:.2f} | {s.prefilled_per_turn:,.0f} / {s.prompt_per_turn:,.0f} | "
                    f"{shares} | {s.mismatches} of {traffic.sessions * traffic.turns} |")
    load = os.getloadavg()[0]
    base = "off" if "off" in summaries else next(iter(summaries))  # the arm answers are compared with (run())
    text = f"""# `k3 bench sessions`

Measured {started:%Y-%m-%d %H:%M} UTC on {_machine()} (1-min load average at the end: {load:.1f}; several
engineers share this machine, so absolute times vary run to run: compare arms within this run).

Command: `{_command(args)}`

Traffic: {traffic.sessions} agent sessions, each opening with {traffic.first_tokens:,} tokens; every later turn
appends the previous answer ({traffic.output_tokens} greedy tokens) and {traffic.tool_tokens} tokens of tool
output; {traffic.turns} turns, sent one request at a time round-robin with {traffic.think_s:g} s of think time after
each. Live session tokens at the end: {live:,}; the device KV pool of the off / host / host-l3 / restart arms holds
1/{args.oversubscription:g} of that, so LRU has evicted a session by the time its next turn comes. Model: the
embedded default (tiny K3, random weights) in float32 on SGLang 0.5.23 through the k3_cpu platform, `k3 serve`
defaults otherwise (HiCache on CPU: docs/sessions.md). A resumed turn is any turn after a session's first; for
the restart arm, the turns after the restart.

| arm | `k3 serve` flags | resumed TTFT p50 (s) | p99 (s) | first-turn TTFT p50 (s) | prefilled / prompt tokens per resumed turn | hits: device / host / storage | answers differing from `{base}` |
|---|---|---|---|---|---|---|---|
""" + "\n".join(rows) + f"""

Ratios (same run; arm names as in `--arms`):
""" + "\n".join(_ratio_lines(summaries)) + f"""
- greedy answers identical to `{base}` in every arm: {'yes' if not any(s.mismatches for s in summaries.values()) else
                                                    '**NO**'}

![resumed-turn TTFT and hits per tier by arm]({plot.name})

Server logs of this run: `{workdir.name}` in the system's temporary directory (removed with it).
"""
    args.out.write_text(text + kept_sections(args.out))
    print(f"wrote {args.out} and {plot}")


KEEP_MARKER = "<!-- kept by k3 bench sessions: figures measured by other commands -->"


def kept_sections(path: Path) -> str:
    """What follows KEEP_MARKER in the existing report (other commands' figures, e.g. a slow test's), marker
    included, so that a rerun of the bench replaces only its own part; '' when there is none."""
    try:
        old = path.read_text()
    except OSError:
        return ""
    return "\n" + KEEP_MARKER + old.split(KEEP_MARKER, 1)[1] if KEEP_MARKER in old else ""
