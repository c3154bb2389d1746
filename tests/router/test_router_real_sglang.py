"""Soak: concurrent multi-turn sessions through the router over two real `k3 serve` workers.

Every session shares one system prompt and sends no session key (identity comes from the prefix
index). Each session is first run alone, directly against a worker (each worker serving one session
at a time), for its greedy reference.
Then all sessions run at once through the router; after a share of the turns has finished, the
worker holding the most sessions is killed (SIGKILL). Every session must still finish every turn
with output identical to its solo run: no finished turn is lost and nothing is answered twice.

After the kill one worker holds every session, more than its running-request slots: the router runs
with `admission: queue`, so the excess waits in the router's bounded queue instead of getting 429.
The default run has a bounded variant (8 sessions x 3 turns); the full 64-session soak is `slow`.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time

import openai
import pytest

from k3_sglang.router.app import create_app, router_state
from k3_sglang.router.config import PolicyConfig, ReliabilityConfig, RouterConfig, WorkerSpec
from k3_sglang.router.threaded import ServerThread
from k3_sglang.serving.process import K3ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]
STARTUP_TIMEOUT_S = float(os.environ.get("K3_TEST_STARTUP_S", "400"))
SYSTEM = "You are a terse assistant in a routing soak test. Answer in a few words."
MAX_TOKENS = 6


def start_workers(tmp_path, count: int = 2) -> list[K3ServerProcess]:
    # One after the other: two first-run `k3 serve`s race on building the tiny checkpoint, and on a
    # 2-core box two SGLang servers starting at once have failed to come up.
    workers: list[K3ServerProcess] = []
    try:
        for i in range(count):
            worker = K3ServerProcess(["--dtype", "float32", "--max-total-tokens", "32768"], tmp_path / f"serve-{i}.log")
            workers.append(worker.start(timeout_s=STARTUP_TIMEOUT_S))
    except BaseException:
        for worker in workers:
            worker.stop()
        raise
    return workers


def kill(worker: K3ServerProcess) -> None:
    os.killpg(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait(timeout=30)


def user_turn(session: int, turn: int) -> str:
    return f"Session {session}, question {turn}: name a colour and a number near {session * 7 + turn}."


def run_session(client: openai.OpenAI, model: str, session: int, turns: int, on_turn=None,
                stream_last: bool = False, attempts: int = 1) -> list[str]:
    """Play one session turn by turn (history resent each time); returns the replies."""
    messages = [{"role": "system", "content": SYSTEM}]
    replies = []
    for turn in range(turns):
        messages.append({"role": "user", "content": user_turn(session, turn)})
        stream = stream_last and turn == turns - 1
        for attempt in range(attempts):
            try:
                if stream:
                    chunks = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS,
                                                            temperature=0, stream=True)
                    reply, worker = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), None
                else:
                    raw = client.chat.completions.with_raw_response.create(
                        model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0)
                    reply, worker = raw.parse().choices[0].message.content or "", raw.headers.get("x-k3-worker")
                break
            except (openai.APIStatusError, openai.APIConnectionError, openai.APIError):
                if attempt == attempts - 1:
                    raise
                time.sleep(1.0)  # a turn cut by the kill: the client asks again, as a real agent would
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply})
        if on_turn is not None:
            on_turn(session, turn, worker)
    return replies


def soak(tmp_path, sessions: int, turns: int, kill_share: float) -> None:
    workers = start_workers(tmp_path)
    try:
        direct = [openai.OpenAI(base_url=w.url + "/v1", api_key="unused", max_retries=0, timeout=300) for w in workers]
        model = direct[0].models.list().data[0].id

        def alone(worker: int) -> dict[int, list[str]]:  # each worker serves one session at a time
            return {s: run_session(direct[worker], model, s, turns, stream_last=s % 2 == 0)
                    for s in range(worker, sessions, len(workers))}

        with concurrent.futures.ThreadPoolExecutor(len(workers)) as pool:
            by_session = {k: v for part in pool.map(alone, range(len(workers))) for k, v in part.items()}
        solo = [by_session[s] for s in range(sessions)]

        reliability = ReliabilityConfig(health_interval_s=1.0, health_fail_threshold=2, read_timeout_s=300.0,
                                        connect_timeout_s=2.0, max_retries=2)
        policy = PolicyConfig(admission="queue", queue_max=4 * sessions, queue_timeout_s=240.0)
        app = create_app(RouterConfig(workers=tuple(WorkerSpec(w.url) for w in workers), policy=policy,
                                      reliability=reliability))
        with ServerThread(app) as router:
            core = router_state(app).core
            client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=300)
            lock, finished, homes, killed, killed_at = threading.Lock(), [0], {}, [], []
            kill_at = int(sessions * turns * kill_share)

            def on_turn(session: int, turn: int, worker: str | None) -> None:
                with lock:
                    finished[0] += 1
                    if worker is not None and not killed:
                        homes.setdefault(session, set()).add(worker)
                    if finished[0] == kill_at:
                        counts = {w.url: sum(r.worker_id == w.url for r in core.fleet.sessions.values())
                                  for w in workers}
                        victim = max(workers, key=lambda w: counts[w.url])
                        kill(victim)
                        killed.append(victim.url)
                        killed_at.append(time.monotonic())

            with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
                futures = [pool.submit(run_session, client, model, s, turns, on_turn, s % 2 == 0, 5)
                           for s in range(sessions)]
                routed = [f.result() for f in futures]

            assert killed, "the kill point was never reached"
            assert routed == solo  # every turn of every session, identical to the session run alone
            assert all(len(h) == 1 for h in homes.values())  # before the kill, each session stayed on one worker
            survivor = next(w.url for w in workers if w.url != killed[0])
            records = list(core.fleet.sessions.values())
            assert len(records) == sessions  # one router session per conversation despite the shared prompt
            # a session routed after the kill lives on the survivor; one whose every turn finished before
            # the kill never asked again, so the router had no reason to move it off the dead worker
            late = [r for r in records if r.last_seen > killed_at[0]]
            assert late and all(r.worker_id == survivor for r in late), [(r.worker_id, r.turns) for r in late]
            assert all(r.worker_id in (survivor, killed[0]) and r.turns == turns for r in records if r not in late)
            moved = [r for r in records if r.moves]
            assert moved and all(r.moves == 1 for r in moved)  # sessions of the dead worker moved once
            assert sum(r.turns for r in records) >= sessions * turns
            deadline = time.monotonic() + 10  # a stream's ticket closes just after the client read [DONE]
            while any(w.inflight_requests for w in core.fleet.workers.values()) and time.monotonic() < deadline:
                time.sleep(0.1)
            ledger = {w.worker_id: (w.inflight_requests, w.active_tokens) for w in core.fleet.workers.values()}
            assert all(v == (0, 0) for v in ledger.values()), ledger
    finally:
        for worker in workers:
            worker.stop()


@pytest.mark.slow  # about 4 min; tests/router/test_kv_events_real.py keeps two real workers in the default run
def test_bounded_soak_8_sessions_survive_a_worker_kill(tmp_path):
    soak(tmp_path, sessions=8, turns=3, kill_share=0.4)


@pytest.mark.slow
def test_soak_64_sessions_survive_a_worker_kill(tmp_path):
    soak(tmp_path, sessions=64, turns=4, kill_share=0.4)
