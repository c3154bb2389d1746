"""`k3 bench router`: placement decision latency and memory with 100,000 live sessions, and the
proxy overhead of the router next to SMG (if installed: `pip install -e '.[bench]'`) against one
mock worker, all measured in the same run on loopback; then one router replica's throughput vs two's
(replica_bench.py, instant mock workers, `--no-replicas` skips it).

Proxy figures (`k3_sglang/router/proxy_bench.py`): at concurrency 1 the added latency over talking to the worker
directly (non-streamed, and time to first byte streamed), at concurrency 32 the throughput as a
share of direct, and router CPU per request. `--profile` samples the k3 router with py-spy during a
concurrency-32 phase and sorts its time into where it goes.

Everything is bounded: fixed request counts, 127.0.0.1 only, subprocesses killed at the end.
Figures go to docs/router-bench.md (section between the `bench` markers) unless --no-write.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import time

from k3_sglang.tooling.router.proxy_bench import proxy_markdown, run_proxy_bench
from k3_sglang.tooling.router.replica_bench import replica_markdown, run_replica_bench
from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.core import Capacity, RouterCore
from k3_sglang.router.policy import RouteRequest
from k3_sglang.tooling.router.replay import percentile, update_section
from k3_sglang.router.session_key import request_facts

BENCH_BEGIN, BENCH_END = "<!-- bench:begin -->", "<!-- bench:end -->"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `k3 bench router`."""
    parser.add_argument("--sessions", type=int, default=100_000, help="live sessions (default 100,000)")
    parser.add_argument("--decisions", type=int, default=20_000, help="timed placement decisions")
    parser.add_argument("--workers", type=int, default=8, help="workers in the placement fleet")
    parser.add_argument("--proxy-requests", type=int, default=400, help="concurrency-1 iterations per target")
    parser.add_argument("--c32-requests", type=int, default=25, help="requests per task at concurrency 32")
    parser.add_argument("--rounds", type=int, default=3, help="concurrency-32 rounds (target order rotates)")
    parser.add_argument("--smg", help="path of the `smg` executable (default: beside python, then PATH)")
    parser.add_argument("--no-smg", action="store_true", help="do not measure SMG even if installed")
    parser.add_argument("--profile", action="store_true", help="profile the k3 router with py-spy at concurrency 32")
    parser.add_argument("--no-replicas", action="store_true", help="skip one vs two router replicas")
    parser.add_argument("--docs-dir", default="docs")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/router-bench.md")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def rss_bytes() -> int:
    """Resident set size of this process."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _session_keys(session: int, blocks: int) -> tuple[int, ...]:
    shared = [1_000_000 + (session % 50) * 8 + i for i in range(4)]  # 50 shared system prompts
    return tuple(shared + [session * 1_000 + i for i in range(blocks)])


def bench_placement(sessions: int, decisions: int, workers: int, seed: int = 0) -> dict:
    """Populate `sessions` keyless live sessions, then time identify + route for follow-ups and new ones."""
    rng = random.Random(seed)
    gc.collect()
    before = rss_bytes()
    core = RouterCore(PolicyConfig(session_ttl_s=1e9))
    per_worker_sessions = sessions // workers + 1_000
    for i in range(workers):
        core.add_worker(f"http://10.0.0.{i}:30000", Capacity(per_worker_sessions * 60_000, per_worker_sessions, 12_000.0))

    def turn(s: int, context: int, now: float) -> float:
        keys = _session_keys(s, min(context // 512, 8))
        started = time.perf_counter()
        session_id, _ = core.identify(keys)
        _, ticket = core.route(RouteRequest(session_id, context, 1_024, keys, True), keys, now)
        elapsed = time.perf_counter() - started
        if ticket is not None:
            core.complete(ticket, now, ok=True, output_tokens=200)
        return elapsed

    contexts = []
    for s in range(sessions):
        contexts.append(rng.randint(2_000, 100_000))
        turn(s, contexts[-1], s * 1e-3)
    gc.collect()
    memory = rss_bytes() - before
    latencies, now = [], sessions * 1e-3
    for n in range(decisions):
        new = rng.random() < 0.2
        s = sessions + n if new else rng.randrange(sessions)
        latencies.append(turn(s, rng.randint(2_000, 100_000) if new else contexts[s] + 1_000, now))
        now += 1e-3
    return {
        "live_sessions": len(core.fleet.sessions),
        "decision_p50_ms": round(percentile(latencies, 50) * 1e3, 4),
        "decision_p99_ms": round(percentile(latencies, 99) * 1e3, 4),
        "router_memory_mb": round(memory / 2**20, 1),
        "process_rss_mb": round(rss_bytes() / 2**20, 1),
    }


def bench_request_parsing(chars: int = 400_000, repeats: int = 50) -> dict:
    """Time prefix keys + block hashes of one ~100K-token chat body."""
    body = {"model": "m", "messages": [{"role": "system", "content": "s" * 2_000},
                                       {"role": "user", "content": "x" * chars}]}
    cfg = PolicyConfig()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        request_facts("/v1/chat/completions", {}, body, cfg)
        times.append(time.perf_counter() - started)
    return {"parse_100k_token_chat_p50_ms": round(percentile(times, 50) * 1e3, 3)}


def machine() -> str:
    """One line naming the machine the figures come from."""
    model = platform.processor() or "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), model)
    except (OSError, subprocess.SubprocessError):
        pass
    load = os.getloadavg()[0]
    return f"{os.cpu_count()} CPUs ({model}), load average {load:.2f} at start"


def markdown(figures: dict, command: str) -> str:
    """The benchmark section of docs/router-bench.md."""
    p, q = figures["placement"], figures["parsing"]
    return (
        f"### Router benchmark ({figures['date']}; {figures['machine']})\n\n"
        f"Command: `{command}`\n\n"
        "| measure | figure | target |\n|---|---|---|\n"
        f"| identify + place with {p['live_sessions']:,} live keyless sessions, p50 / p99 | "
        f"{p['decision_p50_ms']} / {p['decision_p99_ms']} ms | p99 <= 1 ms |\n"
        f"| router memory for those sessions (RSS delta; process RSS {p['process_rss_mb']} MB) | "
        f"{p['router_memory_mb']} MB | <= 300 MB |\n"
        f"| prefix keys + block hashes of a ~100K-token chat body, p50 | {q['parse_100k_token_chat_p50_ms']} ms | - |\n\n"
        + proxy_markdown(figures["proxy"])
        + ("\n" + replica_markdown(figures["replicas"]) if "replicas" in figures else "")
    )


def run(args: argparse.Namespace) -> int:
    """Run all router benchmarks (about two minutes on 2 cores)."""
    from k3_sglang.cli import CliError

    if min(args.sessions, args.decisions, args.workers, args.proxy_requests, args.c32_requests, args.rounds) <= 0:
        raise CliError("--sessions, --decisions, --workers, --proxy-requests, --c32-requests and --rounds "
                       "must be positive")
    if args.smg and not os.access(args.smg, os.X_OK):
        raise CliError(f"--smg {args.smg}: not an executable file")
    figures = {"date": dt.date.today().isoformat(), "machine": machine()}
    figures["placement"] = bench_placement(args.sessions, args.decisions, args.workers)
    figures["parsing"] = bench_request_parsing()
    figures["proxy"] = run_proxy_bench(args.proxy_requests, args.c32_requests, args.rounds,
                                       smg=None if args.no_smg else (args.smg or ""), profile=args.profile)
    if not args.no_replicas:
        figures["replicas"] = run_replica_bench(args.c32_requests, args.rounds)
    command = "k3 " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:3] == ["bench", "router"] \
        else "k3 bench router"
    if not args.no_write:
        os.makedirs(args.docs_dir, exist_ok=True)
        update_section(os.path.join(args.docs_dir, "router-bench.md"), BENCH_BEGIN, BENCH_END,
                       markdown(figures, command))
    print(json.dumps(figures, indent=2) if args.json else markdown(figures, command))
    return 0
