"""docs/roofline.md's rows measured: the k3_dcp_mla kernel (as a server calls it, split + merge) for one MLA layer of
one request on one DCP rank, at every (device preset, context, DCP) row, timed on the GPU here and compared with
the row's attention-core bytes over this GPU's measured copy bandwidth. Needs only torch, triton and the checkout.

    python bench/roofline_check.py [--iters 20] [--report FILE]   # CUDA (bench/gpu_check.sh step 2c)
    python bench/roofline_check.py --dry-run                      # CPU: the same code at contexts / 8192, interpreter

Each row: rank 0 of DCP c holds ceil(S / c) keys in random 64-row pages of a bf16 latent pool (rotated over pools
larger than L2, so every timed call reads its keys from HBM); (96 / attention-TP) x c query heads; causal length S.
Printed: time per layer, the row's attention-core bytes per layer (KV + q/o, roofline.Row / 24), the fraction of the
measured bandwidth those bytes moved at, and the time the roofline's 70 % row predicts for one layer. Output NaN or
Inf fails the run (exit 1); fractions are figures, not checks. Without CUDA (and without --dry-run): exit 2.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

ROTATE_BYTES = 512 << 20
DRY_SCALE = 8192


def measured_copy_bandwidth(torch, device) -> float:
    """Device-to-device copy rate in bytes/s, read + write counted (as bench/kernels_gpu.py)."""
    n = (1 << 30) if device.type == "cuda" else (1 << 22)
    src = torch.empty(n // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = time_ms(torch, device, lambda i: dst.copy_(src), 20, 3)
    return 2 * n / (ms * 1e-3)


def time_ms(torch, device, fn, iters: int, warmup: int) -> float:
    """Median milliseconds of fn(i) over iters calls after warmup calls."""
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(i)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(i)
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def row_inputs(torch, device, heads: int, keys: int, context: int, sets: int, page: int = 64):
    """q [1, heads, 576] bf16 and `sets` (pool, block table) pairs of keys rows each; kv_lens, causal, q_indptr."""
    pages = math.ceil(keys / page)
    q = torch.randn(1, heads, 576, dtype=torch.bfloat16, device=device)
    pools = [torch.randn(pages * page, 576, dtype=torch.bfloat16, device=device) for _ in range(sets)]
    tables = [torch.randperm(pages, device=device, dtype=torch.int64).to(torch.int32)[None] for _ in range(sets)]
    lens = torch.tensor([keys], dtype=torch.int32, device=device)
    causal = torch.tensor([context], dtype=torch.int32, device=device)
    return q, pools, tables, lens, causal, torch.tensor([0, 1], dtype=torch.int32, device=device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="roofline_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--dry-run", action="store_true", help="CPU, contexts / 8192, Triton interpreter")
    parser.add_argument("--report", default=None, help="append the table to this markdown file")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("roofline_check: needs a CUDA GPU (or --dry-run); nothing was run", file=sys.stderr)
        return 2
    from k3_sglang.config_presets import k3_full
    from k3_sglang.kernels.mla.dcp_triton import mla_dcp_attention_triton
    from k3_sglang.tooling.bench import roofline

    device = torch.device("cpu" if args.dry_run else "cuda")
    cfg, scale = k3_full(), 192 ** -0.5
    layers = cfg.num_mla_layers
    bw = measured_copy_bandwidth(torch, device)
    name = "CPU (dry run)" if args.dry_run else torch.cuda.get_device_name()
    lines = [f"device: {name}; measured copy bandwidth {bw / 1e9:.0f} GB/s",
             "", "| preset | context | DCP | heads | keys | us/layer | MB/layer | % of measured bw | "
                 "roofline 70 % us/layer (vendor bw) | output |", "|---|---|---|---|---|---|---|---|---|---|"]
    failed = 0
    for r in roofline.rows(cfg):
        context = max(r.dcp, r.context // DRY_SCALE) if args.dry_run else r.context
        keys = math.ceil(context / r.dcp)
        layer_bytes = keys * 576 * 2 + r.qo_bytes // layers
        sets = 1 if args.dry_run else max(1, math.ceil(ROTATE_BYTES / (keys * 1152)))
        q, pools, tables, lens, causal, q_ptr = row_inputs(torch, device, r.heads, keys, context, sets)
        out = {}

        def call(i):
            out["o"] = mla_dcp_attention_triton(q, pools[i % sets], tables[i % sets], q_ptr, lens, causal, 64,
                                                r.dcp, 0, 512, scale, q_len=1)[0]

        ms = time_ms(torch, device, call, 2 if args.dry_run else args.iters, 0 if args.dry_run else args.warmup)
        finite = bool(torch.isfinite(out["o"].float()).all())
        failed += not finite
        frac = layer_bytes / (ms * 1e-3) / bw
        dev = next(d for d in roofline.DEVICES if d.name == r.device)
        goal_us = roofline.step_us(r.core_bytes, dev, 0.7) / layers
        lines.append(f"| {r.device} TP{dev.attn_tp} | {context} | {r.dcp} | {r.heads} | {keys} | {ms * 1e3:.1f} | "
                     f"{layer_bytes / 1e6:.2f} | {frac * 100:.0f} % | {goal_us:.1f} | "
                     f"{'ok' if finite else 'NOT FINITE'} |")
        print(lines[-1], flush=True)
        del pools, tables, out
    text = "\n".join(lines)
    print("\n" + text)
    if args.report:
        with open(args.report, "a") as f:
            f.write("\n" + text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
