"""Proxy overhead of `k3 router` next to SMG on one mock worker (the measuring half of
`k3 bench router`; `k3_sglang/tooling/bench/router.py` runs it and writes the figures).

Targets, each a separate process on 127.0.0.1: the mock worker itself (`direct`), `k3 router` in
front of it (state_slots 64 so admission never refuses at concurrency 32: only the hop is
measured), and `smg launch --policy cache_aware` in front of it when SMG is installed. One
aiohttp client with a keep-alive session per target sends the same chat body to all of them:
- concurrency 1: each iteration sends one non-streamed and one streamed request to every target,
  in a shuffled order (the first 20 iterations are warm-up);
- concurrency 32: `rounds` rounds, the target order rotating; in each, every target gets 32 tasks x
  `per_task` requests non-streamed, then the same streamed. Throughput is requests / wall time.
Router CPU per request is the utime+stime of the router process (all threads) over the requests it
served. On a 2-core box the client, the worker and the router share the CPUs, so the concurrency-32
figures measure the router's CPU cost as much as its hop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
import orjson

from k3_sglang.net import free_port
from k3_sglang.tooling.router.replay import percentile

BODY = orjson.dumps({"model": "mock-k3", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 8})
STREAM_BODY = orjson.dumps({"model": "mock-k3", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 8,
                            "stream": True})
HEADERS = {"Content-Type": "application/json"}
WARMUP = 20
PROFILE_CATEGORIES = (  # (substring of the innermost frame's file, where the time goes)
    ("aiohttp/http_writer.py", "socket writes (the kernel's loopback TCP work runs inside send)"),
    ("aiohttp/web.py", "event loop in C (uvloop: epoll, socket reads, callbacks)"),
    ("asyncio/runners.py", "event loop in C (uvloop: epoll, socket reads, callbacks)"),
    ("k3_sglang/router/", "router code (identity, placement, ledger, relay)"),
    ("prometheus_client/", "metrics (prometheus_client)"),
    ("aiohttp/client", "upstream client (aiohttp ClientSession)"),
    ("aiohttp/connector.py", "upstream client (aiohttp ClientSession)"),
    ("aiohttp/payload.py", "upstream client (aiohttp ClientSession)"),
    ("aiohttp/web_", "HTTP server (aiohttp.web request/response objects)"),
    ("aiohttp/", "aiohttp shared (streams, helpers)"),
)


def find_smg(explicit: str) -> str | None:
    """The `smg` executable: `explicit`, else beside this Python, else on PATH."""
    if explicit:
        return explicit
    beside = Path(sys.executable).with_name("smg")
    return str(beside) if beside.exists() else shutil.which("smg")


def smg_version(path: str) -> str:
    """`smg --version` (e.g. "smg 1.13.0"), or the path when it does not say."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return out or path


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and all its threads."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _wait_ready(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                async with session.post(url + "/v1/chat/completions", data=BODY, headers=HEADERS) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not serve a chat request within {timeout_s:.0f} s")


async def _one(session: aiohttp.ClientSession, url: str, stream: bool) -> float:
    """Seconds to the whole answer (non-streamed) or to the first body chunk (streamed)."""
    started = time.perf_counter()
    async with session.post(url, data=STREAM_BODY if stream else BODY, headers=HEADERS) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: status {r.status}: {(await r.read())[:200]!r}")
        if not stream:
            await r.read()
            return time.perf_counter() - started
        await r.content.readany()
        elapsed = time.perf_counter() - started
        await r.read()
    return elapsed


async def _concurrency_1(urls: dict[str, str], iterations: int) -> dict[tuple[str, bool], list[float]]:
    samples: dict[tuple[str, bool], list[float]] = {(t, s): [] for t in urls for s in (False, True)}
    rng = random.Random(0)
    sessions = {t: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) for t in urls}
    try:
        for i in range(iterations + WARMUP):
            order = [(t, s) for t in urls for s in (False, True)]
            rng.shuffle(order)
            for target, stream in order:
                elapsed = await _one(sessions[target], urls[target] + "/v1/chat/completions", stream)
                if i >= WARMUP:
                    samples[(target, stream)].append(elapsed)
    finally:
        for session in sessions.values():
            await session.close()
    return samples


async def _burst(url: str, stream: bool, tasks: int, per_task: int) -> tuple[float, list[float]]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        latencies: list[float] = []

        async def task() -> None:
            for _ in range(per_task):
                latencies.append(await _one(session, url + "/v1/chat/completions", stream))

        await _one(session, url + "/v1/chat/completions", stream)  # open a connection first
        started = time.perf_counter()
        await asyncio.gather(*(task() for _ in range(tasks)))
        return time.perf_counter() - started, latencies


async def _concurrency_32(urls: dict[str, str], pids: dict[str, int], per_task: int, rounds: int) -> dict:
    out = {(t, s): {"rps": [], "lat": [], "cpu": 0.0, "n": 0} for t in urls for s in (False, True)}
    names = list(urls)
    for r in range(rounds):
        for target in names[r % len(names):] + names[:r % len(names)]:
            for stream in (False, True):
                cpu = cpu_seconds(pids[target]) if target in pids else 0.0
                elapsed, latencies = await _burst(urls[target], stream, 32, per_task)
                cell = out[(target, stream)]
                cell["rps"].append(len(latencies) / elapsed)
                cell["lat"] += latencies
                cell["n"] += len(latencies)
                if target in pids:
                    cell["cpu"] += cpu_seconds(pids[target]) - cpu
    return out


def _ms(values: list[float], q: float) -> float:
    return round(percentile(values, q) * 1e3, 3)


def _start(cmd: list[str], log) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def profile_summary(raw_path: str) -> tuple[list[tuple[str, float]], int]:
    """(share of py-spy samples per category of the innermost frame, samples) of `py-spy record -f raw` output."""
    counts: Counter[str] = Counter()
    for line in Path(raw_path).read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]
        category = next((c for key, c in PROFILE_CATEGORIES if key in leaf), "other Python (asyncio, stdlib)")
        counts[category] += int(n)
    total = sum(counts.values())
    return [(c, round(v / max(1, total), 3)) for c, v in counts.most_common()], total


async def _profile(url: str, pid: int, seconds: int, workdir: str) -> dict:
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists() and shutil.which("py-spy") is None:
        return {"error": "py-spy not found"}
    out = os.path.join(workdir, "k3-router.prof.txt")
    proc = subprocess.Popen([str(spy) if spy.exists() else "py-spy", "record", "-p", str(pid), "-d", str(int(seconds)),
                             "-r", "250", "-f", "raw", "-o", out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    await asyncio.sleep(1.0)
    deadline = time.monotonic() + seconds - 1.5
    while time.monotonic() < deadline:
        await _burst(url, False, 32, 10)
    _, err = await asyncio.to_thread(proc.communicate)
    if proc.returncode != 0 or not os.path.exists(out):
        return {"error": f"py-spy failed: {err.decode(errors='replace')[-300:]}"}
    categories, samples = profile_summary(out)
    return {"seconds": seconds, "samples": samples, "categories": categories}


def run_proxy_bench(c1_iterations: int, per_task: int, rounds: int, smg: str | None, profile: bool) -> dict:
    """Start the mock worker, k3 router and SMG; measure; stop them. `smg=None`: skip SMG."""
    smg_path = None if smg is None else find_smg(smg)
    ports = {name: free_port() for name in ("direct", "k3", "smg", "smg_metrics")}
    urls = {"direct": f"http://127.0.0.1:{ports['direct']}", "k3": f"http://127.0.0.1:{ports['k3']}"}
    procs: dict[str, subprocess.Popen] = {}
    with tempfile.TemporaryDirectory(prefix="k3-bench-router-") as workdir:
        log = open(os.path.join(workdir, "servers.log"), "w")
        config = os.path.join(workdir, "k3-1w.yaml")
        Path(config).write_text(f"workers:\n  - url: {urls['direct']}\n    state_slots: 64\n")
        try:
            procs["direct"] = _start([sys.executable, "-m", "k3_sglang.tooling.router.mock_worker", "--port",
                                      str(ports["direct"]), "--name", "w0"], log)
            asyncio.run(_wait_ready(urls["direct"]))
            procs["k3"] = _start([sys.executable, "-m", "k3_sglang.cli", "router", "--config", config, "--port",
                                  str(ports["k3"]), "--log-level", "warning"], log)
            if smg_path:
                urls["smg"] = f"http://127.0.0.1:{ports['smg']}"
                procs["smg"] = _start([smg_path, "launch", "--host", "127.0.0.1", "--port", str(ports["smg"]),
                                       "--worker-urls", urls["direct"], "--policy", "cache_aware",
                                       "--prometheus-host", "127.0.0.1", "--prometheus-port",
                                       str(ports["smg_metrics"]), "--log-level", "warn"], log)
            for name in ("k3", "smg"):
                if name in urls:
                    asyncio.run(_wait_ready(urls[name]))
            pids = {name: p.pid for name, p in procs.items() if name != "direct"}
            c1 = asyncio.run(_concurrency_1(urls, c1_iterations))
            c32 = asyncio.run(_concurrency_32(urls, pids, per_task, rounds))
            prof = asyncio.run(_profile(urls["k3"], pids["k3"], 10, workdir)) if profile else None
        finally:
            for proc in reversed(list(procs.values())):
                _stop(proc)
            log.close()
    return _figures(urls, c1, c32, c1_iterations, per_task, rounds, smg_path, prof)


def _figures(urls, c1, c32, c1_iterations, per_task, rounds, smg_path, prof) -> dict:
    figures: dict = {"targets": list(urls),
                     "smg": smg_version(smg_path) if smg_path else "not installed (pip install -e '.[bench]')",
                     "c1_iterations": c1_iterations, "c32_requests_per_cell": 32 * per_task * rounds,
                     "c1": {}, "c32": {}}
    for target in urls:
        direct_fast, direct_ttfb = c1[("direct", False)], c1[("direct", True)]
        row = {"p50_ms": _ms(c1[(target, False)], 50), "p99_ms": _ms(c1[(target, False)], 99),
               "ttfb_p50_ms": _ms(c1[(target, True)], 50), "ttfb_p99_ms": _ms(c1[(target, True)], 99)}
        if target != "direct":
            row["added_p50_ms"] = round(row["p50_ms"] - _ms(direct_fast, 50), 3)
            row["added_ttfb_p50_ms"] = round(row["ttfb_p50_ms"] - _ms(direct_ttfb, 50), 3)
        figures["c1"][target] = row
        fast, slow = c32[(target, False)], c32[(target, True)]
        cell = {"rps": round(sorted(fast["rps"])[len(fast["rps"]) // 2]),
                "p50_ms": _ms(fast["lat"], 50), "p99_ms": _ms(fast["lat"], 99),
                "stream_rps": round(sorted(slow["rps"])[len(slow["rps"]) // 2]),
                "ttfb_p50_ms": _ms(slow["lat"], 50), "ttfb_p99_ms": _ms(slow["lat"], 99)}
        if target != "direct":
            cell["cpu_ms_per_request"] = round((fast["cpu"] + slow["cpu"]) * 1e3 / (fast["n"] + slow["n"]), 3)
        figures["c32"][target] = cell
    for target in urls:
        if target != "direct":
            cell, direct = figures["c32"][target], figures["c32"]["direct"]
            cell["share_of_direct"] = round(cell["rps"] / direct["rps"], 3)
            cell["stream_share_of_direct"] = round(cell["stream_rps"] / direct["stream_rps"], 3)
    if prof is not None:
        figures["profile"] = prof
    return figures


def proxy_markdown(f: dict) -> str:
    """The proxy part of docs/router-bench.md."""
    routers = [t for t in f["targets"] if t != "direct"]
    lines = ["Proxy overhead, one mock worker, same run for every target (SMG: " + f["smg"] + ").\n",
             f"Concurrency 1 ({f['c1_iterations']} iterations after {WARMUP} warm-up; ms):\n",
             "| target | non-streamed p50 / p99 | added p50 | streamed TTFB p50 / p99 | added TTFB p50 |",
             "|---|---|---|---|---|"]
    for t in f["targets"]:
        r = f["c1"][t]
        lines.append(f"| {t} | {r['p50_ms']} / {r['p99_ms']} | {r.get('added_p50_ms', '-')} | "
                     f"{r['ttfb_p50_ms']} / {r['ttfb_p99_ms']} | {r.get('added_ttfb_p50_ms', '-')} |")
    lines += ["", f"Concurrency 32 ({f['c32_requests_per_cell']} requests per cell; throughput is the median "
              "round, req/s):\n",
              "| target | non-streamed req/s (share of direct) | p50 / p99 ms | streamed req/s (share) "
              "| TTFB p50 / p99 ms | router CPU ms/request |", "|---|---|---|---|---|---|"]
    for t in f["targets"]:
        c = f["c32"][t]
        share = f" ({c['share_of_direct']:.0%})" if "share_of_direct" in c else ""
        stream_share = f" ({c['stream_share_of_direct']:.0%})" if "stream_share_of_direct" in c else ""
        lines.append(f"| {t} | {c['rps']}{share} | {c['p50_ms']} / {c['p99_ms']} | {c['stream_rps']}{stream_share} "
                     f"| {c['ttfb_p50_ms']} / {c['ttfb_p99_ms']} | {c.get('cpu_ms_per_request', '-')} |")
    prof = f.get("profile")
    if prof and "categories" in prof:
        lines += ["", f"Profile of the k3 router at concurrency 32 (py-spy, {prof['samples']} samples over "
                  f"{prof['seconds']:.0f} s, by innermost frame):\n", "| where the time goes | share |", "|---|---|"]
        lines += [f"| {c} | {share:.1%} |" for c, share in prof["categories"]]
    elif prof:
        lines += ["", f"Profile: {prof['error']}"]
    return "\n".join(lines) + "\n"
