"""`k3 bench router`: placement decision latency and memory with 100,000 live sessions, and the
proxy overhead of the router vs talking to a mock worker directly (same run, loopback).

Everything is bounded: fixed request counts, 127.0.0.1 only, subprocesses killed at the end.
Figures go to docs/router-bench.md (section between the `bench` markers) unless --no-write.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import os
import random
import shlex
import subprocess
import sys
import time

import httpx

from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.core import Capacity, RouterCore
from k3_sglang.router.policy import RouteRequest
from k3_sglang.router.replay import percentile, update_section
from k3_sglang.router.session_key import request_facts
from k3_sglang.router.threaded import free_port

BENCH_BEGIN, BENCH_END = "<!-- bench:begin -->", "<!-- bench:end -->"
CHAT_BODY = {"model": "mock-k3", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 8}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `k3 bench router`."""
    parser.add_argument("--sessions", type=int, default=100_000, help="live sessions (default 100,000)")
    parser.add_argument("--decisions", type=int, default=20_000, help="timed placement decisions")
    parser.add_argument("--workers", type=int, default=8, help="workers in the placement fleet")
    parser.add_argument("--proxy-requests", type=int, default=400, help="requests per path (direct, router)")
    parser.add_argument("--docs-dir", default="docs")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/router-bench.md")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def rss_bytes() -> int:
    """Resident set size of this process."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _session_hashes(rng: random.Random, session: int, blocks: int) -> list[int]:
    shared = [1_000_000 + (session % 50) * 8 + i for i in range(4)]  # 50 shared system prompts
    return shared + [session * 1_000 + i for i in range(blocks)]


def bench_placement(sessions: int, decisions: int, workers: int, seed: int = 0) -> dict:
    """Populate `sessions` live sessions, then time route() for follow-up turns and new sessions."""
    rng = random.Random(seed)
    gc.collect()
    before = rss_bytes()
    core = RouterCore(PolicyConfig(session_ttl_s=1e9))
    per_worker_sessions = sessions // workers + 1_000
    for i in range(workers):
        core.add_worker(f"http://10.0.0.{i}:30000", Capacity(per_worker_sessions * 60_000, per_worker_sessions, 12_000.0))
    contexts = []
    for s in range(sessions):
        context = rng.randint(2_000, 100_000)
        contexts.append(context)
        _, ticket = core.route(RouteRequest(f"s{s}", context, 1_024), _session_hashes(rng, s, min(context // 512, 8)), s * 1e-3)
        core.complete(ticket, s * 1e-3, ok=True, output_tokens=200)
    gc.collect()
    memory = rss_bytes() - before
    latencies, now = [], sessions * 1e-3
    for n in range(decisions):
        new = rng.random() < 0.2
        s = sessions + n if new else rng.randrange(sessions)
        context = rng.randint(2_000, 100_000) if new else contexts[s] + 1_000
        hashes = _session_hashes(rng, s, min(context // 512, 8))
        started = time.perf_counter()
        _, ticket = core.route(RouteRequest(f"s{s}", context, 1_024), hashes, now)
        latencies.append(time.perf_counter() - started)
        if ticket is not None:
            core.complete(ticket, now, ok=True, output_tokens=200)
        now += 1e-3
    return {
        "live_sessions": len(core.fleet.sessions),
        "decision_p50_ms": round(percentile(latencies, 50) * 1e3, 4),
        "decision_p99_ms": round(percentile(latencies, 99) * 1e3, 4),
        "router_memory_mb": round(memory / 2**20, 1),
        "process_rss_mb": round(rss_bytes() / 2**20, 1),
    }


def bench_request_parsing(chars: int = 400_000, repeats: int = 50) -> dict:
    """Time session-key + prefix hashing of one ~100K-token chat body."""
    body = {"model": "m", "messages": [{"role": "system", "content": "s" * 2_000},
                                       {"role": "user", "content": "x" * chars}]}
    cfg = PolicyConfig()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        request_facts("/v1/chat/completions", {}, body, cfg)
        times.append(time.perf_counter() - started)
    return {"parse_100k_token_chat_p50_ms": round(percentile(times, 50) * 1e3, 3)}


def _start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_ready(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready within {timeout_s} s")


def _one(client: httpx.Client, url: str, stream: bool) -> float:
    body = dict(CHAT_BODY, stream=stream)
    started = time.perf_counter()
    if not stream:
        client.post(url, json=body).raise_for_status()
        return time.perf_counter() - started
    with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        chunks = response.iter_raw()
        next(chunks)
        elapsed = time.perf_counter() - started
        for _ in chunks:
            pass
    return elapsed


def bench_proxy(requests: int) -> dict:
    """Latency and streaming TTFB, direct to a mock worker vs through the router, interleaved."""
    worker_port, router_port = free_port(), free_port()
    worker = _start([sys.executable, "-m", "k3_sglang.router.mock_worker", "--port", str(worker_port)])
    router = _start([sys.executable, "-m", "k3_sglang.cli", "router", "--worker", f"http://127.0.0.1:{worker_port}",
                     "--port", str(router_port), "--log-level", "warning"])
    try:
        direct = f"http://127.0.0.1:{worker_port}/v1/chat/completions"
        routed = f"http://127.0.0.1:{router_port}/v1/chat/completions"
        _wait_ready(f"http://127.0.0.1:{worker_port}/health")
        _wait_ready(f"http://127.0.0.1:{router_port}/readiness")
        samples = {(path, stream): [] for path in ("direct", "router") for stream in (False, True)}
        with httpx.Client(timeout=10, trust_env=False) as client:
            for i in range(requests + 20):
                for stream in (False, True):
                    for path, url in (("direct", direct), ("router", routed)):
                        elapsed = _one(client, url, stream)
                        if i >= 20:  # warm-up
                            samples[(path, stream)].append(elapsed)
    finally:
        for proc in (router, worker):
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()
    ms = lambda key, q: percentile(samples[key], q) * 1e3  # noqa: E731
    return {
        "direct_p50_ms": round(ms(("direct", False), 50), 3), "router_p50_ms": round(ms(("router", False), 50), 3),
        "added_p50_ms": round(ms(("router", False), 50) - ms(("direct", False), 50), 3),
        "added_p99_ms": round(ms(("router", False), 99) - ms(("direct", False), 99), 3),
        "direct_ttfb_p50_ms": round(ms(("direct", True), 50), 3), "router_ttfb_p50_ms": round(ms(("router", True), 50), 3),
        "added_ttfb_p50_ms": round(ms(("router", True), 50) - ms(("direct", True), 50), 3),
        "requests_per_path": requests,
    }


def markdown(figures: dict, command: str) -> str:
    """The benchmark section of docs/router-bench.md."""
    p, x, q = figures["placement"], figures["proxy"], figures["parsing"]
    return (
        f"### Router benchmark ({dt.date.today().isoformat()}, 2-core CPU dev box)\n\n"
        f"Command: `{command}`\n\n"
        "| measure | figure | target |\n|---|---|---|\n"
        f"| placement decision with {p['live_sessions']:,} live sessions, p50 / p99 | "
        f"{p['decision_p50_ms']} / {p['decision_p99_ms']} ms | p99 <= 1 ms |\n"
        f"| router memory for those sessions (RSS delta; process RSS {p['process_rss_mb']} MB) | "
        f"{p['router_memory_mb']} MB | <= 300 MB |\n"
        f"| session key + prefix hashes of a ~100K-token chat body, p50 | {q['parse_100k_token_chat_p50_ms']} ms | - |\n"
        f"| non-streamed chat, direct vs router p50 | {x['direct_p50_ms']} vs {x['router_p50_ms']} ms "
        f"(added {x['added_p50_ms']} ms; p99 added {x['added_p99_ms']} ms) | added p50 <= 2 ms |\n"
        f"| streamed chat time to first byte, direct vs router p50 | {x['direct_ttfb_p50_ms']} vs "
        f"{x['router_ttfb_p50_ms']} ms (added {x['added_ttfb_p50_ms']} ms) | added p50 <= 2 ms |\n\n"
        f"Proxy figures: {x['requests_per_path']} requests per path, direct and routed interleaved in the same run, "
        "one keep-alive httpx client, mock worker and router as separate processes on 127.0.0.1.\n"
    )


def run(args: argparse.Namespace) -> int:
    """Run all router benchmarks (about a minute on 2 cores)."""
    from k3_sglang.cli import CliError

    if min(args.sessions, args.decisions, args.workers, args.proxy_requests) <= 0:
        raise CliError("--sessions, --decisions, --workers and --proxy-requests must be positive")
    figures = {"placement": bench_placement(args.sessions, args.decisions, args.workers),
               "parsing": bench_request_parsing()}
    figures["proxy"] = bench_proxy(args.proxy_requests)
    command = "k3 " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:3] == ["bench", "router"] \
        else "k3 bench router"
    if not args.no_write:
        os.makedirs(args.docs_dir, exist_ok=True)
        update_section(os.path.join(args.docs_dir, "router-bench.md"), BENCH_BEGIN, BENCH_END,
                       markdown(figures, command))
    print(json.dumps(figures, indent=2) if args.json else markdown(figures, command))
    return 0
