"""`k3 bench TARGET`: each target is a module with `add_arguments(parser)` and `run(args) -> int`.

Targets are imported lazily; results are printed and written to docs/ by each target.
"""

from __future__ import annotations

import argparse
import importlib

BENCH_TARGETS: dict[str, tuple[str, str]] = {
    "serve": ("k3_sglang.bench.serve", "cold start, batch-1 decode and 32-way throughput of `k3 serve`"),
    "kda-prefill": ("k3_sglang.bench.kda_prefill", "chunked torch KDA vs the per-token recurrence on CPU"),
    "kernels": ("k3_sglang.bench.kernels", "Triton kernels vs references at K3-full shapes (CUDA only)"),
    "router": ("k3_sglang.bench.router", "router placement latency, memory and proxy overhead"),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark")
    targets = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    for name, (module_name, help_text) in BENCH_TARGETS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue
            raise
        target = targets.add_parser(name, help=help_text)
        module.add_arguments(target)
        target.set_defaults(func=module.run)
