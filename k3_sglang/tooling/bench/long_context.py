"""`k3 bench long-context`: prefill time and decode rate of `k3 serve` at 4K to 100K-token prompts.

Starts the embedded default (tiny K3, real SGLang on CPU) on a free loopback port and, for each prompt length,
sends one fresh random prompt (nothing shared with earlier prompts, so no radix-cache hit) as a streamed greedy
request: the time to the first token is the prefill time, the stream after it gives the decode rate at that
context. Writes docs/bench-long-context.md and a plot of time vs length, and reports the 16K -> 64K prefill-time
ratio against the issue's goal (<= 5x). (The second server that once served the short lengths with
`K3_MLA_EXTEND=torch_native` is gone: that switch belonged to the retired portable model, and SGLang's K3 on CPU
always runs the `k3_cpu_mla` chunk-only extend.)
"""
from __future__ import annotations

import argparse
import datetime
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from k3_sglang.tooling.bench.streaming import stream_generate

DOC = Path("docs/bench-long-context.md")
DEFAULT_LENGTHS = (4096, 16384, 32768, 65536, 100000)
GOAL_RATIO = 5.0


@dataclass(frozen=True)
class Point:
    """One prompt length: median prefill seconds and decode tokens/s at that context."""

    length: int
    prefill_s: float  # median over the rounds
    decode_tps: float  # median over the rounds
    prefill_runs: tuple[float, ...] = ()

    @property
    def prefill_tps(self) -> float:
        return self.length / self.prefill_s


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS), help="prompt lengths (tokens)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over all lengths (medians are reported)")
    parser.add_argument("--decode-tokens", type=int, default=32, help="tokens generated after each prompt")
    parser.add_argument("--chunked-prefill-size", type=int, default=None, help="passed to k3 serve (default: its own)")
    parser.add_argument("--out", type=Path, default=DOC, help="report (default docs/bench-long-context.md; '-': none)")
    parser.add_argument("serve_args", nargs="*", help="extra `k3 serve` args, after --")


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 760) for _ in range(length)]  # ordinary BPE ids of the tiny vocabulary


def _one(url: str, ids: list[int], new_tokens: int) -> tuple[float, float]:
    """(seconds to the first streamed token, decode tokens/s after it) for one greedy request."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    prefill_s, decode_s, tokens = stream_generate(url, body, timeout_s=7200)
    if tokens < 2:
        raise RuntimeError(f"stream of a {len(ids)}-token prompt ended after {tokens} tokens")
    return prefill_s, (tokens - 1) / decode_s


def _serve_points(lengths: list[int], args: argparse.Namespace, seed0: int) -> list[Point]:
    from k3_sglang.serving.process import K3ServerProcess

    serve = list(args.serve_args)
    if args.chunked_prefill_size:
        serve += ["--chunked-prefill-size", str(args.chunked_prefill_size)]
    need = max(lengths) + args.decode_tokens + 64
    if need > 131072 and "--max-total-tokens" not in serve:
        serve += ["--max-total-tokens", str(need)]
    log = Path(tempfile.mkdtemp(prefix="k3-bench-lc-")) / "serve.log"
    runs: dict[int, list[tuple[float, float]]] = {n: [] for n in lengths}
    with K3ServerProcess(serve, log) as server:
        _one(server.url, _prompt(256, seed0 - 1), 4)  # warm-up
        for r in range(args.repeats):  # rounds over all lengths, so drift on a shared machine hits every length
            for i, length in enumerate(lengths):
                httpx.post(server.url + "/flush_cache", timeout=60)
                prefill_s, decode_tps = _one(server.url, _prompt(length, seed0 + 100 * r + i), args.decode_tokens)
                runs[length].append((prefill_s, decode_tps))
                print(f"round {r + 1} {length:>7} tokens: prefill {prefill_s:8.2f} s "
                      f"({length / prefill_s:7.0f} tok/s), decode {decode_tps:6.1f} tok/s", flush=True)
    return [Point(n, statistics.median(p for p, _ in runs[n]), statistics.median(d for _, d in runs[n]),
                  tuple(p for p, _ in runs[n])) for n in lengths]


def fit_linear_quadratic(points: list[Point]) -> tuple[float, float]:
    """Least-squares (a, b) of prefill_s = a * L + b * L^2 over the points (no intercept)."""
    s11 = sum(p.length ** 2 for p in points)
    s12 = sum(p.length ** 3 for p in points)
    s22 = sum(p.length ** 4 for p in points)
    r1 = sum(p.length * p.prefill_s for p in points)
    r2 = sum(p.length ** 2 * p.prefill_s for p in points)
    det = s11 * s22 - s12 * s12
    return (r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det


def scaling_ratio(points: list[Point], short: int = 16384, long: int = 65536) -> float | None:
    by_len = {p.length: p.prefill_s for p in points}
    return by_len[long] / by_len[short] if short in by_len and long in by_len else None


def kda_prefill_seconds(length: int, chunk: int, heads: int = 4, head_dim: int = 32) -> float:
    """Wall seconds of the model's chunked KDA (`chunk_kda`) over one length-token prompt, fed in prefill chunks
    of `chunk` tokens with the state carried between them as the server does (k3-tiny head geometry)."""
    import torch

    from k3_sglang.kernels.kda.naive import chunk_kda, kda_gate, l2_normalize

    gen = torch.Generator().manual_seed(length)
    state = None
    start = time.perf_counter()
    for lo in range(0, length, chunk):
        n = min(chunk, length - lo)
        q = l2_normalize(torch.randn(n, heads, head_dim, generator=gen))
        k = l2_normalize(torch.randn(n, heads, head_dim, generator=gen))
        v = torch.randn(n, heads, head_dim, generator=gen)
        g = kda_gate(torch.randn(n, heads, head_dim, generator=gen), torch.zeros(heads), torch.zeros(heads * head_dim),
                     -5.0)
        _, state = chunk_kda(q, k, v, g, torch.rand(n, heads, generator=gen), head_dim ** -0.5, initial_state=state)
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> int:
    from k3_sglang.cli import CliError

    if min(args.lengths) < 16 or args.decode_tokens < 2 or args.repeats < 1:
        raise CliError("--lengths must be >= 16 tokens, --decode-tokens >= 2 and --repeats >= 1")
    started = datetime.datetime.now(datetime.timezone.utc)
    points = _serve_points(sorted(set(args.lengths)), args, seed0=1000)
    ratio = scaling_ratio(points)
    if ratio is not None:
        verdict = "met" if ratio <= GOAL_RATIO else "NOT met"
        print(f"prefill time 64K / 16K = {ratio:.2f}x (goal <= {GOAL_RATIO:.0f}x: {verdict}; linear = 4x, "
              "exact attention's quadratic term alone = 16x)")
    chunk = args.chunked_prefill_size or 512
    kda = {n: kda_prefill_seconds(n, chunk) for n in (25_000, 100_000)}
    print(f"KDA chunked prefill alone (one layer, in process): 25K {kda[25_000]:.2f} s, 100K {kda[100_000]:.2f} s, "
          f"ratio {kda[100_000] / kda[25_000]:.2f}x for 4x the tokens")
    if str(args.out) != "-":
        from k3_sglang.tooling.bench.long_context_report import write_report

        write_report(args, started, points, ratio, kda)
    return 0
