"""`k3 bench kernels` (also `python bench/kernels_gpu.py`): Triton kernels vs references at K3-full shapes, CUDA only.

In one run: measure the device's copy bandwidth and bf16 matmul rate; for each kernel check it against its
reference, then time it (CUDA events, warm-up, median, inputs rotated over sets bigger than L2) and print time,
byte floor (bytes / measured bandwidth), fraction of measured bandwidth and achieved TFLOP/s. About 1-3 minutes.
On a machine without CUDA it prints a message and exits with code 2.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass

L2_ROTATE_BYTES = 512 << 20  # rotate inputs over at least this much memory (H200 L2 is 60 MiB)
MLA_HEADS, MLA_LAT, MLA_V = 96, 576, 512


@dataclass
class Row:
    name: str
    shape: str
    ms: float
    bytes: float
    flops: float
    check: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64], help="decode batch sizes")
    parser.add_argument("--iters", type=int, default=50, help="timed iterations per case (median)")
    parser.add_argument("--warmup", type=int, default=10, help="warm-up iterations per case")
    parser.add_argument("--context", type=int, default=16384, help="MLA context length per request")
    parser.add_argument("--only", nargs="+", default=None,
                        choices=["mla", "merge"], help="run a subset")
    parser.add_argument("--static", action="store_true",
                        help="no GPU needed: compile every server kernel for sm_90a and sm_100a at production shapes "
                             "and report registers, spills, shared memory, blocks per SM (kernels_static.py)")
    parser.add_argument("--refresh", action="store_true", help="--static: ignore the compile caches")
    parser.add_argument("--write", action="store_true",
                        help="--static: rewrite the committed cache and the table in docs/kernels.md")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "static", False):
        from k3_sglang.tooling.bench import kernels_static

        return kernels_static.run(args)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        print("k3 bench kernels: needs a CUDA GPU and none is visible; nothing was run. "
              "(CPU checks: `pytest tests/kernels`, CPU timing: `k3 bench kda-prefill`.)", file=sys.stderr)
        return 2
    from k3_sglang.tooling.bench import kernel_cases as cases

    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    bw = cases.copy_bandwidth()
    tflops = cases.matmul_tflops()
    print(f"device: {dev}; measured copy bandwidth {bw / 1e9:.0f} GB/s (read + write), bf16 matmul {tflops:.0f} TFLOP/s")
    rows = run_cases(args, bw, tflops)
    failed = [r for r in rows if not r.check.startswith("ok")]
    print(f"\n{len(rows)} cases, {len(failed)} failed checks" + ("" if not failed else ": " + ", ".join(r.name for r in failed)))
    return 1 if failed else 0


def run_cases(args: argparse.Namespace, bw: float, tflops: float) -> list[Row]:
    """Check and time every selected case, printing one table row each."""
    from k3_sglang.tooling.bench import kernel_cases as cases

    rows: list[Row] = []
    groups = args.only or ["mla", "merge"]
    for group in groups:
        for row in getattr(cases, f"bench_{group}")(args):
            rows.append(Row(*row))
            _print_row(rows[-1], bw, tflops, header=len(rows) == 1)
    return rows


def _print_row(r: Row, bw: float, tflops: float, header: bool) -> None:
    if header:
        print(f"\n{'kernel':<22} {'shape':<34} {'time us':>9} {'floor us':>9} {'% bw':>6} {'TFLOP/s':>8}  check")
    floor_us = max(r.bytes / bw, r.flops / (tflops * 1e12)) * 1e6
    frac = (r.bytes / (r.ms * 1e-3)) / bw * 100
    achieved = r.flops / (r.ms * 1e-3) / 1e12
    print(f"{r.name:<22} {r.shape:<34} {r.ms * 1e3:>9.1f} {floor_us:>9.1f} {frac:>5.0f}% {achieved:>8.2f}  {r.check}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernels_gpu", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def n_sets(bytes_per_set: float) -> int:
    """How many input sets to rotate so that one pass touches more than L2_ROTATE_BYTES."""
    return max(1, math.ceil(L2_ROTATE_BYTES / max(1.0, bytes_per_set)))


def median_ms(fn, iters: int, warmup: int) -> float:
    """Median of per-call CUDA-event times; fn(i) gets the iteration number (to rotate inputs)."""
    import torch

    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(warmup + i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


if __name__ == "__main__":
    raise SystemExit(main())
