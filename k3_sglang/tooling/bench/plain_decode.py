"""`k3 bench plain-decode`: what a K3_CSV server that decides "plain decode" costs next to a no-spec server, per step.

Arms, all on one model, alive together, taking turns per round (the order rotates): a round is c greedy requests
released together on one arm (c from --concurrency, 1 by default), so the machine's drift over seconds lands on every
arm alike:
  A  no speculation;
  D  K3_CSV with K3_SPEC_VERIFY_MODE=decode: never drafts, so every step is SGLang's speculative path plus our
     worker around a plain decode forward (the floor of what speculation costs when it does not pay);
  C  K3_CSV compact (the planner, lookup drafter, the model's cost table) on random prompts, where it settles into
     plain decoding and only probes (spec/policy.py);
  S  (optional) D with K3_SPEC_PLAIN_PATH=0: every plain step on SGLang's speculative path, as before the plain path
     (spec/plain_path.py), so the old and new cost are measured in the same run.
With the plain path (the default) D's steps and C's settled steps between probes run SGLang's non-speculative path.
Every server runs with K3_STEP_TIMING (k3_sglang/serving/step_timing.py): each decode step's whole scheduler loop,
split into the model forward and host time (loop - forward), and host time into run_batch outside the forward
and what follows run_batch (process_batch_result, receiving requests, building the next batch). The report compares
mean host time per step of batch c with A's, as a share of A's step (docs/bench-plain-decode.md). A settled C still
drafts and plans for all c requests on its probe steps.
Output identity: with --dtype float32 every arm must emit A's tokens (any mismatch fails the run: exit 1, after the
report is written). In bf16 A's server reruns a sample of each concurrency's prompts at another batch shape (the
control, tooling/bench/identity_control.py); each arm's mismatches, classified at their first differing token by
probing A's server (tooling/bench/output_identity.py), must be near ties or inside the control's envelope, and the
arm's share of flipped prompts within the control's (exit 1 otherwise).
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DOC = Path("docs/bench-plain-decode.md")
WARM_REQUESTS, WARM_TOKENS = 2, 32  # per server before timing (outside every timed round, so never timed)
MAX_CONCURRENCY = 64
ARM_HELP = {"A": "no speculation", "D": "K3_CSV, verify mode `decode` (never drafts)",
            "C": "K3_CSV compact (planner + lookup drafter), settles into plain decode",
            "S": "K3_CSV `decode` with K3_SPEC_PLAIN_PATH=0 (plain steps on SGLang's speculative path)"}
DEFAULT_ARMS = ("A", "D", "C")


@dataclass(frozen=True)
class ArmSteps:
    """Medians (seconds) over one arm's decode steps of batch size `batch` (its rounds' c)."""

    steps: int
    loop: float
    forward: float
    host: float
    host_mean: float
    run_outside_forward: float
    after_run: float

    @classmethod
    def window(cls, rows: list[dict], start: float, end: float, batch: int = 1) -> "ArmSteps | None":
        """The steps that began inside one round's [start, end] (perf_counter), or None with fewer than 10 of them
        at batch size `batch`."""
        inside = [r for r in inside_windows(rows, [(start, end)]) if r["b"] == batch]
        return cls.of(inside, batch) if len(inside) >= 10 else None

    @classmethod
    def of(cls, rows: list[dict], batch: int = 1) -> "ArmSteps":
        rows = [r for r in rows if r["b"] == batch]
        if len(rows) < 10:
            raise RuntimeError(f"only {len(rows)} timed decode steps of batch {batch} (K3_STEP_TIMING wrote too few)")
        med = statistics.median
        host = [r["loop"] - r["fwd"] for r in rows]
        return cls(len(rows), med([r["loop"] for r in rows]), med([r["fwd"] for r in rows]), med(host),
                   statistics.fmean(host), med([r["run"] - r["fwd"] for r in rows]),
                   med([r["loop"] - r["run"] for r in rows]))


def inside_windows(rows: list[dict], windows: list[tuple[float, float]]) -> list[dict]:
    """The step rows that began inside any of the [start, end] windows (the timed rounds; warm-up is outside)."""
    return [r for r in rows if any(start <= r["t"] <= end for start, end in windows)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-impl", choices=("sglang",), default="sglang",
                        help="which K3 the arms serve: SGLang's own K3 (the portable model retired)")
    parser.add_argument("--arms", nargs="+", choices=tuple(ARM_HELP), default=list(DEFAULT_ARMS),
                        help="default A D C (A is always included; S: D on the speculative path, for comparison)")
    parser.add_argument("--requests", type=int, default=12, help="rounds per arm and concurrency (default 12)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1],
                        help="requests released together per round (default 1; each value is its own section)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="tokens per request (default 96)")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="prompt length (default 128)")
    parser.add_argument("--width", type=int, default=8, help="--speculative-num-draft-tokens of D and C (default 8)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="--dtype of every server (default bfloat16; float32: every arm must emit A's tokens)")
    parser.add_argument("--out", default=str(DOC), help=f"report (default {DOC}; '-': none)")


def check_args(args: argparse.Namespace) -> None:
    from k3_sglang.cli import CliError

    if args.requests < 2 or args.max_new_tokens < 16:
        raise CliError("--requests must be >= 2 and --max-new-tokens >= 16 (steady steps to time)")
    if not 2 <= args.width <= 16:
        raise CliError("--width must be in 2..16")
    if not all(1 <= c <= MAX_CONCURRENCY for c in args.concurrency):
        raise CliError(f"--concurrency values must be in 1..{MAX_CONCURRENCY}")
    if "A" not in args.arms:
        args.arms = ["A", *args.arms]
    if "C" in args.arms:
        for impl in _impls(args):
            cost = _cost_table(impl)
            if not cost.is_file():
                raise CliError(f"no cost table at {cost} for arm C: run `k3 bench profile-verify` first")


def _impls(args: argparse.Namespace) -> list[str]:
    return [args.model_impl]  # SGLang's own K3 (the portable model retired)


def _cost_table(impl: str) -> Path:
    from k3_sglang.tooling.bench.verify import COST, COST_SGLANG

    return COST_SGLANG if impl == "sglang" else COST


def arm_env(arm: str, impl: str, steps_prefix: Path) -> dict[str, str]:
    """The environment of one arm's server (module docstring)."""
    env = {"K3_STEP_TIMING": str(steps_prefix)}
    if arm == "A":
        return env
    if arm == "D":
        return {**env, "K3_SPEC_VERIFY_MODE": "decode"}
    if arm == "S":
        return {**env, "K3_SPEC_VERIFY_MODE": "decode", "K3_SPEC_PLAIN_PATH": "0"}
    return {**env, "K3_SPEC_VERIFY_MODE": "compact", "K3_SPEC_DRAFTER": "lookup",
            "K3_SPEC_COST_TABLE": str(_cost_table(impl).resolve())}


def run_model(args: argparse.Namespace, impl: str, work: Path) -> dict:
    """Start the arms for one model, run every concurrency's rounds with the arms taking turns, stop them; per
    concurrency and arm: ArmSteps over its rounds, per-round ArmSteps, client decode tok/s, every request's tokens."""
    from k3_sglang.serving.process import K3ServerProcess
    from k3_sglang.serving.step_timing import FLUSH_SECONDS, read_steps
    from k3_sglang.tooling.bench.verify import _post_all, chat_prompt, run_cell

    running = str(max(8, *args.concurrency))
    flags = ["--disable-radix-cache", "--max-running-requests", running, "--max-total-tokens", "32768",
             "--dtype", getattr(args, "dtype", "bfloat16")]
    spec = ["--speculative-algorithm", "K3_CSV", "--speculative-num-draft-tokens", str(args.width)]
    servers: dict[str, K3ServerProcess] = {}
    prefixes = {arm: work / f"steps-{impl}-{arm}" for arm in args.arms}
    rounds: dict[int, dict[str, list]] = {c: {arm: [] for arm in args.arms} for c in args.concurrency}
    prompts: dict[str, list[int]] = {}
    try:
        for arm in args.arms:
            servers[arm] = K3ServerProcess(flags + ([] if arm == "A" else spec), work / f"serve-{impl}-{arm}.log",
                                           env=arm_env(arm, impl, prefixes[arm])).start(timeout_s=900)
            warm = [chat_prompt(args.prompt_tokens, 99_000 + i) for i in range(WARM_REQUESTS)]
            _post_all(servers[arm].url, warm, WARM_TOKENS, 1)
        for c in args.concurrency:
            for i in range(args.requests):
                keyed = [(f"{impl}/c{c}/{i}/{j}", chat_prompt(args.prompt_tokens, 7_000 + 1_000 * c + c * i + j))
                         for j in range(c)]
                prompts.update(keyed)
                shift = i % len(args.arms)
                order = args.arms[shift:] + args.arms[:shift]
                for arm in order:
                    t0 = time.perf_counter()
                    _, res = run_cell(servers[arm].url, keyed, c, args.max_new_tokens)
                    rounds[c][arm].append((sorted(res, key=lambda r: r.key), t0, time.perf_counter()))
                print(f"{impl}: c={c} round {i + 1}/{args.requests} on {', '.join(order)}", flush=True)
        dtype = getattr(args, "dtype", "bfloat16")
        control = run_controls(servers["A"].url, rounds, prompts, args.max_new_tokens) if dtype == "bfloat16" else {}
        mismatches = explain_outputs(servers["A"].url, rounds, prompts, dtype, control)
        time.sleep(3 * FLUSH_SECONDS)  # the servers' step writers take their last records (no atexit on a signal)
    finally:
        for s in servers.values():
            s.stop()
    rows = {arm: read_steps(prefixes[arm]) for arm in args.arms}
    return ({c: {arm: arm_result(rows[arm], rounds[c][arm], c) for arm in args.arms} for c in args.concurrency},
            mismatches, {c: len(out) for c, out in control.items()})


def run_controls(url: str, rounds: dict, prompts: dict[str, list[int]], new_tokens: int) -> dict:
    """bf16: per concurrency, A's own outputs for a sample of its rounds' prompts at another batch shape
    (tooling/bench/identity_control.py), after the timed rounds (never timed)."""
    from k3_sglang.tooling.bench.identity_control import control_groups, run_control

    out = {}
    for c, by_arm in rounds.items():
        keys = [r.key for results, _, _ in by_arm["A"] for r in results]
        out[c] = run_control(url, control_groups(keys, c), prompts, new_tokens)
    return out


def explain_outputs(url: str, rounds: dict, prompts: dict[str, list[int]], dtype: str, control=None) -> list:
    """Every arm's (and the bf16 control's) greedy mismatch against A, classified at its first differing token by
    probing A's server (tooling/bench/output_identity.py); run after the timed rounds, so the probes are never
    timed."""
    from k3_sglang.tooling.bench.identity_control import CONTROL_ARM
    from k3_sglang.tooling.bench.output_identity import explain, server_vocab

    outputs: dict[str, dict[str, tuple[int, ...]]] = {}
    for by_arm in rounds.values():
        for arm, arm_rounds in by_arm.items():
            for results, _, _ in arm_rounds:
                for r in results:
                    outputs.setdefault(r.key, {})[arm] = r.output_ids
    for by_key in (control or {}).values():
        for key, ids in by_key.items():
            outputs[key][CONTROL_ARM] = ids
    return explain(outputs, prompts, url, dtype, server_vocab(url))


def judge_sections(per_model: dict, mismatches: list, controls: dict) -> dict:
    """bf16: {(impl, c): ([Judgement per spec arm], control prompts compared)} against each section's control (identity_control.judge)."""
    from k3_sglang.tooling.bench.identity_control import judge

    out = {}
    for impl, by_c in per_model.items():
        for c, arms in by_c.items():
            mine = [m for m in mismatches if m.key.startswith(f"{impl}/c{c}/")]
            compared = {arm: len(res["outputs"]) for arm, res in arms.items()}
            n_control = controls[impl].get(c, 0)
            out[(impl, c)] = (judge(mine, compared, n_control), n_control)
    return out


def arm_result(rows: list[dict], rounds: list, c: int) -> dict:
    """One arm at concurrency c: ArmSteps over its rounds' steps of batch c, each round's ArmSteps, client decode
    tok/s (c x tokens after the first / stream time after the first, pooled) and every request's tokens."""
    reqs = [r for res, _, _ in rounds for r in res]
    tokens = sum(len(r.output_ids) - 1 for r in reqs)
    windows = [(t0, t1) for _, t0, t1 in rounds]
    return {"steps": ArmSteps.of(inside_windows(rows, windows), c),
            "decode_tps": c * tokens / sum(r.decode_s for r in reqs),
            "per_request": [ArmSteps.window(rows, t0, t1, c) for t0, t1 in windows],
            "outputs": [r.output_ids for r in reqs]}


def run(args: argparse.Namespace) -> int:
    from k3_sglang.tooling.bench.plain_decode_report import report
    from k3_sglang.tooling.bench.profile_verify import stop_servers_on_signals

    check_args(args)
    stop_servers_on_signals()
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="k3-bench-plain-decode-"))
    per_model, mismatches, controls = {}, [], {}
    for impl in _impls(args):
        per_model[impl], found, controls[impl] = run_model(args, impl, work)  # impl -> c -> arm -> result
        mismatches += found
    bf16 = getattr(args, "dtype", "bfloat16") == "bfloat16"
    judged = judge_sections(per_model, mismatches, controls) if bf16 else None
    text = report(args, started, load_before, per_model, mismatches, judged)
    print(text)
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    if judged is not None:  # bf16: judged against the control (identity_control.py)
        return 1 if any(not j.ok for js, _ in judged.values() for j in js) else 0
    from k3_sglang.tooling.bench.output_identity import failed

    return 1 if failed(mismatches) else 0
