"""`k3 bench dcp`: decode with the MLA KV striped over DCP ranks against the same ranks without DCP.

SGLang's own K3 on the k3_dcp_mla backend in both arms (the portable model's last figures stay in the report's
history), two servers of the tiny K3 (bf16, `k3 serve` defaults), both TP2 on the two cores so
that only DCP differs:
`dcp1` (--tp-size 2: every rank holds every token's latent row) and `dcp2` (--tp-size 2 --dcp-size 2: token p on
rank p mod 2). At each context length, in rounds alternating the servers, one fresh prompt is prefilled and
--decode-tokens generated; reported per server (medians over rounds):
- decode step time (streamed tokens after the first, wall clock);
- KV rows read per rank per MLA decode call, counted from the rows each rank's attention kernel was handed
  (K3_KV_READ_TRACE, k3_sglang/dcp_mla/kv_read_trace.py; the k3_dcp_mla and k3_cpu_mla backends write it), and the bytes they hold;
- logical KV capacity from each server's /get_server_info on the same per-rank pool (--max-total-tokens).
Writes docs/bench-dcp.md.
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx

DOC = Path("docs/bench-dcp.md")


@dataclass(frozen=True)
class DcpConfig:
    name: str
    dcp: int
    tp: int = 2


CONFIGS = (DcpConfig("dcp1", 1), DcpConfig("dcp2", 2))
# model -> (server environment, extra flags): SGLang's K3 runs k3_dcp_mla in both arms (on CPU it would take
# k3_cpu_mla without DCP), so the same kernel reads the KV and only the striping differs
MODELS = {"sglang": ({}, ["--attention-backend", "k3_dcp_mla"])}  # the portable model retired


@dataclass
class Cell:
    """Measurements of one server at one context length (one entry per round)."""

    step_ms: list[float] = field(default_factory=list)
    rows_per_rank: list[list[float]] = field(default_factory=list)  # per round: rows / decode call, per rank


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384, 32768, 65536],
                        help="context lengths (prompt tokens) to decode at")
    parser.add_argument("--decode-tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--repeats", type=int, default=2, help="rounds (medians are reported)")
    parser.add_argument("--pool-tokens", type=int, default=131072, help="--max-total-tokens per rank (both servers)")
    parser.add_argument("--model-impl", choices=("sglang",), default="sglang",
                        help="which K3 model serves: SGLang's own K3 (the portable model retired)")
    parser.add_argument("--out", default=str(DOC), help="report (default docs/bench-dcp.md; '-': none)")


def _decode_rows(trace_dir: Path, tp: int, marks: list[int]) -> tuple[list[float], list[int]]:
    """Mean rows per decode call on each rank since line marks[r], and the new line counts."""
    from k3_sglang.dcp_mla.kv_read_trace import read_rows

    per_rank, new_marks = [], []
    for r in range(tp):
        path = trace_dir / f"rank{r}.txt"
        records = read_rows(path, marks[r])
        decode = [rows for mode, rows in records if mode == "decode"]
        per_rank.append(statistics.mean(decode) if decode else 0.0)
        new_marks.append(marks[r] + len(records))
    return per_rank, new_marks


def run(args: argparse.Namespace) -> int:
    from k3_sglang.cli import CliError

    if min(args.contexts) < 64 or args.decode_tokens < 2 or args.repeats < 1:
        raise CliError("--contexts must be >= 64 tokens, --decode-tokens >= 2 and --repeats >= 1")
    if max(args.contexts) + args.decode_tokens + 64 > args.pool_tokens:
        raise CliError(f"--pool-tokens {args.pool_tokens} must hold the longest context plus the decoded tokens")
    from k3_sglang.tooling.bench.dcp_report import summarize, write_report

    started = datetime.datetime.now(datetime.timezone.utc)
    models = [args.model_impl]
    summaries = {}
    for model in models:
        cells, capacity = _measure(args, model)
        summaries[model] = summarize(cells, args.contexts, capacity)
        print(f"## {model}\n{summaries[model]}", flush=True)
    if str(args.out) != "-":
        write_report(Path(args.out), started, args, summaries)
    return 0


def _measure(args: argparse.Namespace, model: str) -> tuple[dict, dict[str, int]]:
    """Start the two servers of `model`, decode in alternating rounds; (cells, logical KV tokens per server)."""
    from k3_sglang.tooling.bench.long_context import _one, _prompt
    from k3_sglang.dcp_mla.kv_read_trace import ENV
    from k3_sglang.serving.process import K3ServerProcess

    env, extra = MODELS[model]
    work = Path(tempfile.mkdtemp(prefix=f"k3-bench-dcp-{model}-"))
    servers, capacity = {}, {}
    cells = {(c.name, n): Cell() for c in CONFIGS for n in args.contexts}
    try:
        for c in CONFIGS:
            trace = work / f"trace-{c.name}"
            flags = ["--tp-size", str(c.tp), "--max-total-tokens", str(args.pool_tokens), *extra]
            if c.dcp > 1:
                flags += ["--dcp-size", str(c.dcp)]
            servers[c.name] = K3ServerProcess(flags, work / f"serve-{c.name}.log",
                                              env={**env, ENV: str(trace)}).start(timeout_s=900)
            info = httpx.get(servers[c.name].url + "/get_server_info", timeout=30).json()
            capacity[c.name] = int(info["max_total_num_tokens"])
            _one(servers[c.name].url, _prompt(256, 1), 4)  # warm-up
        marks = {c.name: [0] * c.tp for c in CONFIGS}
        for r in range(args.repeats):
            for i, n in enumerate(args.contexts):
                ids = _prompt(n, 7000 + 100 * r + i)  # the same prompt for both servers
                for c in CONFIGS:
                    _, marks[c.name] = _decode_rows(work / f"trace-{c.name}", c.tp, marks[c.name])
                    _, tps = _one(servers[c.name].url, ids, args.decode_tokens)
                    rows, marks[c.name] = _decode_rows(work / f"trace-{c.name}", c.tp, marks[c.name])
                    if not any(rows):
                        raise RuntimeError(f"{model} {c.name}: no decode rows traced (is {ENV} written?)")
                    cell = cells[(c.name, n)]
                    cell.step_ms.append(1000.0 / tps)
                    cell.rows_per_rank.append(rows)
                    print(f"{model} round {r + 1} {n:>6} tokens {c.name}: decode step {1000 / tps:7.1f} ms, KV rows "
                          f"read per rank per MLA call {', '.join(f'{x:.0f}' for x in rows)}", flush=True)
    finally:
        for s in servers.values():
            s.stop()
    return cells, capacity
