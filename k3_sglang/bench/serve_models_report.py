"""The markdown report of `k3 bench serve --model-impl compare` (docs/bench-serve-models.md)."""
from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

from k3_sglang.bench.serve_models import medians

ROWS = (("prefill", "prefill, {prefill_tokens}-token prompt (tok/s)"), ("decode1", "decode, batch 1 (tok/s)"),
        ("decodeN", "decode, batch {batch} (tok/s)"))
GOAL = 2.0  # SGLang's K3 within 2x of the portable model on every row


def machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor() or "unknown CPU")
    return f"{os.cpu_count()} cores, {cpu}, no GPU"


def report(args, results, profile_top) -> str:
    med = medians(results)
    rows = ["| measure | portable | SGLang's K3 | portable / SGLang's K3 | goal <= 2 |", "|---|---:|---:|---:|---|"]
    for key, label in ROWS:
        p, s = med["portable"][key], med["sglang"][key]
        ratio = p / s
        rows.append(f"| {label.format(prefill_tokens=args.prefill_tokens, batch=args.batch)} | {p:.1f} | {s:.1f} | "
                    f"{ratio:.2f} | {'met' if ratio <= GOAL else 'not met'} |")
    rounds = ["", "Every round (tok/s, portable / SGLang's K3):", ""]
    for key, label in ROWS:
        pairs = ", ".join(f"{p:.1f} / {s:.1f}" for p, s in zip(results["portable"][key], results["sglang"][key]))
        rounds.append(f"- {label.format(prefill_tokens=args.prefill_tokens, batch=args.batch)}: {pairs}")
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
        f"Medians over {args.repeats} rounds. Goal: SGLang's K3 within 2x of the portable model on every row.", "",
        *rows, *rounds, *prof, ""])
