"""`k3 bench profile-verify`: measure the step cost of K3_CSV verify and decode steps and fit the planner's table.

One K3_CSV server at a time (the tiny K3 with `k3 serve` defaults, bf16, radix cache off, chain width
--width) per forced verify length L (K3_SPEC_FORCE_VERIFY_LEN=L: every decode step verifies exactly
min(L, tokens left) tokens per request; L=1 gives plain decode steps through the same worker). Each server gets
closed-loop batches of N concurrent greedy requests (distinct random prompts by input_ids, ignore_eos, a fixed
max_new_tokens) and writes one JSONL record per decode step (K3_SPEC_RECORD). Only the steady steps are kept:
records with n_reqs == N and a full chain for every request (n_tokens == N*L, l_max == L). The median seconds per
(N, L) become one StepSample; fit_affine fits the AffineCost; the table with each sample's fit residual is printed
and the model is saved (save_cost, meta: date, machine, load, residuals, samples) to --out.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import random
import signal
import statistics
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx

OUT = Path("docs/verify-cost-cpu.json")
OUT_SGLANG = Path("docs/verify-cost-cpu-sglang.json")  # SGLang's own K3 (the one model since the portable one retired)
MODEL_IMPLS = ("sglang",)  # the portable model retired (its last table stays in OUT)


def model_env(impl: str) -> dict[str, str]:
    """The bench server's model environment: none (SGLang's own K3 is the one model; on CPU, the k3_cpu platform)."""
    return {}
VOCAB = 760  # token ids the tiny checkpoint embeds safely


@dataclass(frozen=True)
class ProfilePoint:
    """Median of the steady steps of one (batch N, forced verify length L) cell."""

    n_reqs: int
    l_max: int
    n_tokens: int
    seconds: float  # median over the steady steps
    n_steps: int  # steady steps the median is over

    @property
    def kind(self) -> str:
        return "decode" if self.l_max == 1 else "verify"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lengths", type=int, nargs="+", default=[1, 2, 4, 8],
                        help="forced verify lengths L (1 = plain decode; default 1 2 4 8)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64],
                        help="concurrent requests N per batch (default 1 2 4 8 16 32 64)")
    parser.add_argument("--width", type=int, default=8, help="--speculative-num-draft-tokens (>= max L; default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="tokens per request (default 24)")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="prompt length (default 128)")
    parser.add_argument("--rounds", type=int, default=1, help="batches per (N, L) (default 1)")
    parser.add_argument("--model-impl", choices=MODEL_IMPLS, default="sglang",
                        help="which K3 serves (sglang: SGLang's own K3, the one model; default --out "
                             f"{OUT_SGLANG})")
    parser.add_argument("--out", default=None,
                        help=f"cost JSON (default {OUT_SGLANG}; '-': none)")


def check_args(args: argparse.Namespace) -> None:
    from k3_sglang.cli import CliError

    if min(args.lengths) < 1 or max(args.lengths) > args.width:
        raise CliError(f"--lengths must be in 1..--width ({args.width}), got {args.lengths}")
    if 1 not in args.lengths or len([x for x in set(args.lengths) if x > 1]) < 2:
        raise CliError("--lengths needs 1 (decode steps) and at least two lengths > 1 to fit the verify cost")
    if min(args.batches) < 1 or max(args.batches) > 64 or len(set(args.batches)) < 2:
        raise CliError("--batches must be at least two distinct values in 1..64")
    if args.max_new_tokens < 2 * max(args.lengths) or args.prompt_tokens < 8 or args.rounds < 1:
        raise CliError("--max-new-tokens must be >= 2 x the longest length, --prompt-tokens >= 8, --rounds >= 1")


def random_prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, VOCAB) for _ in range(n)]


def read_records(path: Path, start: int) -> tuple[list[dict], int]:
    """Records appended since line `start`, and the new line count."""
    if not path.exists():
        return [], start
    lines = path.read_text().splitlines()
    return [json.loads(x) for x in lines[start:] if x.strip()], len(lines)


def steady_point(records: list[dict], n: int, length: int) -> ProfilePoint | None:
    """The median step of the records with all N requests running a full chain of `length` tokens."""
    kind = "decode" if length == 1 else "verify"
    keep = [r for r in records if r["kind"] == kind and r["n_reqs"] == n and r["l_max"] == length
            and r["n_tokens"] == n * length]
    if not keep:
        return None
    return ProfilePoint(n, length, n * length, statistics.median(r["seconds"] for r in keep), len(keep))


def client(concurrency: int) -> httpx.Client:
    """One connection pool for all of a cell's requests: a fresh httpx.Client per request costs tens of ms of
    client CPU (GIL-bound), which staggers the arrivals of a concurrent batch on a 2-core machine."""
    return httpx.Client(timeout=1800, limits=httpx.Limits(max_connections=concurrency + 4,
                                                            max_keepalive_connections=concurrency + 4))


def _batch(url: str, prompts: list[list[int]], new_tokens: int) -> None:
    """All prompts at once (threads released together by a barrier), greedy, ignore_eos."""
    gate = threading.Barrier(len(prompts))
    with client(len(prompts)) as http:
        def one(ids):
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0,
                                                          "ignore_eos": True}}
            gate.wait(timeout=120)
            r = http.post(url + "/generate", json=body)
            if r.status_code != 200:
                raise RuntimeError(f"/generate answered {r.status_code}: {r.text[:300]}")

        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            list(pool.map(one, prompts))


def fit(points: list[ProfilePoint]):
    """(AffineCost, relative residuals [len(points)]) of fit_affine over one StepSample per point."""
    from k3_sglang.tooling.spec.cost_fit import StepSample, fit_affine, relative_residuals

    samples = [StepSample(p.kind, p.n_reqs, p.n_tokens, p.l_max, p.seconds) for p in points]
    model = fit_affine(samples)
    return model, [float(x) for x in relative_residuals(model, samples)]


def table(points: list[ProfilePoint], model, residuals: list[float]) -> str:
    lines = ["| N | L | kind | tokens | steady steps | measured (ms) | fit (ms) | residual |",
             "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for p, res in zip(points, residuals):
        pred = model.decode(p.n_reqs) if p.kind == "decode" else model.step(p.n_reqs, p.n_tokens, p.l_max)
        lines.append(f"| {p.n_reqs} | {p.l_max} | {p.kind} | {p.n_tokens} | {p.n_steps} | {p.seconds * 1e3:.2f} | "
                     f"{pred * 1e3:.2f} | {res * 100:+.1f}% |")
    d = model.to_dict()
    terms = [f"{d[k] * 1e3:.4f} ms{'' if k == 'c0' else ' x ' + k.split('_')[1]}"
             for k in ("c0", "c_req", "c_tok", "c_lmax")]
    lines += ["", "fit: verify(N, T, L) = " + " + ".join(terms)
              + f"; decode(N) = {d['d0'] * 1e3:.4f} ms + {d['d_req'] * 1e3:.4f} ms x N",
              f"residuals: max |r| = {max(abs(r) for r in residuals) * 100:.1f}%, "
              f"median |r| = {statistics.median(abs(r) for r in residuals) * 100:.1f}%"]
    return "\n".join(lines).replace("x req", "x N").replace("x tok", "x T").replace("x lmax", "x L")


def stop_servers_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread, so the `finally` that stops the servers runs
    (a background job of a non-interactive shell starts with SIGINT ignored; SIGTERM would skip the finally)."""
    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, interrupt)
        signal.signal(signal.SIGTERM, interrupt)


def machine() -> str:
    from k3_sglang.tooling.bench.dcp_report import _cpu

    return f"{os.cpu_count()} x {_cpu()}"


def run(args: argparse.Namespace) -> int:
    from k3_sglang.serving.process import K3ServerProcess

    check_args(args)
    if args.out is None:
        args.out = str(OUT_SGLANG if args.model_impl == "sglang" else OUT)
    stop_servers_on_signals()
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="k3-bench-profile-verify-"))
    pool = max(32768, max(args.batches) * (args.prompt_tokens + args.max_new_tokens + args.width + 8) * 2)
    flags = ["--disable-radix-cache", "--max-running-requests", "64", "--max-total-tokens", str(pool),
             "--speculative-algorithm", "K3_CSV", "--speculative-num-draft-tokens", str(args.width)]
    points: list[ProfilePoint] = []
    seed = 0
    for length in sorted(set(args.lengths)):
        record = work / f"steps-L{length}.jsonl"
        env = {"K3_SPEC_RECORD": str(record), "K3_SPEC_FORCE_VERIFY_LEN": str(length), "K3_SPEC_VERIFY_MODE": "static",
               **model_env(args.model_impl)}
        server = K3ServerProcess(flags, work / f"serve-L{length}.log", env=env)
        try:
            server.start(timeout_s=900)
            _batch(server.url, [random_prompt(args.prompt_tokens, 10_000_000 + length * 100 + i) for i in range(4)],
                   8)  # warm-up
            _, mark = read_records(record, 0)
            for n in sorted(set(args.batches)):
                steady: list[dict] = []
                for _ in range(args.rounds):
                    prompts = [random_prompt(args.prompt_tokens, seed + i) for i in range(n)]
                    seed += n
                    _batch(server.url, prompts, args.max_new_tokens)
                    recs, mark = read_records(record, mark)
                    steady += recs
                p = steady_point(steady, n, length)
                if p is None:
                    print(f"L={length} N={n}: no steady step (all {n} requests with full chains); skipped", flush=True)
                    continue
                points.append(p)
                print(f"L={length} N={n}: {p.n_steps} steady steps, median {p.seconds * 1e3:.2f} ms", flush=True)
        finally:
            server.stop()
    from k3_sglang.cli import CliError

    try:
        model, residuals = fit(points)
    except ValueError as exc:
        raise CliError(f"cannot fit the step cost from {len(points)} points: {exc}") from None
    text = table(points, model, residuals)
    print(text)
    if args.out != "-":
        from k3_sglang.spec.cost import save_cost

        meta = {"date": f"{started:%Y-%m-%d %H:%M} UTC", "machine": machine(),
                "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
                "command": "k3 bench profile-verify " + " ".join(
                    [f"--lengths {' '.join(map(str, args.lengths))}", f"--batches {' '.join(map(str, args.batches))}",
                     f"--width {args.width}", f"--max-new-tokens {args.max_new_tokens}",
                     f"--prompt-tokens {args.prompt_tokens}", f"--rounds {args.rounds}",
                     f"--model-impl {args.model_impl}"]),
                "server": f"tiny K3 ({args.model_impl} model), bf16, k3 serve defaults + " + " ".join(flags),
                "samples": [{"kind": p.kind, "n_reqs": p.n_reqs, "n_tokens": p.n_tokens, "l_max": p.l_max,
                             "seconds": p.seconds, "steady_steps": p.n_steps} for p in points],
                "residuals": [round(r, 4) for r in residuals],
                "max_abs_residual": round(max(abs(r) for r in residuals), 4)}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        save_cost(model, args.out, meta)
        print(f"wrote {args.out}")
    return 0
