"""The report of `k3 bench plain-decode` (docs/bench-plain-decode.md): per model, each arm's step split into forward
and host time, host time next to A's as a share of A's step, and whether every arm emitted the same tokens."""
from __future__ import annotations

import os
import statistics

GOAL = 0.01  # the bar: a server that decides plain decode costs at most 1% more than a no-spec server


def extra_share(arm_steps, base_steps) -> float:
    """Mean host time per step above the base arm's, as a share of the base arm's whole step (loop p50). The mean,
    not the median: a settled C drafts and plans on its probe steps only (spec/policy.py), and throughput pays every
    step."""
    return (arm_steps.host_mean - base_steps.host_mean) / base_steps.loop


def paired_shares(arm_windows, base_windows) -> list[float]:
    """Per request, the arm's host time above the base arm's on the same prompt (the two ran next to each other),
    as a share of the base arm's step in that request; requests either arm timed too few steps of are left out."""
    return [extra_share(x, a) for x, a in zip(arm_windows, base_windows) if x is not None and a is not None]


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def model_section(impl: str, c: int, arms: dict, help_text: dict[str, str], mismatches=None,
                  dtype: str = "bfloat16", judged=None) -> list[str]:
    base = arms["A"]["steps"]
    name = "SGLang's own K3 (`kimi_k3`)" if impl == "sglang" else "the portable K3"
    unit = "request" if c == 1 else "round"
    lines = [f"## {name}, concurrency {c} (steps of batch {c})", "",
             "| arm | decode steps | step p50 (ms) | forward p50 | host p50 | host mean | run_batch outside forward | "
             "after run_batch | host mean above A (pooled), share of A's step | client decode tok/s | / A |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for arm, res in arms.items():
        s = res["steps"]
        share = "-" if arm == "A" else f"{extra_share(s, base) * 100:+.2f}%"
        ratio = res["decode_tps"] / arms["A"]["decode_tps"]
        lines.append(f"| {arm}: {help_text[arm]} | {s.steps} | {_ms(s.loop)} | {_ms(s.forward)} | {_ms(s.host)} | "
                     f"{_ms(s.host_mean)} | {_ms(s.run_outside_forward)} | {_ms(s.after_run)} | "
                     f"{share} | {res['decode_tps']:.1f} | {ratio:.3f} |")
    lines.append("")
    for arm in arms:
        if arm == "A":
            continue
        shares = paired_shares(arms[arm]["per_request"], arms["A"]["per_request"])
        if not shares:
            lines.append(f"- {arm}: no {unit} with enough timed steps of batch {c} in both arms")
            continue
        mid = statistics.median(shares)
        verdict = "**met**" if mid <= GOAL else "**NOT met**"
        lines.append(f"- {arm}: mean host time above A, paired per {unit} = {mid * 100:+.2f}% of A's step (median of "
                     f"{len(shares)} {unit}s, interquartile {_quantile(shares, 0.25) * 100:+.2f}% to "
                     f"{_quantile(shares, 0.75) * 100:+.2f}%; goal <= {GOAL * 100:.0f}%): {verdict}")
    fwd = [w.forward for w in arms["A"]["per_request"] if w is not None]
    if fwd:
        lines.append(f"- drift: A's forward p50 per {unit} ranged {min(fwd) * 1e3:.1f} to {max(fwd) * 1e3:.1f} ms "
                     "over the run (the same prompt length, batch and step count every time)")
    n = len(arms["A"]["outputs"])
    same = {arm: sum(o == a for o, a in zip(arms[arm]["outputs"], arms["A"]["outputs"])) for arm in arms if arm != "A"}
    if all(k == n for k in same.values()):
        lines.append(f"- output identity: every arm emitted the same tokens as A on all {n} requests")
    else:
        counts = ", ".join(f"{arm} = A on {k} / {n}" for arm, k in same.items())
        lines.append(f"- output identity: **OUTPUT MISMATCH** ({counts})")
        if mismatches is not None:
            from k3_sglang.tooling.bench.output_identity import summary_lines

            mine = [m for m in mismatches if m.key.startswith(f"{impl}/c{c}/")]
            if judged is None:
                lines += ["  " + x for x in summary_lines(mine, dtype)]
            else:
                lines += ["  " + x for x in summary_lines([m for m in mine if m.arm in arms], dtype, verdict=False)]
    if judged is not None and mismatches is not None:
        from k3_sglang.tooling.bench.identity_control import envelope_line, judgement_lines

        mine = [m for m in mismatches if m.key.startswith(f"{impl}/c{c}/")]
        lines.append("- bf16 " + envelope_line(mine, judged[1]))
        lines += ["  - " + x if not x.startswith("  ") else "    " + x for x in judgement_lines(judged[0])]
    return lines + [""]


def report(args, started, load_before, per_model: dict, mismatches=None, judged=None) -> str:
    from k3_sglang.tooling.bench.plain_decode import ARM_HELP
    from k3_sglang.tooling.bench.profile_verify import machine

    from k3_sglang.tooling.bench.verify_report import IDENTITY_HOW

    load = os.getloadavg()
    dtype = getattr(args, "dtype", "bfloat16")
    arms = " ".join(args.arms)
    head = [
        "# `k3 bench plain-decode`: what K3_CSV costs per step when it decides plain decode", "",
        f"Run {started:%Y-%m-%d %H:%M} UTC on {machine()}; load average {load_before[0]:.2f} before, {load[0]:.2f} at "
        "the end. Command:", "",
        "```",
        f"k3 bench plain-decode --model-impl {args.model_impl} --arms {arms} --requests {args.requests} "
        f"--concurrency {' '.join(map(str, args.concurrency))} --max-new-tokens {args.max_new_tokens} "
        f"--prompt-tokens {args.prompt_tokens} --width {args.width}"
        + (f" --dtype {dtype}" if dtype != "bfloat16" else ""),
        "```", "",
        f"Servers: the tiny K3 (random weights) in {'bf16' if dtype == 'bfloat16' else dtype} with `k3 serve` defaults, `--disable-radix-cache`, SGLang "
        "0.5.23 on CPU, every arm alive at once and every server with `K3_STEP_TIMING` "
        "(k3_sglang/serving/step_timing.py). Requests: rounds of c greedy requests released together (c = the "
        "section's concurrency; one request at c = 1), random prompts by input_ids, ignore_eos; the arms take turns "
        "per round in a rotating order, on the same prompts. A decode step's *step* is one whole "
        "scheduler loop (run_batch to the next run_batch); *host* = step - model forward, split into run_batch "
        "outside the forward (SGLang's speculative path and K3_CSV's worker) and what follows run_batch "
        "(process_batch_result, receiving requests, building the next batch with its KV allocation). The table: medians over "
        "every decode step of batch c in the timed rounds (warm-up, prefill and the rounds' ramps are left out). The "
        "goal lines: per round, the arm's mean host time per step above A's on the same prompts, run next to it, as "
        "a share of A's step in that round; the median over rounds (the machine's drift cancels in the pair). The "
        "mean, because a settled C drafts and plans for all c requests on its probe steps only (spec/policy.py: one "
        "step in 4 to 64, priced against a decode step) and throughput pays for every step; the run_batch and after-run_batch columns "
        "are medians. Client decode tok/s = c x tokens after the first / stream time after the first, pooled.", "",
        "Why host time: the forward is the same code in every arm (a plain DECODE forward, no spec input), so what "
        "a speculative server adds when it decides plain decode is host time; it is measured per step inside the "
        "server, where this machine's drift (the drift line below: the same forward a request apart) does not blur "
        "a 1% difference the way client tok/s does.", "",
        "Output identity: " + IDENTITY_HOW[dtype == "float32"], ""]
    body: list[str] = []
    for impl, by_c in per_model.items():
        for c, arm_results in by_c.items():
            section = None if judged is None else judged[(impl, c)]
            body += model_section(impl, c, arm_results, ARM_HELP, mismatches, dtype, section)
    return "\n".join(head + body)
