"""Router replicas in front of two real `k3 serve` workers (tiny K3 on CPU), end to end (issue 41).

Two `k3 router` processes with the same config (default score placement: a session unknown to a replica gets
its home from the workers' KV events); sessions sent with the official `openai` client with both base URLs and the
README's `"model": "default"`, each turn to the other replica than the last. Every turn of a session lands on one
worker and, from the second on, resumes its context there (`cached_tokens` > 0); then replica A is killed (SIGKILL)
and the remaining turns, all through B, keep the same workers. Slow tier (two worker starts).
"""

from __future__ import annotations

import os
import signal

import pytest

from k3_sglang.net import free_port
from k3_sglang.serving.process import K3ServerProcess
from k3_sglang.tooling.router.failover import FailoverClient, start_router, stop, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]
STARTUP_TIMEOUT_S = float(os.environ.get("K3_TEST_STARTUP_S", "400"))
WORKER_ARGS = ["--dtype", "float32", "--max-total-tokens", "4096", "--max-running-requests", "4",
               "--chunked-prefill-size", "64", "--enable-cache-report",  # usage.prompt_tokens_details
               "--mamba-max-states-per-path", "-1"]  # a KDA state (and its checkpoint event) at every chunk
SESSIONS, TURNS, KILL_AFTER = 4, 4, 2


def test_replicas_keep_sessions_on_their_workers_across_replicas_and_a_kill(tmp_path):
    workers: list[K3ServerProcess] = []
    routers = []
    client = None
    try:
        for i in range(2):
            workers.append(K3ServerProcess(WORKER_ARGS, tmp_path / f"serve-{i}.log").start(timeout_s=STARTUP_TIMEOUT_S))
        ports = [free_port(), free_port()]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        routers = [start_router([w.url for w in workers], p, log_path=str(tmp_path / f"router-{i}.log"))
                   for i, p in enumerate(ports)]
        for url, proc in zip(urls, routers):
            wait_ready(url, proc, timeout_s=120)
        client = FailoverClient(urls, timeout_s=300)
        histories = {s: [{"role": "system", "content": "You are a terse agent that counts things."}]
                     for s in range(SESSIONS)}
        homes: dict[int, list[str]] = {s: [] for s in range(SESSIONS)}
        cached: dict[int, list[int]] = {s: [] for s in range(SESSIONS)}
        for t in range(TURNS):
            if t == KILL_AFTER:
                os.kill(routers[0].pid, signal.SIGKILL)
                routers[0].wait(10)
            for s in range(SESSIONS):
                history = histories[s]
                history.append({"role": "user", "content": f"Session {s}, step {t}: count the words in this line."})
                raw = client.clients[(s + t) % 2 if t < KILL_AFTER else 1]
                response = raw.chat.completions.with_raw_response.create(
                    model="default", messages=history, max_tokens=8, temperature=0,
                    extra_headers={"X-Session-Id": f"agent-{s}"})
                body = response.parse()
                homes[s].append(response.headers["x-k3-worker"])
                details = body.usage.prompt_tokens_details
                cached[s].append(getattr(details, "cached_tokens", 0) or 0 if details else 0)
                history.append({"role": "assistant", "content": body.choices[0].message.content})
        # the same worker from both replicas, before and after the kill; each later turn resumed its context there
        assert all(len(set(homes[s])) == 1 for s in range(SESSIONS)), homes
        assert all(c > 0 for s in range(SESSIONS) for c in cached[s][1:]), cached
        assert len({homes[s][0] for s in range(SESSIONS)}) == 2, homes  # placed by load: both workers used
        assert routers[0].returncode == -signal.SIGKILL
    finally:
        if client is not None:
            client.close()
        for proc in routers:
            stop(proc)
        for worker in workers:
            worker.stop()
