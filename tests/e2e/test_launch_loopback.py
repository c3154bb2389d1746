"""`k3 launch render --target cpu-loopback` of the agent-100k example plan, run for real: the plan's PD shape
(PP8 prefill -> TP8/DCP8/EP8 decode on GB300) as PP2 prefill -> TP2/DCP2/EP2 decode on this host, Mooncake TCP
over 127.0.0.1, `k3 router` pairing them; the rendered script starts and supervises everything.

Greedy output through the rendered deployment must equal conftest.py's aggregated TP1 server (same dtype,
chunking and pool, given to the script through K3_SERVE_ARGS): a 2,000-token prompt (the MLA KV leaves the
pipeline's two stages and is re-laid out DCP1 -> DCP2 on the decode side), a three-turn session and 8
concurrent requests through the official `openai` client. SIGTERM to the script stops every server.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch

from k3_sglang import cli
from k3_sglang.net import free_port, free_port_block

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
EXAMPLE_PLAN = Path(__file__).parents[2] / "launch" / "examples" / "agent-100k" / "plan.yaml"
SAME_AS_AGGREGATED = "--dtype float32 --chunked-prefill-size 64 --max-total-tokens 8192"
VOCAB = 760  # token ids the tiny checkpoint embeds safely (as test_pd_serve.py)


def _prompt(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=gen).tolist()


def _tail(script_log: Path, log_dir: Path) -> str:
    parts = [f"--- script\n{script_log.read_text()[-3000:]}"]
    parts += [f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(log_dir.glob("*.log"))]
    return "\n".join(parts)


@pytest.fixture(scope="module")
def loopback(tiny_dir, tmp_path_factory):
    """(script process, router URL, prefill URL, decode URL, folder): the rendered deployment, running."""
    folder = tmp_path_factory.mktemp("loopback")
    assert cli.main(["launch", "render", str(EXAMPLE_PLAN), "--target", "cpu-loopback", "--out", str(folder)]) == 0
    script = folder / "k3-agent-100k-cpu-loopback.sh"
    base, bootstrap, router_port = free_port_block(2), free_port_block(2), free_port()
    log_dir = folder / "logs"
    log_dir.mkdir()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "MODEL_PATH": str(tiny_dir), "K3_SERVE_ARGS": SAME_AS_AGGREGATED, "K3_MAX_N": "16",
           "BASE_PORT": str(base), "BOOTSTRAP_PORT": str(bootstrap), "ROUTER_PORT": str(router_port),
           "LOG_DIR": str(log_dir), "HEALTH_POLL_S": "1"}
    script_log = folder / "script.log"
    with open(script_log, "w") as out:
        proc = subprocess.Popen(["bash", str(script)], stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    url = f"http://127.0.0.1:{router_port}"
    try:
        deadline = time.monotonic() + float(os.environ.get("K3_TEST_STARTUP_S", "400")) + 200
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the rendered script exited with {proc.returncode}:\n{_tail(script_log, log_dir)}")
            try:
                if httpx.get(url + "/readiness", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the rendered deployment was not ready in time:\n{_tail(script_log, log_dir)}")
            time.sleep(1)
        yield proc, url, f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}", folder
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything the script left behind
        except ProcessLookupError:
            pass


def _generate(url: str, ids: list[int], new_tokens: int, session: str | None = None) -> httpx.Response:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    resp = httpx.post(url + "/generate", json=body, headers={"X-Session-Id": session} if session else {},
                      timeout=600)
    assert resp.status_code == 200, resp.text[:500]
    return resp


def test_the_servers_run_the_plans_parallel_features(loopback):
    _, _, prefill, decode, _ = loopback
    pre = httpx.get(prefill + "/get_server_info", timeout=30).json()
    dec = httpx.get(decode + "/get_server_info", timeout=30).json()
    assert (pre["disaggregation_mode"], pre["pp_size"], pre["tp_size"]) == ("prefill", 2, 1)
    assert (dec["disaggregation_mode"], dec["tp_size"], dec["dcp_size"], dec["ep_size"]) == ("decode", 2, 2, 2)


def test_a_2k_prompt_through_the_rendered_deployment_matches_the_aggregated_server(loopback, server):
    _, url, _, decode, _ = loopback
    ids = _prompt(2000, seed=1)
    via = _generate(url, ids, 16)
    assert via.headers["x-k3-worker"] == decode
    assert via.json()["output_ids"] == _generate(server.url, ids, 16).json()["output_ids"]


def test_a_three_turn_session_matches(loopback, server):
    _, url, _, decode, _ = loopback
    history_lb: list[int] = []
    history_agg: list[int] = []
    for turn in range(3):
        user = _prompt(120, seed=20 + turn)
        got = _generate(url, history_lb + user, 8, session="loopback-session").json()["output_ids"]
        want = _generate(server.url, history_agg + user, 8).json()["output_ids"]
        assert got == want, f"turn {turn}"
        history_lb += user + got
        history_agg += user + want


def test_8_concurrent_completions_through_the_openai_client_match(loopback, server):
    _, url, _, _, _ = loopback
    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    prompts = [_prompt(90 + 17 * i, seed=300 + i) for i in range(8)]

    def complete(base: str, prompt: list[int]) -> str:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
        return client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0,
                                          extra_body={"ignore_eos": True}).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        via = list(pool.map(lambda p: complete(url, p), prompts))
        aggregated = list(pool.map(lambda p: complete(server.url, p), prompts))
    assert via == aggregated
    assert all(via)


def test_sigterm_to_the_script_stops_every_server(loopback):
    proc, url, prefill, decode, folder = loopback
    os.kill(proc.pid, signal.SIGTERM)  # the script alone, not its process group: its trap must stop the rest
    assert proc.wait(timeout=60) == 143
    deadline = time.monotonic() + 90
    alive = [prefill, decode, url]
    while alive and time.monotonic() < deadline:
        alive = [u for u in alive if _answers(u)]
        time.sleep(1)
    assert not alive, f"still answering after the script stopped: {alive}"


def _answers(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=2)
        return True
    except httpx.HTTPError:
        return False
