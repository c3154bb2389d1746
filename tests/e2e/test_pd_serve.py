"""PD disaggregation end to end on CPU: `k3 serve --disaggregation-mode prefill` and `decode` on loopback, KV
(MLA pages and the KDA state) sent over Mooncake TCP, `k3 router --prefill URL PORT --decode URL` pairing them.

Greedy output through router -> prefill -> decode must equal the aggregated server of conftest.py (same dtype,
chunking and pool size): a 2,000-token prompt, a three-turn session that stays on its decode server, 8
concurrent requests, and a streamed completion through the official `openai` client. The router's start-up
check against the real servers' `/get_server_info` is exercised too (an aggregated server passed as `--decode`
is refused with exit code 2).
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time

import httpx
import openai
import pytest
import torch

from k3_sglang.net import free_port
from k3_sglang.serving.process import K3ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
# conftest.py's aggregated `server` flags: the comparison needs the same dtype, chunks and pool
SAME_AS_AGGREGATED = ["--dtype", "float32", "--chunked-prefill-size", "64", "--max-total-tokens", "8192"]
VOCAB = 760  # token ids the tiny checkpoint embeds safely (as test_pp_serve.py)
ADMIN_KEY = "pd-e2e-admin"


def _prompt(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=gen).tolist()


def _start_router(args: list[str], log_path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "k3_sglang.cli", "router", *args, "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"k3 router exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/readiness", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"k3 router not ready:\n{log_path.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def pd(tiny_dir, tmp_path_factory):
    """(prefill, decode, router URL, bootstrap port): two PD servers and the router pairing them."""
    folder = tmp_path_factory.mktemp("pd")
    bootstrap = free_port()
    common = ["--model-path", str(tiny_dir), *SAME_AS_AGGREGATED]
    prefill = K3ServerProcess(common + ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port",
                                        str(bootstrap)], folder / "prefill.log", env={"K3_MAX_N": "16"})
    decode = K3ServerProcess(common + ["--disaggregation-mode", "decode"], folder / "decode.log",
                             env={"K3_MAX_N": "16"})
    startup = float(os.environ.get("K3_TEST_STARTUP_S", "400"))
    router = None
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.start(timeout_s=startup), (prefill, decode)))
        router, url = _start_router(["--prefill", prefill.url, str(bootstrap), "--decode", decode.url,
                                     "--admin-key", ADMIN_KEY], folder / "router.log")
        yield prefill, decode, url, bootstrap
    finally:
        if router is not None:
            router.terminate()
            router.wait(timeout=10)
        prefill.stop()
        decode.stop()


def _generate(url: str, ids: list[int], new_tokens: int, session: str | None = None) -> httpx.Response:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    headers = {"X-Session-Id": session} if session else {}
    resp = httpx.post(url + "/generate", json=body, headers=headers, timeout=600)
    assert resp.status_code == 200, resp.text[:500]
    return resp


# ---- what `k3 serve --disaggregation-mode` adds on CPU (pure; no server) -------------------------------

def test_pd_cpu_defaults_yield_to_the_users_flags_and_variables():
    from k3_sglang.serving.pd_cpu import pd_cpu_env, pd_cpu_flags

    assert pd_cpu_flags(["--dtype", "float32"]) == [] and pd_cpu_env([], "127.0.0.1", {"A": "1"}) == {"A": "1"}
    assert pd_cpu_flags(["--disaggregation-mode", "prefill"]) == ["--disaggregation-transfer-backend", "mooncake_tcp"]
    assert pd_cpu_flags(["--disaggregation-mode=decode", "--disaggregation-transfer-backend", "nixl"]) == [
        "--disaggregation-decode-retraction-backup", "cpu_tensor"]
    env = pd_cpu_env(["--disaggregation-mode", "decode"], "127.0.0.1", {"SGLANG_HOST_IP": "10.1.2.3"})
    assert env["SGLANG_HOST_IP"] == "10.1.2.3" and env["MC_TCP_BIND_ADDRESS"] == "127.0.0.1"
    assert env["SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER"] == "1"
    assert env["SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX"] == "0"
    assert "SGLANG_HOST_IP" not in pd_cpu_env(["--disaggregation-mode", "decode"], "0.0.0.0", {})


def test_serve_dry_run_shows_the_pd_settings(capsys):
    from k3_sglang import cli

    assert cli.main(["serve", "--dry-run", "--disaggregation-mode", "decode"]) == 0
    out = capsys.readouterr().out
    assert "--disaggregation-transfer-backend mooncake_tcp" in out
    assert "--disaggregation-decode-retraction-backup cpu_tensor" in out
    assert "SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER=1" in out


def test_serve_without_mooncake_is_a_clear_exit_2(monkeypatch, capsys):
    import importlib.util

    from k3_sglang import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mooncake" else real(name, *a))
    assert cli.main(["serve", "--dry-run", "--disaggregation-mode", "prefill"]) == 2
    assert "pip install mooncake-transfer-engine-non-cuda" in capsys.readouterr().err


def test_mooncake_transfer_engine_is_installed():
    from mooncake.engine import TransferEngine  # the dependency and its Debian libraries (system-deps.sh)

    assert TransferEngine is not None


# ---- real servers ------------------------------------------------------------------------------------

def test_router_sees_both_roles_and_their_kv_layout(pd):
    prefill, decode, url, bootstrap = pd
    ready = httpx.get(url + "/readiness", timeout=10).json()
    assert ready == {"ready": True, "prefill_workers": 1, "decode_workers": 1, "pairable_decode_workers": 1}
    workers = {w["url"]: w for w in httpx.get(url + "/workers", headers={"X-Admin-Key": ADMIN_KEY},
                                                   timeout=10).json()["workers"]}
    assert workers[prefill.url]["role"] == "prefill" and workers[prefill.url]["bootstrap_port"] == bootstrap
    # the layout read from the real /get_server_info: both sides agree, so they pair
    layouts = [workers[u]["kv_layout"] for u in (prefill.url, decode.url)]
    assert layouts[0] == layouts[1] and layouts[0]["page_size"] == 1 and layouts[0]["dtype"] == "float32"
    assert layouts[0]["transfer_backend"] == "mooncake"
    # a decode server runs without a radix cache: one KDA state slot per running request
    assert workers[decode.url]["state_slots"] >= 1


def test_a_2k_prompt_through_the_pair_matches_the_aggregated_server(pd, server):
    _, decode, url, _ = pd
    ids = _prompt(2000, seed=1)
    via_pd = _generate(url, ids, 16)
    assert via_pd.headers["x-k3-worker"] == decode.url
    assert via_pd.json()["output_ids"] == _generate(server.url, ids, 16).json()["output_ids"]


def test_a_multi_turn_session_stays_on_its_decode_server_and_matches(pd, server):
    _, decode, url, _ = pd
    history_pd: list[int] = []
    history_agg: list[int] = []
    for turn in range(3):
        user = _prompt(150, seed=10 + turn)
        got = _generate(url, history_pd + user, 8, session="pd-e2e-session")
        want = _generate(server.url, history_agg + user, 8).json()["output_ids"]
        assert got.json()["output_ids"] == want, f"turn {turn}"
        assert got.headers["x-k3-worker"] == decode.url
        history_pd += user + got.json()["output_ids"]
        history_agg += user + want


def test_8_concurrent_requests_match(pd, server):
    _, _, url, _ = pd
    prompts = [_prompt(70 + 13 * i, seed=100 + i) for i in range(8)]  # 70..161 tokens: 2-3 chunks each
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        via_pd = list(pool.map(lambda p: _generate(url, p, 6).json()["output_ids"], prompts))
        aggregated = list(pool.map(lambda p: _generate(server.url, p, 6).json()["output_ids"], prompts))
    assert via_pd == aggregated


def test_streamed_completion_through_the_openai_client_matches(pd, server):
    _, _, url, _ = pd
    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    prompt = _prompt(300, seed=7)

    def complete(base: str, stream: bool) -> str:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
        kwargs = dict(model=model, prompt=prompt, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
        if not stream:
            return client.completions.create(**kwargs).choices[0].text
        return "".join(c.choices[0].text for c in client.completions.create(stream=True, **kwargs) if c.choices)

    assert complete(url, stream=True) == complete(server.url, stream=False)


def test_router_start_refuses_an_aggregated_server_given_as_decode(pd, server, capsys):
    from k3_sglang import cli

    prefill, _, _, bootstrap = pd
    assert cli.main(["router", "--prefill", prefill.url, str(bootstrap), "--decode", server.url, "--port", "1"]) == 2
    assert "reports disaggregation_mode null: pass it with --worker" in capsys.readouterr().err


def test_8_concurrent_multi_turn_sessions_stay_home_and_match(pd, server):
    """8 sessions at once, 3 turns each: a turn's prompt is the previous prompt + the previous answer + new
    tokens, sent with X-Session-Id. Every turn's greedy output equals the aggregated server's for the same
    history, and every turn of a session is answered by the same decode server under the same session id."""
    _, decode, url, _ = pd
    sessions, turns, new_tokens = 8, 3, 4

    def user_tokens(session: int, turn: int) -> list[int]:  # 40..75 tokens the first turn, 20..34 later
        return _prompt((40 + 5 * session) if turn == 0 else (20 + 2 * session), seed=1000 + 10 * session + turn)

    def converse(base: str, session: int, pd_path: bool) -> list[tuple[list[int], str, str]]:
        history: list[int] = []
        answers = []
        for turn in range(turns):
            history = history + user_tokens(session, turn)
            resp = _generate(base, history, new_tokens, session=f"pd-e2e-multi-{session}" if pd_path else None)
            output = resp.json()["output_ids"]
            assert len(output) == new_tokens
            answers.append((output, resp.headers.get("x-k3-worker", ""), resp.headers.get("x-k3-session-id", "")))
            history = history + output
        return answers

    with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
        via_pd = list(pool.map(lambda s: converse(url, s, True), range(sessions)))
        aggregated = list(pool.map(lambda s: converse(server.url, s, False), range(sessions)))
    for s in range(sessions):
        assert [a[0] for a in via_pd[s]] == [a[0] for a in aggregated[s]], f"session {s}"
        assert {a[1] for a in via_pd[s]} == {decode.url}, f"session {s} left its decode server"
        assert len({a[2] for a in via_pd[s]}) == 1 and via_pd[s][0][2], f"session {s} changed its session id"
    assert len({via_pd[s][0][2] for s in range(sessions)}) == sessions  # 8 distinct sessions
