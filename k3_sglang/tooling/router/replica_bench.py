"""Throughput of one `k3 router` replica vs two (issue 41), with instant mock workers; part of `k3 bench router`.

Processes on 127.0.0.1: `workers` mock workers (no token delay), and two `k3 router` replicas in front of all of
them (same config, `--session-home rendezvous`), each pinned to its own core when the machine has two or more
(`os.sched_setaffinity`, as `taskset -c` would). The load generator is this process (aiohttp, 32 concurrent tasks
per replica under load, every request with its own `X-Session-Id` from a pool of 256 sessions, non-streamed):
- one replica: `rounds` bursts of 32 tasks x `per_task` requests to replica A alone;
- two replicas: the same bursts to A and B at once (64 tasks).
Throughput is requests / wall time of a burst (median round); router CPU per request is the utime+stime of the
replicas over the requests they served. The client and the mock workers share the cores with the replicas: on a
small or loaded machine the ratio measures that contention as much as the routers (the docs say what the machine
was doing).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile

import aiohttp
import orjson

from k3_sglang.net import free_port
from k3_sglang.tooling.router.proxy_bench import HEADERS, _start, _stop, _wait_ready, cpu_seconds


def _body(i: int) -> bytes:
    return orjson.dumps({"model": "default", "messages": [{"role": "user", "content": f"ping {i}"}], "max_tokens": 8})


async def _burst(urls: list[str], tasks_per_url: int, per_task: int) -> tuple[float, int]:
    """(wall seconds, requests) of `tasks_per_url` concurrent tasks per URL, each sending `per_task` requests."""
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def task(url: str, k: int) -> int:
            for i in range(per_task):
                sid = f"bench-{(k * per_task + i) % 256}"
                async with session.post(url + "/v1/chat/completions", data=_body(i),
                                        headers={**HEADERS, "X-Session-Id": sid}) as r:
                    if r.status != 200:
                        raise RuntimeError(f"{url}: status {r.status}: {(await r.read())[:200]!r}")
                    await r.read()
            return per_task

        for url in urls:  # warm a connection per replica
            async with session.post(url + "/v1/chat/completions", data=_body(0), headers=HEADERS) as r:
                await r.read()
        started = loop.time()
        done = await asyncio.gather(*(task(url, k) for url in urls for k in range(tasks_per_url)))
        return loop.time() - started, sum(done)


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def run_replica_bench(per_task: int = 25, rounds: int = 3, workers: int = 2) -> dict:
    """Start the mock workers and two replicas, measure one vs two, stop everything; the figures as a dict."""
    ports = [free_port() for _ in range(workers + 2)]
    worker_urls = [f"http://127.0.0.1:{p}" for p in ports[:workers]]
    router_urls = [f"http://127.0.0.1:{p}" for p in ports[workers:]]
    cores = sorted(os.sched_getaffinity(0))
    pinned = len(cores) >= 2
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="k3-bench-replicas-") as workdir:
        log = open(os.path.join(workdir, "servers.log"), "w")  # noqa: SIM115 - closed below
        try:
            for i, port in enumerate(ports[:workers]):
                procs.append(_start([sys.executable, "-m", "k3_sglang.tooling.router.mock_worker", "--port", str(port),
                                     "--name", f"w{i}"], log))
            for url in worker_urls:
                asyncio.run(_wait_ready(url))
            config = os.path.join(workdir, "replica.yaml")
            with open(config, "w") as fh:
                fh.write("workers:\n" + "".join(f"  - url: {u}\n    state_slots: 256\n" for u in worker_urls))
            routers = []
            for i, port in enumerate(ports[workers:]):
                proc = _start([sys.executable, "-m", "k3_sglang.cli", "router", "--config", config, "--port", str(port),
                               "--session-home", "rendezvous", "--log-level", "warning"], log)
                if pinned:
                    os.sched_setaffinity(proc.pid, {cores[i % len(cores)]})
                procs.append(proc)
                routers.append(proc)
            for url in router_urls:
                asyncio.run(_wait_ready(url))
            figures = {"workers": workers, "pinned_cores": pinned, "requests_per_cell": 32 * per_task * rounds}
            for name, urls in (("one", router_urls[:1]), ("two", router_urls)):
                served = routers[:len(urls)]
                cpu = sum(cpu_seconds(p.pid) for p in served)
                rates, total = [], 0
                for _ in range(rounds):
                    seconds, n = asyncio.run(_burst(urls, 32, per_task))
                    rates.append(n / seconds)
                    total += n
                cpu = sum(cpu_seconds(p.pid) for p in served) - cpu
                figures[name] = {"rps": round(_median(rates)), "cpu_ms_per_request": round(cpu * 1e3 / total, 3)}
            figures["two_over_one"] = round(figures["two"]["rps"] / figures["one"]["rps"], 2)
            figures["load_average"] = round(os.getloadavg()[0], 2)
        finally:
            for proc in reversed(procs):
                _stop(proc)
            log.close()
    return figures


def replica_markdown(f: dict) -> str:
    """The replicas part of docs/router-bench.md."""
    pin = "each replica pinned to its own core" if f["pinned_cores"] else "not pinned (one core)"
    return (f"Router replicas ({f['workers']} instant mock workers, `--session-home rendezvous`, {pin}; "
            f"{f['requests_per_cell']} requests per cell, median round; load average {f['load_average']} at the end):\n\n"
            "| replicas | req/s | router CPU ms/request |\n|---|---|---|\n"
            f"| one | {f['one']['rps']} | {f['one']['cpu_ms_per_request']} |\n"
            f"| two | {f['two']['rps']} ({f['two_over_one']}x of one; goal >= 1.8x) | {f['two']['cpu_ms_per_request']} |\n")
