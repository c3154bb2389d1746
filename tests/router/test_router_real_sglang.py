"""The router in front of two real SGLang workers started with `k3 serve` (tiny K3 on CPU).

A multi-turn session stays on one worker; killing that worker moves the session (a clean error
or a transparent retry, nothing hung). Skipped only while `k3 serve` (k3_sglang.serving.cli) does
not exist yet.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from k3_sglang.router.app import create_app
from k3_sglang.router.config import ReliabilityConfig, RouterConfig, WorkerSpec
from k3_sglang.router.threaded import ServerThread, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
STARTUP_TIMEOUT_S = 240.0


def _serve_available() -> bool:
    try:
        return importlib.util.find_spec("k3_sglang.serving.cli") is not None
    except ModuleNotFoundError:
        return False


def _wait_healthy(procs, logs, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = dict(procs)
    while pending and time.monotonic() < deadline:
        for port, proc in list(pending.items()):
            if proc.poll() is not None:
                pytest.fail(f"k3 serve on {port} exited with {proc.returncode}:\n{logs[port].read_text()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    del pending[port]
            except httpx.HTTPError:
                pass
        time.sleep(1.0)
    if pending:
        tails = "\n".join(logs[p].read_text()[-2000:] for p in pending)
        pytest.fail(f"k3 serve not healthy within {timeout_s:.0f} s on ports {list(pending)}:\n{tails}")


@pytest.fixture
def two_sglang_workers(tmp_path):
    if not _serve_available():
        pytest.skip("`k3 serve` (k3_sglang.serving.cli) is not built yet")
    procs, logs = {}, {}
    try:
        # One after the other: two first-run `k3 serve`s race on building the tiny checkpoint, and
        # on this 2-core box two SGLang servers starting at once have also failed to come up.
        for _ in range(2):
            port = free_port()
            logs[port] = tmp_path / f"serve-{port}.log"
            procs[port] = subprocess.Popen(
                [sys.executable, "-m", "k3_sglang.cli", "serve", "--port", str(port), "--max-total-tokens", "4096"],
                stdout=logs[port].open("w"), stderr=subprocess.STDOUT, start_new_session=True,
            )
            _wait_healthy({port: procs[port]}, logs, STARTUP_TIMEOUT_S)
        yield procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_session_sticks_then_moves_when_its_worker_dies(two_sglang_workers):
    procs = two_sglang_workers
    urls = [f"http://127.0.0.1:{port}" for port in procs]
    reliability = ReliabilityConfig(health_interval_s=1.0, health_fail_threshold=2, read_timeout_s=120.0,
                                    connect_timeout_s=2.0, max_retries=1)
    config = RouterConfig(workers=tuple(WorkerSpec(u) for u in urls), reliability=reliability)
    app = create_app(config)
    with ServerThread(app) as router:
        core = app.state.router.core
        assert all(w.kv_capacity == 4096 for w in core.fleet.workers.values())  # read from /get_server_info
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=180)
        model = client.models.list().data[0].id
        messages = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Say hi."}]
        homes = []
        for i in range(3):
            raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=4)
            homes.append(raw.headers["x-k3-worker"])
            reply = raw.parse().choices[0].message.content or ""
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"Turn {i}."}]
        assert len(set(homes)) == 1
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=4, stream=True)
        assert list(stream)  # streaming through the router
        home = homes[0]
        os.killpg(procs[int(home.rsplit(":", 1)[1])].pid, signal.SIGKILL)
        started = time.monotonic()
        try:
            raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=4)
            moved_to = raw.headers["x-k3-worker"]
        except openai.APIStatusError as exc:  # a clean error is acceptable; a hang is not
            assert exc.status_code in (502, 503) and "error" in exc.response.json()
            raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=4)
            moved_to = raw.headers["x-k3-worker"]
        assert moved_to != home and time.monotonic() - started < 120
        (record,) = core.fleet.sessions.values()
        assert record.worker_id == moved_to and record.moves == 1
