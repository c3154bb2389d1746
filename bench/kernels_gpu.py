"""GPU kernel benchmark: `python bench/kernels_gpu.py [--batches 1 8 32 64] [--only kda mla ...]`.

Same cases as `k3 bench kernels`: checks every Triton kernel against its reference at K3-full shapes, then times it
against the device's measured copy bandwidth and matmul rate. Then it states the goal: the fused KDA decode
moves its bytes at >= 70 % of the measured bandwidth at every batch size (met / missed, worst case named), and with
--report appends the table's figures and that verdict to FILE (markdown). Exit code 1 if a reference check fails,
2 (with a message) without CUDA. The goal's verdict does not change the exit code: it is a figure, not a check.
"""
from __future__ import annotations

import argparse
import sys

from k3_sglang.tooling.bench import kernels

KDA_DECODE_GOAL = 0.70  # fraction of measured copy bandwidth


def bandwidth_fraction(row, bw: float) -> float:
    """The fraction of the measured bandwidth `bw` (bytes/s) that one benchmark row's bytes moved at."""
    return row.bytes / (row.ms * 1e-3) / bw


def kda_goal_lines(rows, bw: float, goal: float = KDA_DECODE_GOAL) -> list[str]:
    """One line per kda_decode row and a verdict line (met only if every batch size reaches the goal)."""
    decode = [r for r in rows if r.name == "kda_decode"]
    if not decode:
        return ["KDA fused decode: not run (add kda to --only)"]
    lines = [f"KDA fused decode {r.shape}: {r.ms * 1e3:.1f} us, {bandwidth_fraction(r, bw) * 100:.0f} % of measured "
             f"bandwidth (check {r.check})" for r in decode]
    worst = min(decode, key=lambda r: bandwidth_fraction(r, bw))
    frac = bandwidth_fraction(worst, bw)
    verdict = "met" if frac >= goal and all(r.check.startswith("ok") for r in decode) else "MISSED"
    lines.append(f"goal >= {goal * 100:.0f} % of measured bandwidth at every batch: {verdict} "
                 f"(worst {frac * 100:.0f} % at {worst.shape})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernels_gpu", description=__doc__)
    kernels.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        return kernels.run(args)  # prints why and returns 2
    from k3_sglang.tooling.bench import kernel_cases as cases

    torch.manual_seed(0)
    device = torch.cuda.get_device_name()
    bw, tflops = cases.copy_bandwidth(), cases.matmul_tflops()
    print(f"device: {device}; measured copy bandwidth {bw / 1e9:.0f} GB/s (read + write), bf16 matmul {tflops:.0f} TFLOP/s")
    rows = kernels.run_cases(args, bw, tflops)
    failed = [r for r in rows if not r.check.startswith("ok")]
    summary = kda_goal_lines(rows, bw)
    print("\n" + "\n".join(summary))
    print(f"\n{len(rows)} cases, {len(failed)} failed checks" + ("" if not failed else ": " + ", ".join(r.name for r in failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
