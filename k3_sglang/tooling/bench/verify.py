"""`k3 bench verify`: no-spec vs verify-all vs confidence-scheduled K3_CSV, concurrency 1 to 64, same run.

Arms (tiny K3 with `k3 serve` defaults, bf16, radix cache off, --max-running-requests 64, chain width --width):
A `k3 serve` without speculation; B `--speculative-algorithm K3_CSV` with K3_SPEC_VERIFY_MODE=static (verify every
drafted token); C the same with K3_SPEC_VERIFY_MODE=compact and the measured cost table (--cost-table, written by
`k3 bench profile-verify`). Workloads:
- controlled: the controlled drafter at K3-like acceptance (K3_SPEC_PROFILE, default mix: 30% math q=.86, 70% chat
  q=.64) replaying A's own greedy outputs, which an oracle pass on A writes first (K3_SPEC_ORACLE);
- agent: the default prompt-lookup drafter on prompts that re-quote code / tool-output spans;
- chat: the lookup drafter on non-repetitive random prompts.
At each concurrency c, c closed-loop workers each stream --requests-per-worker greedy requests back to back
(ignore_eos, --max-new-tokens, distinct prompts by input_ids, the same prompts for every arm); arms interleave
per round (A, B, C, A, B, C, ...). Reports decode and end-to-end tokens/s, ratios, accept length, C's fraction of
plain-decode steps, output identity across arms, the issue's goals; writes docs/bench-verify.md and a plot.
Output identity: in float32 (--dtype float32) every arm must emit A's tokens; in bf16 each mismatch's first
differing token is classified near tie or not by probing A's server (tooling/bench/output_identity.py). A mismatch
that is not excused fails the run (exit 1, after the report is written).
--pp-size N runs all three arms as N-stage pipelines (K3_CSV inside SGLang's PP relay, spec/pp_hooks.py).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import random
import tempfile
import threading
import time
from pathlib import Path

import httpx

from k3_sglang.tooling.bench.output_identity import failed
from k3_sglang.tooling.bench.verify_report import ARMS, CellRun, RequestResult, StepTotals

DOC = Path("docs/bench-verify.md")
DOC_SGLANG = Path("docs/bench-verify-sglang.md")
COST = Path("docs/verify-cost-cpu.json")
COST_SGLANG = Path("docs/verify-cost-cpu-sglang.json")
WORKLOADS = ("controlled", "agent", "chat")
VOCAB = 760  # token ids the tiny checkpoint embeds safely


# ---- prompts (pure) ----------------------------------------------------------------------------------------------

def chat_prompt(n: int, seed: int) -> list[int]:
    """n random token ids: nothing repeats on purpose (non-repetitive chat)."""
    rng = random.Random(seed)
    return [rng.randrange(0, VOCAB) for _ in range(n)]


def agent_prompt(n: int, seed: int) -> list[int]:
    """~n tokens re-quoting two 'code / tool output' spans (16-32 tokens each) between short fresh turns, ending
    inside a third quote of a span: what an agent's context looks like to prompt lookup."""
    rng = random.Random(seed)
    spans = [[rng.randrange(0, VOCAB) for _ in range(rng.randint(16, 32))] for _ in range(2)]
    out: list[int] = []
    i = 0
    while len(out) < n:
        out += [rng.randrange(0, VOCAB) for _ in range(rng.randint(4, 12))]  # a fresh turn
        out += spans[i % 2]
        i += 1
    tail = spans[i % 2]
    return out[:n] + tail[: max(4, len(tail) // 2)]


def build_prompts(workload: str, rounds: int, concurrency: list[int], per_worker: dict[int, int],
                  prompt_tokens: int) -> dict[tuple[int, int], list[list[int]]]:
    """prompts[(round, c)] = c * per_worker[c] distinct prompts, distinct across rounds, workloads and c."""
    make = agent_prompt if workload == "agent" else chat_prompt
    base = 1_000_000 * (WORKLOADS.index(workload) + 1)
    return {(r, c): [make(prompt_tokens, base + 10_000 * r + 100 * c + i) for i in range(c * per_worker[c])]
            for r in range(rounds) for c in concurrency}


def requests_per_worker(concurrency: list[int], min_requests: int) -> dict[int, int]:
    """Each of c workers sends ceil(min_requests / c) requests (at least 1), so small c still averages a few."""
    return {c: max(1, -(-min_requests // c)) for c in concurrency}


# ---- client --------------------------------------------------------------------------------------------------------

def stream_one(http: httpx.Client, url: str, key: str, ids: list[int], new_tokens: int) -> RequestResult:
    """One streamed greedy /generate by input_ids; RuntimeError on a non-200 answer or an empty stream."""
    from k3_sglang.tooling.bench.streaming import stream_chunks

    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    ttft, decode_s, chunks = stream_chunks(url, body, http=http)
    final = chunks[-1]
    n = final["meta_info"]["completion_tokens"]
    ids_out = final.get("output_ids", [])
    if len(ids_out) != n:  # incremental streaming: the chunks hold deltas
        ids_out = [t for ch in chunks for t in ch.get("output_ids", [])]
    return RequestResult(key, ttft, decode_s, tuple(ids_out), final["meta_info"].get("spec_accept_length"))


def run_cell(url: str, keyed: list[tuple[str, list[int]]], concurrency: int, new_tokens: int) -> tuple[float, list]:
    """c closed-loop workers over the keyed prompts (worker w takes every c-th), released together by a barrier,
    sharing one connection pool: (wall seconds from the release, results)."""
    from k3_sglang.tooling.bench.profile_verify import client

    gate = threading.Barrier(concurrency + 1)
    with client(concurrency) as http:
        def worker(w: int):
            gate.wait(timeout=120)
            return [stream_one(http, url, k, ids, new_tokens) for k, ids in keyed[w::concurrency]]

        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            futures = [pool.submit(worker, w) for w in range(concurrency)]
            gate.wait(timeout=120)
            t0 = time.perf_counter()
            results = [r for f in futures for r in f.result()]
            wall = time.perf_counter() - t0
    return wall, results


def _post_all(url: str, prompts: list[list[int]], new_tokens: int, parallel: int = 64) -> list[list[int]]:
    from k3_sglang.tooling.bench.profile_verify import client

    with client(parallel) as http:
        def one(ids):
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0,
                                                          "ignore_eos": True}}
            r = http.post(url + "/generate", json=body)
            if r.status_code != 200:
                raise RuntimeError(f"/generate answered {r.status_code}: {r.text[:300]}")
            return r.json()["output_ids"]

        with concurrent.futures.ThreadPoolExecutor(min(parallel, len(prompts))) as pool:
            return list(pool.map(one, prompts))


def _records(path: Path | None, mark: int) -> tuple[list[dict], int]:
    if path is None or not path.exists():
        return [], mark
    lines = path.read_text().splitlines()
    return [json.loads(x) for x in lines[mark:] if x.strip()], len(lines)


# ---- command -------------------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64], help="default 1 4 16 64")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds (medians; default 2)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per request (default 64)")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="prompt length (default 128)")
    parser.add_argument("--min-requests", type=int, default=4,
                        help="requests per cell at least (c workers x ceil(this / c) each; default 4)")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS, help="default all")
    parser.add_argument("--width", type=int, default=8, help="--speculative-num-draft-tokens of B and C (default 8)")
    parser.add_argument("--profile", default="mix", help="K3_SPEC_PROFILE of the controlled workload (default mix)")
    parser.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                        help="--dtype of every server (default: k3 serve's, bf16)")
    parser.add_argument("--model-impl", choices=("sglang",), default="sglang",
                        help="which K3 every arm serves (sglang: SGLang's own K3, the one model; default "
                             f"--cost-table {COST_SGLANG} and --out {DOC_SGLANG})")
    parser.add_argument("--cost-table", default=None,
                        help=f"C's cost table (default {COST_SGLANG})")
    parser.add_argument("--pp-size", type=int, default=1,
                        help="--pp-size of every arm (default 1; 2..4 runs the three arms as pipelines)")
    parser.add_argument("--out", default=None,
                        help=f"report (default {DOC_SGLANG}; '-': none)")


def check_args(args: argparse.Namespace) -> None:
    from k3_sglang.cli import CliError

    sglang = getattr(args, "model_impl", "sglang") == "sglang"  # the portable model (its tables: COST, DOC) retired
    if args.cost_table is None:
        args.cost_table = str(COST_SGLANG if sglang else COST)
    if args.out is None:
        args.out = str(DOC_SGLANG if sglang else DOC)
    if not 1 <= args.pp_size <= 4:
        raise CliError("--pp-size must be in 1..4")
    if sglang and args.pp_size > 2:
        raise CliError("--pp-size above 2 with SGLang's K3: it serves up to 2 stages on CPU")
    if min(args.concurrency) < 1 or max(args.concurrency) > 64 or len(set(args.concurrency)) != len(args.concurrency):
        raise CliError("--concurrency values must be distinct and in 1..64 (--max-running-requests 64)")
    if args.repeats < 1 or args.max_new_tokens < 4 or args.prompt_tokens < 16 or args.min_requests < 1:
        raise CliError("--repeats and --min-requests must be >= 1, --max-new-tokens >= 4, --prompt-tokens >= 16")
    if not 2 <= args.width <= 16:
        raise CliError("--width must be in 2..16")
    if not Path(args.cost_table).is_file():
        raise CliError(f"no cost table at {args.cost_table}: run `k3 bench profile-verify` first (it writes {args.cost_table}) or pass "
                       "--cost-table")
    try:
        from k3_sglang.spec.cost import load_cost

        load_cost(args.cost_table)
    except ValueError as exc:
        raise CliError(f"--cost-table: {exc}") from None


def _spec_env(mode: str, drafter: str, record: Path, args, oracle: Path | None) -> dict[str, str]:
    env = {"K3_SPEC_VERIFY_MODE": mode, "K3_SPEC_DRAFTER": drafter, "K3_SPEC_RECORD": str(record)}
    if mode == "compact":
        env["K3_SPEC_COST_TABLE"] = str(Path(args.cost_table).resolve())
    if drafter == "controlled":
        env.update(K3_SPEC_ORACLE=str(oracle), K3_SPEC_PROFILE=args.profile)
    return env


def run(args: argparse.Namespace) -> int:
    from k3_sglang.tooling.bench.verify_report import summarize_cell
    from k3_sglang.serving.process import K3ServerProcess

    from k3_sglang.tooling.bench.profile_verify import stop_servers_on_signals

    check_args(args)
    stop_servers_on_signals()
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="k3-bench-verify-"))
    conc = sorted(args.concurrency)
    per_worker = requests_per_worker(conc, args.min_requests)
    pool = max(32768, 2 * 64 * (args.prompt_tokens + 40 + args.max_new_tokens + args.width))
    flags = ["--disable-radix-cache", "--max-running-requests", "64", "--max-total-tokens", str(pool)]
    flags += ["--dtype", args.dtype] if args.dtype else []
    flags += ["--pp-size", str(args.pp_size)] if args.pp_size > 1 else []
    spec = ["--speculative-algorithm", "K3_CSV", "--speculative-num-draft-tokens", str(args.width)]
    prompts = {w: build_prompts(w, args.repeats, conc, per_worker, args.prompt_tokens) for w in args.workloads}
    warm = [chat_prompt(args.prompt_tokens, 99_000_000 + i) for i in range(4)]
    runs: dict[tuple[str, int, str], list[CellRun]] = {}
    outputs: dict[str, dict[str, tuple[int, ...]]] = {}
    servers: dict[str, K3ServerProcess] = {}
    records: dict[str, Path | None] = {"A": None}

    def start(arm: str, extra: list[str], env: dict[str, str], tag: str) -> None:
        servers[arm] = K3ServerProcess(flags + extra, work / f"serve-{arm}-{tag}.log", env=env).start(timeout_s=900)
        _post_all(servers[arm].url, warm, 8)

    def measure(workload: str) -> None:
        marks = {arm: _records(records[arm], 0)[1] for arm in ARMS}
        for r in range(args.repeats):
            for c in conc:
                keyed = [(f"{workload}/r{r}/c{c}/{i}", ids) for i, ids in enumerate(prompts[workload][(r, c)])]
                order = ARMS if r % 2 == 0 else ARMS[::-1]  # A,B,C then C,B,A: no arm always runs first
                for arm in order:
                    wall, results = run_cell(servers[arm].url, keyed, c, args.max_new_tokens)
                    recs, marks[arm] = _records(records[arm], marks[arm])
                    cell = CellRun(c, wall, tuple(results), StepTotals.of(recs))
                    runs.setdefault((workload, c, arm), []).append(cell)
                    for q in results:
                        outputs.setdefault(q.key, {})[arm] = q.output_ids
                    print(f"{workload} round {r + 1} c={c:>2} {arm}: decode {cell.decode_tps:8.1f} tok/s, "
                          f"e2e {cell.e2e_tps:8.1f} tok/s", flush=True)

    try:
        start("A", [], {}, "nospec")
        if "controlled" in args.workloads:
            oracle = work / "oracle.jsonl"
            keyed = [(f"controlled/r{r}/c{c}/{i}", ids) for (r, c), ps in prompts["controlled"].items()
                     for i, ids in enumerate(ps)]
            refs = _post_all(servers["A"].url, [ids for _, ids in keyed], args.max_new_tokens)
            warm_refs = _post_all(servers["A"].url, warm, 8)
            with oracle.open("w") as f:
                for ids, out in [*zip([ids for _, ids in keyed], refs), *zip(warm, warm_refs)]:
                    f.write(json.dumps({"input_ids": ids, "output_ids": out}) + "\n")
            for (key, _), out in zip(keyed, refs):
                outputs.setdefault(key, {})["oracle"] = tuple(out)
            for arm, mode in (("B", "static"), ("C", "compact")):
                records[arm] = work / f"steps-{arm}-controlled.jsonl"
                start(arm, spec, _spec_env(mode, "controlled", records[arm], args, oracle), "controlled")
            measure("controlled")
            for arm in ("B", "C"):
                servers.pop(arm).stop()
        lookup = [w for w in args.workloads if w != "controlled"]
        if lookup:
            for arm, mode in (("B", "static"), ("C", "compact")):
                records[arm] = work / f"steps-{arm}-lookup.jsonl"
                start(arm, spec, _spec_env(mode, "lookup", records[arm], args, None), "lookup")
            for w in lookup:
                measure(w)
        mismatches = explain_outputs(servers["A"].url, outputs, prompts, args.dtype or "bfloat16")
    finally:
        for s in servers.values():
            s.stop()
    (work / "outputs.json").write_text(json.dumps({k: {a: list(v) for a, v in d.items()} for k, d in outputs.items()}))
    cells = {k: summarize_cell(v) for k, v in runs.items()}
    from k3_sglang.tooling.bench.verify_report import write_report

    text = write_report(args, started, load_before, cells, outputs, conc, per_worker, work, mismatches)
    print(text)
    return 1 if failed(mismatches) else 0


def explain_outputs(url: str, outputs: dict, prompts: dict, dtype: str) -> list:
    """Every arm's (and the oracle pass's) greedy mismatch against A, classified at its first differing token by
    probing A's server (tooling/bench/output_identity.py)."""
    from k3_sglang.tooling.bench.output_identity import explain, server_vocab

    by_key = {f"{w}/r{r}/c{c}/{i}": ids for w, table in prompts.items() for (r, c), ps in table.items()
              for i, ids in enumerate(ps)}
    return explain(outputs, by_key, url, dtype, server_vocab(url))
