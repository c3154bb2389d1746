"""TTFT and TPOT of PD disaggregation vs one aggregated server, side by side in one run (loopback, CPU).

    python -m k3_sglang.tooling.router.pd_bench [--lengths 2048 16384] [--concurrency 1 8] [--new-tokens 32]
                                        [--repeats 2] [--json OUT.json]

Starts three `k3 serve` processes with the same flags (an aggregated one, a `--disaggregation-mode prefill`
and a `decode` one, KV over Mooncake TCP) and `k3 router --prefill URL PORT --decode URL` in front of the
pair. For every (prompt length, concurrency) cell it sends the same fresh random prompts, streamed and
greedy, to the aggregated server and through the router, alternating per repeat. TTFT is the time to
the first streamed chunk; TPOT is (last chunk - first chunk) / (tokens - 1). Medians over requests and
repeats. Each prompt is new (random ids, a fresh seed per cell and repeat), so no radix-cache hit helps.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from k3_sglang.net import free_port
from k3_sglang.serving.process import K3ServerProcess

VOCAB = 760  # ids the tiny checkpoint embeds


@dataclass(frozen=True)
class Sample:
    """One streamed request: seconds to the first chunk and per output token after it."""

    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class Cell:
    """Median TTFT/TPOT of one system at one (prompt length, concurrency)."""

    system: str
    length: int
    concurrency: int
    ttft_s: float
    tpot_s: float
    requests: int


def stream_one(url: str, ids: list[int], new_tokens: int) -> Sample:
    """POST /generate streamed and time the chunks (a chunk per decoded token at stream_interval 1)."""
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    started = time.perf_counter()
    stamps: list[float] = []
    with httpx.stream("POST", url + "/generate", json=body, timeout=1800) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data:") and line.strip() != "data: [DONE]":
                stamps.append(time.perf_counter())
    if not stamps:
        raise RuntimeError(f"{url}: no streamed chunk")
    ttft = stamps[0] - started
    tpot = (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1)
    return Sample(ttft, tpot)


def run_cell(url: str, length: int, concurrency: int, new_tokens: int, seed: int) -> list[Sample]:
    """`concurrency` fresh prompts of `length` tokens sent at once."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(VOCAB) for _ in range(length)] for _ in range(concurrency)]
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda ids: stream_one(url, ids, new_tokens), prompts))


def _median_cell(system: str, length: int, concurrency: int, samples: list[Sample]) -> Cell:
    return Cell(system, length, concurrency, statistics.median(s.ttft_s for s in samples),
                statistics.median(s.tpot_s for s in samples), len(samples))


def pd_timeouts_env(timeout_s: float) -> dict[str, str]:
    """SGLang's PD waits (decode for KV, prefill for decode's bootstrap) raised to `timeout_s`."""
    seconds = str(int(timeout_s))
    return {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": seconds, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": seconds}


def router_config_yaml(timeout_s: float) -> str:
    """The router's first-byte read timeout and backlog gate raised to `timeout_s` (both 300 s by default)."""
    return (f"reliability: {{read_timeout_s: {float(timeout_s)}}}\n"
            f"policy: {{max_predicted_ttft_s: {float(timeout_s)}}}\n")


def pool_problem(lengths: list[int], concurrency: list[int], new_tokens: int, max_total_tokens: int) -> str:
    """'' when the largest cell's requests fit the KV pool at once; else why not."""
    need = max(lengths) * max(concurrency) + max(concurrency) * new_tokens
    if need <= max_total_tokens:
        return ""
    return (f"--max-total-tokens {max_total_tokens} cannot hold {max(concurrency)} x ({max(lengths)} + {new_tokens}) "
            f"= {need} tokens at once (the decode server preallocates each request's KV)")


def _start_router(prefill: K3ServerProcess, bootstrap: int, decode: K3ServerProcess, log: Path, timeout_s: float):
    port = free_port()
    config = log.with_name("router.yaml")
    config.write_text(router_config_yaml(timeout_s))
    proc = subprocess.Popen([sys.executable, "-m", "k3_sglang.cli", "router", "--config", str(config),
                             "--prefill", prefill.url, str(bootstrap), "--decode", decode.url, "--port", str(port),
                             "--log-level", "warning"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readiness", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"k3 router did not become ready:\n{log.read_text()[-2000:]}")


def measure(args: argparse.Namespace, folder: Path) -> list[Cell]:
    """Start the three servers and the router, run every cell on both systems, stop everything."""
    common = ["--max-total-tokens", str(args.max_total_tokens), *args.serve_args]
    bootstrap = free_port()
    env = pd_timeouts_env(args.upstream_timeout_s)
    aggregated = K3ServerProcess(common, folder / "aggregated.log")
    prefill = K3ServerProcess(common + ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port",
                                        str(bootstrap)], folder / "prefill.log", env=env)
    decode = K3ServerProcess(common + ["--disaggregation-mode", "decode"], folder / "decode.log", env=env)
    servers, router = [aggregated, prefill, decode], None
    try:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda s: s.start(timeout_s=600), servers))
        router, pd_url = _start_router(prefill, bootstrap, decode, folder / "router.log", args.upstream_timeout_s)
        systems = {"aggregated": aggregated.url, "pd": pd_url}
        for name, url in systems.items():  # warm both paths (first-request compilation, Mooncake connect)
            run_cell(url, 256, 1, 4, seed=0)
        cells = []
        for length in args.lengths:
            for concurrency in args.concurrency:
                samples: dict[str, list[Sample]] = {name: [] for name in systems}
                failed = ""
                for repeat in range(args.repeats):
                    order = list(systems) if repeat % 2 == 0 else list(reversed(systems))
                    for name in order:
                        seed = length * 1000 + concurrency * 10 + repeat  # same prompts for both systems
                        try:
                            samples[name] += run_cell(systems[name], length, concurrency, args.new_tokens, seed)
                        except httpx.HTTPError as exc:  # reported, not averaged in; the run goes on
                            failed = f"{name}: {exc}"
                            print(f"{name:10s} L={length:6d} c={concurrency}: FAILED {exc} (logs: {folder})",
                                  flush=True)
                if failed:
                    continue
                for name in systems:
                    cell = _median_cell(name, length, concurrency, samples[name])
                    cells.append(cell)
                    print(f"{name:10s} L={length:6d} c={concurrency}: TTFT {cell.ttft_s * 1e3:9.1f} ms  "
                          f"TPOT {cell.tpot_s * 1e3:7.2f} ms", flush=True)
        return cells
    finally:
        if router is not None:
            router.terminate()
            router.wait(timeout=10)
        for server in servers:
            server.stop()


def markdown(cells: list[Cell]) -> str:
    """The side-by-side table: PD / aggregated ratios per cell."""
    rows = ["| prompt (tokens) | concurrency | TTFT aggregated (ms) | TTFT PD (ms) | PD/agg | "
            "TPOT aggregated (ms) | TPOT PD (ms) | PD/agg |", "|---|---|---|---|---|---|---|---|"]
    by_key = {(c.system, c.length, c.concurrency): c for c in cells}
    for (system, length, concurrency), agg in by_key.items():
        if system != "aggregated":
            continue
        pd = by_key[("pd", length, concurrency)]
        rows.append(f"| {length:,} | {concurrency} | {agg.ttft_s * 1e3:.0f} | {pd.ttft_s * 1e3:.0f} | "
                    f"{pd.ttft_s / agg.ttft_s:.2f} | {agg.tpot_s * 1e3:.1f} | {pd.tpot_s * 1e3:.1f} | "
                    f"{pd.tpot_s / agg.tpot_s:.2f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m k3_sglang.tooling.router.pd_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 16384])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-total-tokens", type=int, default=163840, help="KV pool of every server")
    parser.add_argument("--upstream-timeout-s", type=float, default=3600.0,
                        help="router read timeout, backlog gate and SGLang's PD waits (each 300 s by default)")
    parser.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[], help="more `k3 serve` flags (last)")
    parser.add_argument("--json", type=Path, help="write the cells here")
    parser.add_argument("--logs", type=Path, help="keep the server and router logs in this folder")
    args = parser.parse_args(argv)
    if min(args.lengths + args.concurrency + [args.new_tokens, args.repeats]) < 1 or args.new_tokens < 2:
        parser.error("lengths, concurrency and repeats must be positive, --new-tokens at least 2")
    too_small = pool_problem(args.lengths, args.concurrency, args.new_tokens, args.max_total_tokens)
    if too_small or args.upstream_timeout_s < 1:
        parser.error(too_small or "--upstream-timeout-s must be at least 1")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
        cells = measure(args, args.logs)
    else:
        with tempfile.TemporaryDirectory(prefix="k3-pd-bench-") as tmp:
            cells = measure(args, Path(tmp))
    print(f"\nMeasured {started} on {os.cpu_count()} cores, {platform.processor() or platform.machine()}; "
          f"1-min load average at the end: {os.getloadavg()[0]:.1f}")
    print(markdown(cells))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
