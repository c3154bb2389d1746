"""Round-robin agent sessions on `k3 serve`'s CPU defaults: cached sessions are bounded by the KV pool, not by
KDA state slots (issue 31).

With SGLang's per-chunk KDA states and the old fixed 64-slot pool, ten 1,200-token sessions prefilled in
128-token chunks hold ~11 states each, so the pool cached about five of them and round-robin traffic under LRU
evicted exactly the session that came next (0% hits; the control below shows it). `k3 serve` now sizes
`--max-mamba-cache-size` from the KV pool for every chunk's state (issue 42 dropped the per-path cap)
(k3_sglang/plan/sessions.py): every session's next turn must hit its whole history.
Slow tier (about 2 minutes on 2 quiet cores: one server start, 20 requests; the control another); the default tier
checks the sizing without a server (tests/plan/test_plan_sessions.py).
"""

from __future__ import annotations

import os

import httpx
import pytest

from k3_sglang.tooling.bench.session_traffic import SessionTraffic, run_sessions
from k3_sglang.serving.cli import cpu_state_slots
from k3_sglang.serving.process import K3ServerProcess
from tests.e2e.session_checks import resumed_fractions

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1200)]
CHUNK, POOL = 128, 16384
TRAFFIC = SessionTraffic(sessions=10, first_tokens=1200, tool_tokens=120, output_tokens=8, turns=2)
SERVE_ARGS = ["--dtype", "float32", "--chunked-prefill-size", str(CHUNK), "--max-total-tokens", str(POOL)]


def _start(tiny_dir, tmp_path_factory, name: str, extra: list[str]) -> K3ServerProcess:
    log = tmp_path_factory.mktemp(name) / "serve.log"
    proc = K3ServerProcess(["--model-path", str(tiny_dir), *SERVE_ARGS, *extra], log)
    return proc.start(timeout_s=float(os.environ.get("K3_TEST_STARTUP_S", "400")))


def test_round_robin_sessions_all_hit_on_the_default_sizing(tiny_dir, tmp_path_factory):
    assert TRAFFIC.sessions * TRAFFIC.session_tokens() < POOL  # the KV pool holds every session
    server = _start(tiny_dir, tmp_path_factory, "serve-sessions", [])
    try:
        info = httpx.get(server.url + "/get_server_info", timeout=30).json()
        expected = cpu_state_slots(["--chunked-prefill-size", str(CHUNK), "--max-total-tokens", str(POOL),
                                    "--disable-overlap-schedule"])
        # every chunk's state kept (issue 42): 1,024 tokens in 128-token chunks + the turn's per 1,024 KV tokens
        assert info["max_mamba_cache_size"] == expected == 3 * 48 + 9 * POOL // 1024
        assert info["mamba_max_states_per_path"] == -1
        records = run_sessions(server.url, TRAFFIC)
    finally:
        server.stop()
    fractions = resumed_fractions(records)
    assert len(fractions) == TRAFFIC.sessions
    # The last generated token has no KV yet, so a full hit is the history minus one token.
    assert min(fractions) >= (TRAFFIC.first_tokens + TRAFFIC.output_tokens - 1) / (
        TRAFFIC.first_tokens + TRAFFIC.output_tokens), fractions


def test_control_old_fixed_pool_misses_round_robin_sessions(tiny_dir, tmp_path_factory):
    """The pre-issue-31 sizing (64 slots, one state per prefill chunk) on the same traffic: the sessions thrash."""
    server = _start(tiny_dir, tmp_path_factory, "serve-sessions-old",
                    ["--max-mamba-cache-size", "64", "--mamba-max-states-per-path", "-1"])
    try:
        records = run_sessions(server.url, TRAFFIC)
    finally:
        server.stop()
    assert sum(resumed_fractions(records)) / TRAFFIC.sessions < 0.5
