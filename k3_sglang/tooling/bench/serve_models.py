"""`k3 bench serve --model-impl compare`: SGLang's own K3 against the portable model on CPU, same prompts, same run.

Both models serve the same checkpoint from two `k3 serve` processes (K3_MODEL_IMPL=sglang and =portable) that stay up
for the whole run; each round measures one model then the other on identical requests, so drift on a shared machine
hits both alike, and the report gives medians and the ratio portable / SGLang's K3 for:
- prefill tokens/s of a fresh 2K-token prompt (time to the first token of a 1-token request, no cache hit);
- decode tokens/s of one streamed request (batch 1);
- aggregate decode tokens/s of 16 concurrent streamed requests (batch 16).
With --profile, py-spy samples SGLang's K3 scheduler during its batch-1 and batch-16 decode and the report lists
where its time goes.
"""
from __future__ import annotations

import concurrent.futures
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from k3_sglang.tooling.bench.streaming import stream_chunks

MODELS = ("sglang", "portable")


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 760, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def prefill_tps(url: str, ids: list[int]) -> float:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    ttft, _, _ = stream_chunks(url, body, timeout_s=900)
    return len(ids) / ttft


def _decode(url: str, ids: list[int], new_tokens: int) -> tuple[float, float, int]:
    """(first-token time, last-token time, tokens) of one streamed greedy request, times from perf_counter."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    start = time.perf_counter()
    ttft, decode_s, chunks = stream_chunks(url, body, timeout_s=900)
    return start + ttft, start + ttft + decode_s, chunks[-1]["meta_info"]["completion_tokens"]


def decode_tps(url: str, prompts: list[list[int]], new_tokens: int) -> float:
    """Aggregate decode tokens/s of len(prompts) concurrent streamed requests: the tokens after each request's first
    token, over the span from the earliest first token to the last token of any request."""
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        runs = list(pool.map(lambda ids: _decode(url, ids, new_tokens), prompts))
    start = min(first for first, _, _ in runs)
    end = max(last for _, last, _ in runs)
    return sum(n - 1 for _, _, n in runs) / max(end - start, 1e-9)


def scheduler_pid(server) -> int | None:
    import psutil

    for child in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            if "scheduler" in " ".join(child.cmdline()) or "scheduler" in child.name():
                return child.pid
        except psutil.Error:
            continue
    return None


class Profiler:
    """py-spy on one process while a phase runs; `top(n)` gives the busiest leaf frames and SGLang-layer rollups."""

    def __init__(self, pid: int | None, out_dir: Path):
        self.pid, self.out_dir, self.files = pid, out_dir, []

    def run(self, name: str, seconds: float, work):
        if self.pid is None:
            return work()
        out = self.out_dir / f"{name}.txt"
        spy = subprocess.Popen([_py_spy(), "record", "-p", str(self.pid), "-d", str(int(seconds)), "-r", "100", "-f",
                                "raw", "-o", str(out), "--nonblocking"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        try:
            return work()
        finally:
            spy.wait(timeout=seconds + 60)
            if out.exists():
                self.files.append(out)

    def top(self, n: int = 14) -> list[tuple[str, float]]:
        leaves: Counter[str] = Counter()
        total = 0
        for path in self.files:
            for line in path.read_text().splitlines():
                stack, _, count = line.rpartition(" ")
                if not stack or not count.isdigit():
                    continue
                total += int(count)
                leaves[_frame(stack.split(";")[-1])] += int(count)
        return [(frame, 100.0 * c / total) for frame, c in leaves.most_common(n)] if total else []


def _py_spy() -> str:
    import shutil
    import sys

    return shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


REPO_ROOT = str(Path(__file__).resolve().parents[3])  # this checkout: frames of kernels/ and parallel/ shown relative


def _frame(raw: str) -> str:
    name, _, where = raw.partition(" (")
    where = where.rstrip(")")
    for root in ("site-packages/", f"{REPO_ROOT}/", "k3_sglang/"):
        if root in where:
            where = where.split(root, 1)[1]
    return f"{name} ({where.rsplit(':', 1)[0]})"


def measure(servers: dict[str, object], prefill_tokens: int, new_tokens: int, batch: int, repeats: int,
            profiler: Profiler | None) -> dict[str, dict[str, list[float]]]:
    """Rounds of (prefill, batch-1 decode, batch-N decode) on every model, the same prompts for each model."""
    results = {m: {"prefill": [], "decode1": [], "decodeN": []} for m in servers}
    for r in range(repeats):
        long_prompt = _prompt(prefill_tokens, 1000 + r)
        one = [_prompt(64, 2000 + r)]
        many = [_prompt(64, 3000 + 100 * r + i) for i in range(batch)]
        for model, server in servers.items():
            url = server.url
            results[model]["prefill"].append(prefill_tps(url, long_prompt))
            spy = profiler if (profiler and model == "sglang" and r == repeats - 1) else None
            d1 = (spy.run("decode1", 20, lambda: decode_tps(url, one, new_tokens)) if spy
                  else decode_tps(url, one, new_tokens))
            dn = (spy.run("decodeN", 20, lambda: decode_tps(url, many, new_tokens)) if spy
                  else decode_tps(url, many, new_tokens))
            results[model]["decode1"].append(d1)
            results[model]["decodeN"].append(dn)
    return results


def run_compare(args) -> int:
    from k3_sglang.serving.process import K3ServerProcess

    serve_args = (["--model-path", str(args.model_path)] if args.model_path else []) + list(args.serve_args)
    tmp = Path(tempfile.mkdtemp(prefix="k3-bench-models-"))
    servers = {m: K3ServerProcess(serve_args, tmp / f"{m}.log", env={"K3_MODEL_IMPL": m}) for m in MODELS}
    try:
        for server in servers.values():
            server.start(timeout_s=600)
        for server in servers.values():  # warm-up: first-use compilation and allocations
            decode_tps(server.url, [_prompt(32, 7)], 8)
            prefill_tps(server.url, _prompt(256, 8))
        profiler = Profiler(scheduler_pid(servers["sglang"]), tmp) if args.profile else None
        results = measure(servers, args.prefill_tokens, args.new_tokens, args.batch, args.repeats, profiler)
    finally:
        for server in servers.values():
            server.stop()
    from k3_sglang.tooling.bench.serve_models_report import report

    text = report(args, results, profiler.top() if profiler else [])
    print(text)
    if str(args.out) != "-":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}")
    return 0


def medians(results: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    return {m: {k: statistics.median(v) for k, v in per.items()} for m, per in results.items()}
