"""Loss of a router replica: two `k3 router` processes (same config, rendezvous homes) in front of two mock
workers, sessions driven by the official `openai` client with both base URLs (FailoverClient); replica A is
killed with SIGKILL mid-run. Every turn gets exactly one answer, and every session stays on one worker before and
after the kill. Bounded in time, loopback only."""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from k3_sglang.net import free_port
from k3_sglang.router.threaded import ServerThread
from k3_sglang.tooling.router.failover import FailoverClient, start_router, stop, wait_ready
from k3_sglang.tooling.router.mock_worker import MockState, create_mock_app

pytestmark = pytest.mark.timeout(120)
SESSIONS, TURNS = 16, 8


def test_a_replica_killed_mid_run_loses_no_turn_and_no_affinity(tmp_path):
    states = [MockState(name=f"w{i}", token_delay_s=0.002) for i in range(2)]
    workers = [ServerThread(create_mock_app(s)).start() for s in states]
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    routers = [start_router([w.url for w in workers], p, "--session-home", "rendezvous",
                            log_path=str(tmp_path / f"router{i}.log")) for i, p in enumerate(ports)]
    client = FailoverClient(urls, timeout_s=20)
    answers: dict[tuple[int, int], list[str]] = {}
    lock = threading.Lock()
    done_turns = [0]
    killed = threading.Event()
    try:
        for url, proc in zip(urls, routers):
            wait_ready(url, proc)

        def session(s: int) -> None:
            history = [{"role": "system", "content": "You are an agent."}]
            for t in range(TURNS):
                history.append({"role": "user", "content": f"session {s} turn {t}"})
                text, headers = client.chat(s + t, f"agent-{s}", history)  # turns alternate between replicas
                with lock:
                    answers.setdefault((s, t), []).append(headers["x-k3-worker"])
                    done_turns[0] += 1
                    if done_turns[0] >= SESSIONS * TURNS * 2 // 5 and not killed.is_set():
                        killed.set()
                        os.kill(routers[0].pid, signal.SIGKILL)  # replica A dies with requests in flight
                history.append({"role": "assistant", "content": text})

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(session, range(SESSIONS)))
    finally:
        client.close()
        for proc in routers:
            stop(proc)
        for w in workers:
            w.stop(timeout_s=5)
    assert killed.is_set() and routers[0].returncode == -signal.SIGKILL
    assert client.failovers > 0  # turns did reach the dead replica and moved over
    assert sorted(answers) == [(s, t) for s in range(SESSIONS) for t in range(TURNS)]
    assert all(len(v) == 1 for v in answers.values())  # one answer per turn
    for s in range(SESSIONS):
        homes = {answers[(s, t)][0] for t in range(TURNS)}
        assert len(homes) == 1, (s, [answers[(s, t)] for t in range(TURNS)])  # affinity across replicas and the kill
    # workers saw each session only on its home; a turn in flight through A at the kill may have reached it twice
    by_url = {w.url: st for w, st in zip(workers, states)}
    for s in range(SESSIONS):
        home = answers[(s, 0)][0]
        seen = by_url[home].sessions_seen.get(f"agent-{s}", 0)
        assert TURNS <= seen <= TURNS + 1
        assert all(st.sessions_seen.get(f"agent-{s}", 0) == 0 for url, st in by_url.items() if url != home)
    assert len({answers[(s, 0)][0] for s in range(SESSIONS)}) == 2  # sessions spread over both workers
