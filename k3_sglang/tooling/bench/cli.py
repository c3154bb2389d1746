"""`k3 bench TARGET`: each target is a module with `add_arguments(parser)` and `run(args) -> int`.

A target whose module cannot be imported is still listed; running it reports why.
"""

from __future__ import annotations

import argparse
import importlib

BENCH_TARGETS: dict[str, tuple[str, str]] = {
    "serve": ("k3_sglang.tooling.bench.serve", "cold start, batch-1 decode and 32-way throughput of `k3 serve`"),
    "long-context": ("k3_sglang.tooling.bench.long_context", "prefill time and decode rate of `k3 serve` at 4K-100K tokens"),
    "dcp": ("k3_sglang.tooling.bench.dcp", "decode step time and KV read per rank, TP2 with DCP2 vs without, 4K-64K"),
    "pp-prefill": ("k3_sglang.tooling.bench.pp_prefill", "16K-token chunked pipeline prefill: PP2 vs PP1 on one and two cores"),
    "kda-prefill": ("k3_sglang.tooling.bench.kda_prefill", "chunked torch KDA vs the per-token recurrence on CPU"),
    "kernels": ("k3_sglang.tooling.bench.kernels", "Triton kernels vs references at K3-full shapes (CUDA only; --static: "
                "compiled for sm_90a/sm_100a here)"),
    "roofline": ("k3_sglang.tooling.bench.roofline", "bytes, flops and HBM-bound step time of K3 MLA decode per rank, "
                 "DCP 1-8, H200 and GB300 (--write: docs/roofline.md)"),
    "router": ("k3_sglang.tooling.bench.router", "router placement latency, memory and proxy overhead"),
    "kv-events": ("k3_sglang.tooling.bench.kv_events", "agent sessions over two workers: text-inferred vs event-fed "
                  "placement vs event-fed + retention + prefetch"),
    "sessions": ("k3_sglang.tooling.bench.sessions", "round-robin agent sessions: HiCache off vs host tier vs host + L3"),
    "verify": ("k3_sglang.tooling.bench.verify", "no-spec vs verify-all vs confidence-scheduled K3_CSV, concurrency 1-64"),
    "profile-verify": ("k3_sglang.tooling.bench.profile_verify", "K3_CSV verify/decode step cost -> docs/verify-cost-cpu.json"),
    "plain-decode": ("k3_sglang.tooling.bench.plain_decode", "per-step host cost of K3_CSV deciding plain decode vs "
                     "no speculation (c = 1)"),
}


def _unavailable(name: str, error: Exception):
    def run(_args: argparse.Namespace) -> int:
        from k3_sglang.cli import CliError

        raise CliError(f"bench target {name!r} is unavailable: {error}")

    return run


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark")
    targets = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    for name, (module_name, help_text) in BENCH_TARGETS.items():
        target = targets.add_parser(name, help=help_text)
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - reported when the target is run
            target.set_defaults(func=_unavailable(name, exc))
            continue
        module.add_arguments(target)
        target.set_defaults(func=module.run)
