"""The report of `k3 bench plain-decode` (docs/bench-plain-decode.md): per model, each arm's step split into forward
and host time, host time next to A's as a share of A's step, and whether every arm emitted the same tokens."""
from __future__ import annotations

import os
import statistics

GOAL = 0.01  # the bar: a server that decides plain decode costs at most 1% more than a no-spec server


def extra_share(arm_steps, base_steps) -> float:
    """Host time per step above the base arm's, as a share of the base arm's whole step (loop)."""
    return (arm_steps.host - base_steps.host) / base_steps.loop


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


def model_section(impl: str, arms: dict, help_text: dict[str, str]) -> list[str]:
    base = arms["A"]["steps"]
    name = "SGLang's own K3 (`kimi_k3`)" if impl == "sglang" else "the portable K3"
    lines = [f"## {name}", "",
             "| arm | decode steps | step p50 (ms) | forward p50 | host p50 | host mean | run_batch outside forward | "
             "process_batch_result | rest of loop | host above A (pooled), share of A's step | client decode tok/s | / A |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for arm, res in arms.items():
        s = res["steps"]
        share = "-" if arm == "A" else f"{extra_share(s, base) * 100:+.2f}%"
        ratio = res["decode_tps"] / arms["A"]["decode_tps"]
        lines.append(f"| {arm}: {help_text[arm]} | {s.steps} | {_ms(s.loop)} | {_ms(s.forward)} | {_ms(s.host)} | "
                     f"{_ms(s.host_mean)} | {_ms(s.run_outside_forward)} | {_ms(s.result)} | {_ms(s.rest)} | "
                     f"{share} | {res['decode_tps']:.1f} | {ratio:.3f} |")
    lines.append("")
    for arm in arms:
        if arm == "A":
            continue
        shares = paired_shares(arms[arm]["per_request"], arms["A"]["per_request"])
        if not shares:
            lines.append(f"- {arm}: no request with enough timed steps in both arms")
            continue
        mid = statistics.median(shares)
        verdict = "**met**" if mid <= GOAL else "**NOT met**"
        lines.append(f"- {arm}: host time above A, paired per request = {mid * 100:+.2f}% of A's step (median of "
                     f"{len(shares)} requests, interquartile {_quantile(shares, 0.25) * 100:+.2f}% to "
                     f"{_quantile(shares, 0.75) * 100:+.2f}%; goal <= {GOAL * 100:.0f}%): {verdict}")
    fwd = [w.forward for w in arms["A"]["per_request"] if w is not None]
    if fwd:
        lines.append(f"- drift: A's forward p50 per request ranged {min(fwd) * 1e3:.1f} to {max(fwd) * 1e3:.1f} ms "
                     "over the run (the same prompt length and step count every time)")
    same = [all(o == a for o, a in zip(arms[arm]["outputs"], arms["A"]["outputs"])) for arm in arms]
    n = len(arms["A"]["outputs"])
    lines.append(f"- output identity: {'every arm emitted the same tokens as A on all ' + str(n) + ' requests' if all(same) else '**OUTPUT MISMATCH** between arms'}")
    return lines + [""]


def report(args, started, load_before, per_model: dict) -> str:
    from k3_sglang.tooling.bench.plain_decode import ARM_HELP
    from k3_sglang.tooling.bench.profile_verify import machine

    load = os.getloadavg()
    arms = " ".join(args.arms)
    head = [
        "# `k3 bench plain-decode`: what K3_CSV costs per step when it decides plain decode", "",
        f"Run {started:%Y-%m-%d %H:%M} UTC on {machine()}; load average {load_before[0]:.2f} before, {load[0]:.2f} at "
        "the end. Command:", "",
        "```",
        f"k3 bench plain-decode --model-impl {args.model_impl} --arms {arms} --requests {args.requests} "
        f"--max-new-tokens {args.max_new_tokens} --prompt-tokens {args.prompt_tokens} --width {args.width}",
        "```", "",
        "Servers: the tiny K3 (random weights) in bf16 with `k3 serve` defaults, `--disable-radix-cache`, SGLang "
        "0.5.23 on CPU, every arm alive at once and every server with `K3_STEP_TIMING` "
        "(k3_sglang/serving/step_timing.py). Requests: one at a time, greedy, random prompts by input_ids, "
        "ignore_eos; the arms take turns per request in a rotating order. A decode step's *step* is one whole "
        "scheduler loop (run_batch to the next run_batch); *host* = step - model forward, split into run_batch "
        "outside the forward (SGLang's speculative path and K3_CSV's worker), process_batch_result, and the rest of "
        "the loop (receiving requests, building the next batch with its KV allocation). The table: medians over "
        "every batch-1 decode step after warm-up. The goal lines: per request, the arm's host time above A's on the "
        "same prompt, run next to it, as a share of A's step in that request; the median over requests (the "
        "machine's drift cancels in the pair). Client decode tok/s = tokens after the first / stream time after "
        "the first, pooled.", "",
        "Why host time: the forward is the same code in every arm (a plain DECODE forward, no spec input), so what "
        "a speculative server adds when it decides plain decode is host time; it is measured per step inside the "
        "server, where this machine's drift (the drift line below: the same forward a request apart) does not blur "
        "a 1% difference the way client tok/s does.", ""]
    body: list[str] = []
    for impl, arm_results in per_model.items():
        body += model_section(impl, arm_results, ARM_HELP)
    return "\n".join(head + body)
