"""`k3 router replay TRACE.jsonl`: our placement policy vs round-robin, least-load and SMG-style
cache-aware on a simulated fleet of equal capacity; writes a table and a plot to docs/."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import re
from collections.abc import Sequence

from k3_sglang.tooling.router.baselines import BASELINES
from k3_sglang.router.config import PolicyConfig
from k3_sglang.tooling.router.replay_sim import FleetSpec, ReplayResult, SessionPolicy, TraceRequest, label_sessions, simulate

TTFT_SLO_S = 30.0  # Mooncake FAST'25 TTFT SLO
POLICY_NAMES = ("k3_session", *BASELINES)


def section_name(trace_path: str) -> str:
    """The docs section (and plot) name of a trace: its file name without extension, as a slug."""
    stem = os.path.splitext(os.path.basename(trace_path))[0]
    return re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-") or "trace"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def make_policy(name: str, spec: FleetSpec, policy_cfg: PolicyConfig, arms: dict | None = None):
    """Instantiate a replay policy by name (`arms`: the event-fed arms of replay_events.py, by name)."""
    if name == "k3_session":
        return SessionPolicy(spec, policy_cfg)
    if arms and name in arms:
        from k3_sglang.tooling.router.replay_events import EventFedPolicy

        return EventFedPolicy(spec, policy_cfg, arms[name])
    return BASELINES[name](spec.workers, spec.kv_tokens, spec.prefill_tps)


def summarize(result: ReplayResult) -> dict:
    """One table row."""
    served = result.requests - result.rejected
    within_slo = sum(1 for t in result.ttfts if t <= TTFT_SLO_S)
    return {
        "policy": result.policy,
        "requests": result.requests,
        "rejected": result.rejected,
        "cache_hit_tokens": result.cache_hit_tokens,
        "cache_hit_share": round(result.cache_hit_tokens / max(1, result.input_tokens), 4),
        "reprefilled_tokens": result.reprefilled_tokens,
        "session_moves": result.session_moves,
        "ttft_p50_s": round(percentile(result.ttfts, 50), 3),
        "ttft_p90_s": round(percentile(result.ttfts, 90), 3),
        "ttft_p99_s": round(percentile(result.ttfts, 99), 3),
        "goodput_share": round(within_slo / max(1, result.requests), 4),
        "served": served,
    }


def run_replay(trace: list[TraceRequest], spec: FleetSpec, policy_cfg: PolicyConfig,
               names: Sequence[str] = POLICY_NAMES, arms: dict | None = None) -> tuple[list[dict], dict[str, list[float]]]:
    """Replay the trace under each policy; return table rows and the TTFT samples per policy."""
    rows, samples = [], {}
    labels = label_sessions(trace)
    for name in names:
        result = simulate(trace, spec, make_policy(name, spec, policy_cfg, arms), labels)
        rows.append(summarize(result))
        samples[name] = result.ttfts
    return rows, samples


def markdown_table(rows: list[dict]) -> str:
    """The replay table in Markdown."""
    header = ("| policy | requests | rejected | cache-hit tokens (share) | re-prefilled tokens | session moves "
              "| TTFT p50 / p90 / p99 (s) | within 30 s TTFT SLO |\n|---|---|---|---|---|---|---|---|\n")
    lines = [
        f"| {r['policy']} | {r['requests']} | {r['rejected']} | {r['cache_hit_tokens']:,} ({r['cache_hit_share']:.1%}) "
        f"| {r['reprefilled_tokens']:,} | {r['session_moves']} | {r['ttft_p50_s']} / {r['ttft_p90_s']} / "
        f"{r['ttft_p99_s']} | {r['goodput_share']:.1%} |"
        for r in rows
    ]
    return header + "\n".join(lines) + "\n"


def write_plot(path: str, rows: list[dict], samples: dict[str, list[float]], title: str) -> None:
    """TTFT CDF per policy and cache-hit / re-prefill / rejection bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, values in samples.items():
        ordered = sorted(max(v, 1e-3) for v in values)
        if ordered:
            left.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=name)
    left.set_xscale("log")
    left.set_xlabel("predicted TTFT (s, log)")
    left.set_ylabel("share of served requests")
    left.axvline(TTFT_SLO_S, color="grey", linestyle=":", label="30 s SLO")
    left.legend()
    names = [r["policy"] for r in rows]
    xs = range(len(rows))
    width = 0.27
    right.bar([x - width for x in xs], [r["cache_hit_share"] for r in rows], width, label="cache-hit share")
    reprefill = [r["reprefilled_tokens"] / max(1, r["cache_hit_tokens"] + r["reprefilled_tokens"]) for r in rows]
    right.bar(list(xs), reprefill, width, label="re-prefilled / (hit + re-prefilled)")
    right.bar([x + width for x in xs], [r["rejected"] / max(1, r["requests"]) for r in rows], width, label="rejected share")
    right.set_xticks(list(xs), names)
    right.set_ylim(0, 1)
    right.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def update_section(path: str, begin: str, end: str, body: str) -> None:
    """Replace the text between two markers in a Markdown file (appending the section if absent)."""
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Router benchmarks\n"
    section = f"{begin}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section + "\n"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def report(rows: list[dict], samples: dict[str, list[float]], spec: FleetSpec, trace_path: str,
           command: str, docs_dir: str, section: str | None = None) -> None:
    """Write the table into docs/router-bench.md (section `replay:NAME`) and the plot beside it."""
    os.makedirs(docs_dir, exist_ok=True)
    name = section or section_name(trace_path)
    fleet = dataclasses.asdict(spec)
    title = (f"{os.path.basename(trace_path)}: {spec.workers} workers x {spec.kv_tokens:,} KV tokens, "
             f"{spec.state_slots} state slots, {spec.prefill_tps:,.0f} prefill tok/s")
    plot = f"router-replay-{name}.png"
    write_plot(os.path.join(docs_dir, plot), rows, samples, title)
    body = (f"### Trace replay: {name} ({dt.date.today().isoformat()})\n\n"
            f"Command: `{command}`\n\nFleet (equal for every policy): `{json.dumps(fleet)}`\n\n"
            + markdown_table(rows) + f"\n![replay {name}]({plot})\n")
    update_section(os.path.join(docs_dir, "router-bench.md"), f"<!-- replay:{name}:begin -->",
                   f"<!-- replay:{name}:end -->", body)
