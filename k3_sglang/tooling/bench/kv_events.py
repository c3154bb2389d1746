"""`k3 bench kv-events`: agent sessions through `k3 router` over two real `k3 serve` workers, three arms in one run:
text-inferred placement, event-fed placement (KV events with KDA checkpoints), and event-fed + retention +
prefetch. Writes docs/bench-kv-events.md.

Workload (the same seeded token ids in every arm, sizes in proportion to `--pool-tokens`): `--sessions` agent
sessions, each opening with one of two shared tool prompts (pool/10 tokens) and a task (pool/40), run `--turns`
turns together; each turn resends the session's history (its previous prompt and answer) plus a tool result
(pool/50). Between rounds a burst of `--burst` unrelated requests (pool/4 tokens each) goes through the router,
enough to evict idle sessions from the workers' pools. The retention arm's sessions ask for
`X-Session-Retain-S`; the workers keep up to `K3_RETAIN_SHARE` (0.6 here) of their pool for them. The workers
run without HiCache, so no prefix is ever in a host tier and the prefetch never fires here.
Before each arm both workers' caches are flushed and a fresh router starts. Measured per session turn, from
the client: time to the first streamed token (through the router) and the worker's `cached_tokens`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import random
import tempfile
import time
from pathlib import Path

import httpx

from k3_sglang.tooling.bench.serve import _machine
from k3_sglang.tooling.router.replay import percentile

ARMS = ("text-inferred", "event-fed", "event-fed + retention + prefetch")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--burst", type=int, default=6, help="unrelated requests between rounds")
    parser.add_argument("--pool-tokens", type=int, default=2048, help="each worker's --max-total-tokens")
    parser.add_argument("--retain-s", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("docs/bench-kv-events.md"), help="report file ('-': none)")


def summarize(turns: list[dict]) -> dict:
    """Cache-hit share and TTFT p50/p99 over resumed turns (turn >= 1) and over all session turns."""
    resumed = [t for t in turns if t["turn"] >= 1]
    return {
        "cache_hit_share": sum(t["cached"] for t in turns) / max(1, sum(t["prompt"] for t in turns)),
        "resumed_hit_share": sum(t["cached"] for t in resumed) / max(1, sum(t["prompt"] for t in resumed)),
        "ttft_p50_s": percentile([t["ttft"] for t in turns], 50),
        "ttft_p99_s": percentile([t["ttft"] for t in turns], 99),
        "resumed_ttft_p50_s": percentile([t["ttft"] for t in resumed], 50),
        "resumed_ttft_p99_s": percentile([t["ttft"] for t in resumed], 99),
    }


def _stream(router_url: str, ids: list[int], session: str | None, retain: float | None, new_tokens: int) -> dict:
    headers = {"X-Session-Id": session} if session else {}
    if retain:
        headers["X-Session-Retain-S"] = str(retain)
    body = {"input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0,
                                                                  "ignore_eos": True}}
    start, first, last = time.perf_counter(), None, None
    with httpx.stream("POST", router_url + "/generate", json=body, headers=headers, timeout=900) as response:
        if response.status_code != 200:
            raise RuntimeError(f"router answered {response.status_code}: {response.read()[:300]!r}")
        for line in response.iter_lines():
            if line.startswith("data:") and line.strip() != "data: [DONE]":
                first = first or time.perf_counter()
                last = json.loads(line[5:])
    meta = last["meta_info"]
    return {"ttft": first - start, "cached": meta.get("cached_tokens", 0), "prompt": meta["prompt_tokens"],
            "output_ids": last.get("output_ids", [])}


def _workload(args: argparse.Namespace) -> tuple[list[list[int]], list[list[list[int]]], list[list[list[int]]]]:
    """(session openings, per round the new tokens of each session, per round the burst prompts)."""
    rng = random.Random(args.seed)
    pool = args.pool_tokens

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 1000) for _ in range(n)]

    tools = [ids(pool // 10) for _ in range(2)]  # sizes scale with the pool: tool prompt 1/10, burst request 1/4
    openings = [tools[i % 2] + ids(pool // 40) for i in range(args.sessions)]
    rounds = [[ids(pool // 50) for _ in range(args.sessions)] for _ in range(args.turns)]
    bursts = [[ids(pool // 4) for _ in range(args.burst)] for _ in range(args.turns)]
    return openings, rounds, bursts


def run_arm(arm: str, router_url: str, args: argparse.Namespace, workload) -> list[dict]:
    """Play the workload once through the router; one record per session turn."""
    openings, rounds, bursts = workload
    retain = args.retain_s if "retention" in arm else None
    history = [list(o) for o in openings]
    turns: list[dict] = []
    with concurrent.futures.ThreadPoolExecutor(max(args.sessions, args.burst)) as pool:
        for turn in range(args.turns):
            prompts = [history[s] + (rounds[turn][s] if turn else []) for s in range(args.sessions)]
            results = list(pool.map(lambda s: _stream(router_url, prompts[s], f"agent-{s}", retain, 6),
                                    range(args.sessions)))
            for s, result in enumerate(results):
                history[s] = prompts[s] + result.pop("output_ids")
                turns.append({**result, "turn": turn, "session": s})
            list(pool.map(lambda ids: _stream(router_url, ids, None, None, 2), bursts[turn]))
    return turns


def run(args: argparse.Namespace) -> int:
    import signal
    import sys

    from k3_sglang.router.app import create_app
    from k3_sglang.router.config import PolicyConfig, ReliabilityConfig, RouterConfig, WorkerSpec
    from k3_sglang.router.threaded import ServerThread
    from k3_sglang.serving.process import K3ServerProcess

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the workers on the way out
    logs = Path(tempfile.mkdtemp(prefix="k3-bench-kv-events-"))
    serve = ["--max-total-tokens", str(args.pool_tokens), "--max-mamba-cache-size", "32",
             "--chunked-prefill-size", "256", "--max-running-requests", "4"]
    workers = []
    results: dict[str, dict] = {}
    try:
        for i in range(2):
            workers.append(K3ServerProcess(serve, logs / f"serve-{i}.log", env={"K3_RETAIN_SHARE": "0.6"}).start(600))
        workload = _workload(args)
        for arm in ARMS:
            for w in workers:
                httpx.post(w.url + "/flush_cache", timeout=60).raise_for_status()
            policy = PolicyConfig(kv_events=arm != "text-inferred", max_retain_s=args.retain_s)
            config = RouterConfig(workers=tuple(WorkerSpec(w.url) for w in workers), policy=policy,
                                  reliability=ReliabilityConfig(health_interval_s=1.0, capacity_refresh_s=2.0))
            router = ServerThread(create_app(config)).start()
            try:
                time.sleep(3.0)  # the router subscribes and catches up
                results[arm] = summarize(run_arm(arm, router.url, args, workload))
            finally:
                router.stop(timeout_s=10)
            print(arm, json.dumps(results[arm]), flush=True)
    finally:
        for w in workers:
            w.stop()
    table = report_table(results)
    print(table)
    if str(args.out) != "-":
        _write(args, table)
    return 0


def report_table(results: dict[str, dict]) -> str:
    """The Markdown table with ratios to text-inferred."""
    base = results[ARMS[0]]
    lines = ["| arm | cache-hit share (all / resumed turns) | TTFT p50 / p99 (s), all turns | resumed-turn TTFT "
             "p50 / p99 (s) | resumed p99 vs text-inferred |", "|---|---|---|---|---|"]
    for arm, r in results.items():
        lines.append(f"| {arm} | {r['cache_hit_share']:.1%} / {r['resumed_hit_share']:.1%} | {r['ttft_p50_s']:.3f} / "
                     f"{r['ttft_p99_s']:.3f} | {r['resumed_ttft_p50_s']:.3f} / {r['resumed_ttft_p99_s']:.3f} | "
                     f"{r['resumed_ttft_p99_s'] / base['resumed_ttft_p99_s']:.2f}x |")
    return "\n".join(lines)


def _write(args: argparse.Namespace, table: str) -> None:
    text = (f"# `k3 bench kv-events`\n\nMeasured {datetime.date.today().isoformat()} on {_machine()} (no GPU; other "
            "engineers' jobs shared the cores, so compare the arms of one run, not runs).\n\n"
            f"Command: `k3 bench kv-events --sessions {args.sessions} --turns {args.turns} --burst {args.burst} "
            f"--pool-tokens {args.pool_tokens} --retain-s {args.retain_s:g} --seed {args.seed}`\n\n"
            + (__doc__.split("\n\n", 1)[1]) + "\n" + table + "\n\n"
            f"{args.sessions * args.turns} session turns per arm: a p99 is (nearly) the slowest turn.\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
