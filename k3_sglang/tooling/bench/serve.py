"""`k3 bench serve`: cold start to ready, batch-1 decode rate, 32-way throughput of `k3 serve`.

Starts the embedded default (tiny K3, real SGLang on CPU) on a free loopback port, measures,
stops it, prints a table and writes docs/bench-serve.md. Batch 1 and batch N are measured in
the same run on the same server, so the ratio is meaningful on a noisy machine.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from k3_sglang.tooling.bench.streaming import stream_generate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", type=Path, default=None, help="checkpoint (default: the tiny K3)")
    parser.add_argument("--concurrency", type=int, default=32, help="parallel requests for the throughput run")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens per request")
    parser.add_argument("--repeats", type=int, default=3, help="alternating 1x / Nx rounds; medians are reported")
    parser.add_argument("--out", type=Path, default=None,
                        help="report file ('-' for none; default docs/bench-serve.md)")
    parser.add_argument("serve_args", nargs="*", help="extra `k3 serve` args, after --")


def _stream_decode(url: str, new_tokens: int) -> tuple[float, float, int]:
    """One streamed greedy request: (time to first token, decode seconds after it, tokens)."""
    body = {"text": "The quick brown fox",
            "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    return stream_generate(url, body, timeout_s=600)


def _throughput(url: str, concurrency: int, new_tokens: int) -> float:
    body = {"text": "Write a story about a fox.", "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}

    def one(_):
        resp = httpx.post(url + "/generate", json=body, timeout=900)
        resp.raise_for_status()
        return resp.json()["meta_info"]["completion_tokens"]

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        total = sum(pool.map(one, range(concurrency)))
    return total / (time.perf_counter() - start)


def _machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor() or "unknown CPU")
    return f"{os.cpu_count()} cores, {cpu}"


def run(args: argparse.Namespace) -> int:
    from k3_sglang.serving.process import K3ServerProcess

    if args.concurrency < 1 or args.new_tokens < 2 or args.repeats < 1:
        from k3_sglang.cli import CliError

        raise CliError("--concurrency and --repeats must be >= 1 and --new-tokens >= 2")
    args.out = args.out or Path("docs/bench-serve.md")
    serve_args = (["--model-path", str(args.model_path)] if args.model_path else []) + list(args.serve_args)
    log = Path(tempfile.mkdtemp(prefix="k3-bench-")) / "serve.log"
    t0 = time.perf_counter()
    with K3ServerProcess(serve_args, log) as server:
        cold_start = time.perf_counter() - t0
        _stream_decode(server.url, 8)  # warm-up
        ttft, decode_s, tokens = _stream_decode(server.url, args.new_tokens)
        batch1_tps = (tokens - 1) / decode_s
        singles, manys = [], []
        for _ in range(args.repeats):  # alternate so drift on a shared machine hits both alike
            singles.append(_throughput(server.url, 1, args.new_tokens))
            manys.append(_throughput(server.url, args.concurrency, args.new_tokens))
        single, many = statistics.median(singles), statistics.median(manys)
    rows = {
        "cold start to ready (s)": f"{cold_start:.1f}",
        "batch-1 time to first token (ms)": f"{ttft * 1e3:.0f}",
        "batch-1 decode (tok/s)": f"{batch1_tps:.1f}",
        "1 request, end to end (tok/s)": f"{single:.1f}",
        f"{args.concurrency} concurrent, end to end (tok/s)": f"{many:.1f}",
        f"throughput ratio {args.concurrency}x / 1x": f"{many / single:.2f}",
    }
    width = max(map(len, rows))
    table = "\n".join(f"| {k.ljust(width)} | {v} |" for k, v in rows.items())
    print(table)
    if str(args.out) != "-":
        _write_report(args, table)
    return 0


def _write_report(args: argparse.Namespace, table: str) -> None:
    today = datetime.date.today().isoformat()
    text = (f"# `k3 bench serve`\n\nMeasured {today} on {_machine()}.\n\n"
            f"Command: `k3 bench serve --concurrency {args.concurrency} --new-tokens {args.new_tokens} --repeats {args.repeats}`"
            f"{' -- ' + ' '.join(args.serve_args) if args.serve_args else ''}\n\n"
            "Model: the embedded default unless stated (tiny K3, bf16, served by SGLang 0.5.23 on CPU through the\n"
            "k3_cpu platform plugin). Batch 1 and batch N run on the same server in the same run, alternating;\n"
            "the end-to-end rows are medians over the rounds. Goals (issue 2): batch-1 decode >= 50 tok/s,\n"
            "32-way throughput >= 8x batch 1.\n\n"
            f"| measure | value |\n|---|---|\n{table}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
