"""The markdown report of `k3 bench serve --model-impl compare` (docs/bench-serve-models.md)."""
from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

from k3_sglang.tooling.bench.serve_models import medians

ROWS = (("prefill", "prefill, {prefill_tokens}-token prompt (tok/s)"), ("decode1", "decode, batch 1 (tok/s)"),
        ("decodeN", "decode, batch {batch} (tok/s)"))
GOAL = 1.0  # issue 37: SGLang's K3 at least as fast as the portable model on every row, in every round


def machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor() or "unknown CPU")
    return f"{os.cpu_count()} cores, {cpu}, no GPU"


def per_round_ratios(results, key: str) -> list[float]:
    """Per round, the portable model's tok/s over SGLang's K3's (= SGLang's K3's time / the portable model's)."""
    return [p / s for p, s in zip(results["portable"][key], results["sglang"][key])]


def report(args, results, profile_top) -> str:
    med = medians(results)
    rows = ["| measure | portable | SGLang's K3 | portable / SGLang's K3 | median <= 1 |", "|---|---:|---:|---:|---|"]
    for key, label in ROWS:
        p, s = med["portable"][key], med["sglang"][key]
        ratio = p / s
        rows.append(f"| {label.format(prefill_tokens=args.prefill_tokens, batch=args.batch)} | {p:.1f} | {s:.1f} | "
                    f"{ratio:.2f} | {'met' if ratio <= GOAL else 'not met'} |")
    rounds = ["", "Every round (tok/s, portable / SGLang's K3, then the ratio portable / SGLang's K3 of their tok/s, "
              "which is SGLang's K3's time over the portable model's for the same work; issue 37's goal: <= 1.0 in "
              "every round):", ""]
    for key, label in ROWS:
        pairs = ", ".join(f"{p:.1f} / {s:.1f}" for p, s in zip(results["portable"][key], results["sglang"][key]))
        ratios = per_round_ratios(results, key)
        verdict = "met" if all(r <= GOAL for r in ratios) else "not met"
        rounds.append(f"- {label.format(prefill_tokens=args.prefill_tokens, batch=args.batch)}: {pairs}; ratio "
                      f"{', '.join(f'{r:.2f}' for r in ratios)} ({verdict})")
    prof = []
    if profile_top:
        prof = ["", "## Where SGLang's K3 spends its decode time", "",
                f"py-spy on its scheduler process during the last round's batch-1 and batch-{args.batch} decode "
                "(leaf frames, share of samples):", "", "| frame | share |", "|---|---:|"]
        prof += [f"| `{frame}` | {share:.1f}% |" for frame, share in profile_top]
    extra = " -- " + " ".join(args.serve_args) if args.serve_args else ""
    return "\n".join([
        "# `k3 bench serve --model-impl compare`: SGLang's K3 against the portable model on CPU", "",
        f"Measured {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} UTC on {machine()}.", "",
        f"Command: `k3 bench serve --model-impl compare --prefill-tokens {args.prefill_tokens} --new-tokens "
        f"{args.new_tokens} --batch {args.batch} --repeats {args.repeats}{' --profile' if args.profile else ''}"
        f"{extra}`", "",
        "Both models serve the same checkpoint (default: the tiny K3) from two `k3 serve` processes up for the whole "
        "run (K3_MODEL_IMPL=portable and =sglang); each round sends the same requests to one, then the other. "
        f"Medians over {args.repeats} rounds. Goal (issue 37): SGLang's K3 at least as fast as the portable model on every "
        "row in every round (ratio <= 1).", "",
        *rows, *rounds, *prof, ""])
