"""`k3 bench kda-prefill`: chunked torch KDA (`chunk_kda`) vs the per-token recurrence on CPU, same run.

Times a single-sequence prefill (default 4,096 tokens) at a small-but-real head geometry in fp32, alternating the
two implementations so shared-CPU load hits both alike, checks they agree, prints the ratio and writes
docs/bench-kda-prefill.md (date, machine, command, figures).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "bench-kda-prefill.md"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=4096, help="prefill length (default 4096)")
    parser.add_argument("--heads", type=int, default=4, help="KDA heads (default 4)")
    parser.add_argument("--head-dim", type=int, default=64, help="K = V head dim (default 64)")
    parser.add_argument("--chunk-sizes", type=int, nargs="+", default=[64, 32], help="chunk sizes to time (default 64 32)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each (median reported)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--out", type=Path, default=DOC, help="markdown report (default docs/bench-kda-prefill.md)")
    parser.add_argument("--no-write", action="store_true", help="print only")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _inputs(T: int, H: int, K: int):
    import torch

    from k3_sglang.kernels.kda import kda_gate, l2_normalize

    gen = torch.Generator().manual_seed(0)
    q = l2_normalize(torch.randn(T, H, K, generator=gen))
    k = l2_normalize(torch.randn(T, H, K, generator=gen))
    v = torch.randn(T, H, K, generator=gen)
    g = kda_gate(torch.randn(T, H, K, generator=gen), torch.randn(H, generator=gen), torch.randn(H * K, generator=gen), -5.0)
    beta = torch.rand(T, H, generator=gen)
    return q, k, v, g, beta


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(args: argparse.Namespace) -> dict:
    import torch

    from k3_sglang.kernels.kda import chunk_kda, naive_recurrent_kda

    if args.threads:
        torch.set_num_threads(args.threads)
    T, H, K = args.tokens, args.heads, args.head_dim
    q, k, v, g, beta = _inputs(T, H, K)
    scale = K ** -0.5
    chunk_kda(q[:128], k[:128], v[:128], g[:128], beta[:128], scale)  # warm-up
    times = {"recurrent": []} | {f"chunk{c}": [] for c in args.chunk_sizes}
    errs = {}
    for _ in range(args.repeats):
        dt, (o_ref, s_ref) = _timed(lambda: naive_recurrent_kda(q, k, v, g, beta, scale))
        times["recurrent"].append(dt)
        for c in args.chunk_sizes:
            dt, (o, s) = _timed(lambda: chunk_kda(q, k, v, g, beta, scale, chunk_size=c))
            times[f"chunk{c}"].append(dt)
            errs[c] = max(((o - o_ref).norm() / o_ref.norm()).item(), ((s - s_ref).norm() / s_ref.norm()).item())
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return {"median": med, "all": times, "rel_err": errs, "threads": torch.get_num_threads()}


def _report(args, res) -> str:
    med = res["median"]
    rec = med["recurrent"]
    lines = [
        "# KDA prefill on CPU: chunked torch vs per-token recurrence",
        "",
        f"- date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- machine: {os.cpu_count()} CPUs (nproc), {_cpu_model()}, torch threads {res['threads']}; shared with other jobs",
        f"- command: `k3 bench kda-prefill {' '.join(sys.argv[3:]) if sys.argv[1:3] == ['bench', 'kda-prefill'] else ''}`".rstrip(),
        f"- shape: one sequence, T={args.tokens}, H={args.heads}, K=V={args.head_dim}, fp32, lower-bound gate (-5)",
        f"- method: {args.repeats} alternating repeats of each implementation in one process, median reported",
        "",
        "| implementation | median s | best s | all runs s | speed-up (median) | speed-up (best) | max rel. err |",
        "|---|---|---|---|---|---|---|",
        f"| naive_recurrent_kda | {rec:.3f} | {min(res['all']['recurrent']):.3f} | "
        f"{', '.join(f'{t:.3f}' for t in res['all']['recurrent'])} | 1.0x | 1.0x | - |",
    ]
    for c in args.chunk_sizes:
        t = med[f"chunk{c}"]
        runs = res["all"][f"chunk{c}"]
        best = min(res["all"]["recurrent"]) / min(runs)
        lines.append(f"| chunk_kda, chunk {c} | {t:.3f} | {min(runs):.3f} | {', '.join(f'{x:.3f}' for x in runs)} | "
                     f"{rec / t:.1f}x | {best:.1f}x | {res['rel_err'][c]:.1e} |")
    lines += ["", "Goal: >= 10x for the default chunk size 64."]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    res = measure(args)
    text = _report(args, res)
    print(text)
    if not args.no_write:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kda_prefill", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
