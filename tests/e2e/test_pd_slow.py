"""A decode server killed mid-session under real PD serving (slow: four SGLang servers on 2 cores).

One prefill and two decode `k3 serve` processes behind `k3 router`. A session's decode server is killed
(SIGKILL, whole process group) between turns, then during a streamed turn:
- between turns, the next turn is re-paired on the surviving decode server and completes, greedy output
  equal to the aggregated server's, and the session stays there afterwards;
- mid-stream, the client gets the router's SSE error event and `[DONE]` within a bounded time (never a
  hang), and the session's next turn completes on the survivor.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import httpx
import pytest

from k3_sglang.net import free_port
from k3_sglang.serving.process import K3ServerProcess
from test_pd_serve import ADMIN_KEY, SAME_AS_AGGREGATED, _generate, _prompt, _start_router

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture
def pd_two_decodes(tiny_dir, tmp_path):
    bootstrap = free_port()
    common = ["--model-path", str(tiny_dir), *SAME_AS_AGGREGATED]
    prefill = K3ServerProcess(common + ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port",
                                        str(bootstrap)], tmp_path / "prefill.log", env={"K3_MAX_N": "16"})
    decodes = [K3ServerProcess(common + ["--disaggregation-mode", "decode"], tmp_path / f"decode{i}.log",
                               env={"K3_MAX_N": "16"}) for i in range(2)]
    servers, router = [prefill, *decodes], None
    startup = float(os.environ.get("K3_TEST_STARTUP_S", "600"))
    try:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda s: s.start(timeout_s=startup), servers))
        args = ["--prefill", prefill.url, str(bootstrap), "--admin-key", ADMIN_KEY]
        for d in decodes:
            args += ["--decode", d.url]
        router, url = _start_router(args, tmp_path / "router.log")
        yield url, {d.url: d for d in decodes}
    finally:
        if router is not None:
            router.terminate()
            router.wait(timeout=10)
        for s in servers:
            s.stop()


def _kill(server: K3ServerProcess) -> None:
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)


def test_killed_between_turns_re_pairs_and_completes(pd_two_decodes, server):
    url, decodes = pd_two_decodes
    history: list[int] = []
    first = _generate(url, _prompt(300, seed=1), 8, session="kill-between")
    home = first.headers["x-k3-worker"]
    history = _prompt(300, seed=1) + first.json()["output_ids"] + _prompt(100, seed=2)
    _kill(decodes[home])
    started = time.monotonic()
    second = _generate(url, history, 8, session="kill-between")
    assert time.monotonic() - started < 120  # re-paired at once, not SGLang's 300 s waiting timeout
    assert second.headers["x-k3-worker"] != home
    assert second.json()["output_ids"] == _generate(server.url, history, 8).json()["output_ids"]
    history += second.json()["output_ids"] + _prompt(50, seed=3)
    third = _generate(url, history, 4, session="kill-between")
    assert third.headers["x-k3-worker"] == second.headers["x-k3-worker"]
    metrics = httpx.get(url + "/metrics", timeout=10).text
    assert "k3_router_pd_repairs_total 1.0" in metrics


def test_killed_mid_stream_ends_the_stream_with_an_error_then_the_session_goes_on(pd_two_decodes):
    url, decodes = pd_two_decodes
    ids = _prompt(200, seed=5)
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}}
    started, chunks, home = time.monotonic(), [], None
    with httpx.stream("POST", url + "/generate", json=body, headers={"X-Session-Id": "kill-mid"}, timeout=120) as r:
        home = r.headers["x-k3-worker"]
        for line in r.iter_lines():
            chunks.append(line)
            if len([c for c in chunks if c.startswith("data: {")]) == 3:
                _kill(decodes[home])
    text = "\n".join(chunks)
    assert time.monotonic() - started < 120
    assert '"upstream_stream_broken"' in text and text.rstrip().endswith("data: [DONE]")
    after = _generate(url, ids + _prompt(20, seed=6), 4, session="kill-mid")
    assert after.headers["x-k3-worker"] != home
