"""`k3 bench kda-prefill`: chunked torch KDA (`chunk_kda`) vs the per-token recurrence on CPU, same run.

Times a single-sequence prefill (default 4,096 tokens) at a small-but-real head geometry in fp32, alternating the
two implementations so shared-CPU load hits both alike, checks they agree, prints the ratio and writes
docs/bench-kda-prefill.md (date, machine, load, command, figures). Both wall time and process CPU time are recorded:
on a loaded shared machine the CPU-time ratio is the stable one (default: one torch thread, so neither side gains
from intra-op parallelism).
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

DOC = Path(__file__).resolve().parents[3] / "docs" / "bench-kda-prefill.md"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=4096, help="prefill length (default 4096)")
    parser.add_argument("--heads", type=int, default=4, help="KDA heads (default 4)")
    parser.add_argument("--head-dim", type=int, default=64, help="K = V head dim (default 64)")
    parser.add_argument("--chunk-sizes", type=int, nargs="+", default=[64, 32], help="chunk sizes to time (default 64 32)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each (median reported)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts to run (default 1 2)")
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


def _timed(fn) -> tuple[tuple[float, float], object]:
    """((wall s, process CPU s), result)."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return (time.perf_counter() - t0, time.process_time() - c0), out


def measure(args: argparse.Namespace, threads: int) -> dict:
    import torch

    from k3_sglang.kernels.kda import chunk_kda, naive_recurrent_kda

    torch.set_num_threads(threads)
    T, H, K = args.tokens, args.heads, args.head_dim
    q, k, v, g, beta = _inputs(T, H, K)
    scale = K ** -0.5
    for _ in range(2):  # warm-up (thread pool, allocator) for this thread count
        chunk_kda(q[:256], k[:256], v[:256], g[:256], beta[:256], scale)
        naive_recurrent_kda(q[:64], k[:64], v[:64], g[:64], beta[:64], scale)
    names = ["recurrent"] + [f"chunk{c}" for c in args.chunk_sizes]
    wall, cpu = {n: [] for n in names}, {n: [] for n in names}
    errs = {}
    for _ in range(args.repeats):
        (w, c_), (o_ref, s_ref) = _timed(lambda: naive_recurrent_kda(q, k, v, g, beta, scale))
        wall["recurrent"].append(w)
        cpu["recurrent"].append(c_)
        for c in args.chunk_sizes:
            (w, c_), (o, s) = _timed(lambda: chunk_kda(q, k, v, g, beta, scale, chunk_size=c))
            wall[f"chunk{c}"].append(w)
            cpu[f"chunk{c}"].append(c_)
            errs[c] = max(((o - o_ref).norm() / o_ref.norm()).item(), ((s - s_ref).norm() / s_ref.norm()).item())
    return {"wall": wall, "cpu": cpu, "rel_err": errs, "threads": torch.get_num_threads(),
            "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")}


def _header(args, results) -> list[str]:
    return [
        "# KDA prefill on CPU: chunked torch vs per-token recurrence",
        "",
        f"- date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- machine: {os.cpu_count()} CPUs (nproc), {_cpu_model()}; 1-min load average after each thread setting: "
        f"{', '.join(format(r['load'], '.1f') for r in results)} (shared with other jobs)",
        f"- command: `k3 bench kda-prefill {' '.join(sys.argv[3:]) if sys.argv[1:3] == ['bench', 'kda-prefill'] else ''}`".rstrip(),
        f"- shape: one sequence, T={args.tokens}, H={args.heads}, K=V={args.head_dim}, fp32, lower-bound gate (-5)",
        f"- method: {args.repeats} alternating repeats of each implementation in one process; medians of wall time "
        "and of process CPU time (the CPU-time ratio is the stable figure on a loaded machine)",
        "",
        "| threads | implementation | median CPU s | median wall s | speed-up (CPU) | speed-up (wall) | wall runs s | max rel. err |",
        "|---|---|---|---|---|---|---|---|",
    ]


def _rows(args, res) -> list[str]:
    med = {kind: {n: statistics.median(v) for n, v in res[kind].items()} for kind in ("wall", "cpu")}
    rec_w, rec_c = med["wall"]["recurrent"], med["cpu"]["recurrent"]
    th = res["threads"]
    lines = [f"| {th} | naive_recurrent_kda | {rec_c:.3f} | {rec_w:.3f} | 1.0x | 1.0x | "
             f"{', '.join(f'{t:.2f}' for t in res['wall']['recurrent'])} | - |"]
    for c in args.chunk_sizes:
        n = f"chunk{c}"
        lines.append(f"| {th} | chunk_kda, chunk {c} | {med['cpu'][n]:.3f} | {med['wall'][n]:.3f} | "
                     f"{rec_c / med['cpu'][n]:.1f}x | {rec_w / med['wall'][n]:.1f}x | "
                     f"{', '.join(f'{t:.2f}' for t in res['wall'][n])} | {res['rel_err'][c]:.1e} |")
    return lines


def _report(args, results) -> str:
    lines = _header(args, results) + [row for res in results for row in _rows(args, res)]
    lines += ["", "Goal: >= 10x for the default chunk size 64. CPU time of a multi-threaded run adds up all threads."]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    results = [measure(args, t) for t in args.threads]
    text = _report(args, results)
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
