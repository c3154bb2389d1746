"""Shared prefixes and paused sessions on `k3 serve`'s defaults resume from the radix cache (issue 42).

The regression: `k3 serve` passed SGLang's `--mamba-max-states-per-path 2`, whose cap keeps the two *deepest* KDA
states of a radix path and drops the shallower ones: exactly the chunk-boundary states a request that shares only a
prefix (a common system prompt and tool list) resumes from. Under `no_buffer` the fork a second request creates holds
no state either, so three requests sharing 1,500 tokens got cached 0, 0, 0. `k3 serve` now keeps every chunk's state
and sizes the state pool for it (k3_sglang/serving/cli.py `cpu_state_slots`; the pool arithmetic for 8 sessions of
~6K tokens: tests/plan/test_plan_sessions.py).

Default tier: the shared float32 server of this folder (64-token chunks, 8,192-token pool, every `k3 serve` default
otherwise), three requests sharing 700 tokens, and 8 round-robin sessions of 320 tokens paused and resumed; a hit's answer equals
the float64 reference. Slow tier: the issue's exact cases on the plain defaults (512-token chunks, 131,072-token
pool): three requests sharing 1,500 tokens, and 8 sessions of ~6K tokens (2.7 minutes with the server start,
measured 2026-12-07 00:10 UTC on 2 cores at load ~4; 6 minutes at load ~9).
"""

from __future__ import annotations

import os
import random

import pytest

from k3_sglang.serving.process import K3ServerProcess
from k3_sglang.tooling.bench.session_traffic import SessionTraffic, generate, run_sessions
from tests.e2e.conftest import CHUNK
from tests.e2e.session_checks import resumed_fractions

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


def _ids(n: int, seed: str) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 1000) for _ in range(n)]


def _shared_prefix_hits(url: str, shared: int, own: int, seed: str) -> list:
    """Three requests: the same `shared` tokens, then `own` tokens of their own. Returns their records."""
    prefix = _ids(shared, seed + "/shared")
    return [generate(url, prefix + _ids(own, f"{seed}/{i}"), 4) for i in range(3)]


def test_three_requests_sharing_a_prefix_resume_at_its_last_chunk_boundary(server, reference):
    shared, own = 700, 40
    boundary = shared // CHUNK * CHUNK  # the last chunk boundary inside the shared prefix (640)
    first, second, third = _shared_prefix_hits(server.url, shared, own, "i42-fixture")
    assert first.cached_tokens < boundary  # nothing primed this prefix
    for rec in (second, third):
        assert boundary <= rec.cached_tokens <= shared, (first, second, third)
    # the resumed KDA state is the right one: the hit's answer equals the float64 full recompute
    prompt = _ids(shared, "i42-fixture/shared") + _ids(own, "i42-fixture/1")
    assert list(second.output_ids) == reference.greedy(prompt, 4)


def test_eight_paused_sessions_resume_their_whole_history(server):
    traffic = SessionTraffic(sessions=8, first_tokens=320, tool_tokens=32, output_tokens=4, turns=2, seed=42)
    records = run_sessions(server.url, traffic)
    fractions = resumed_fractions(records)
    assert len(fractions) == 8
    assert min(fractions) >= 0.9, [(r.session, r.turn, r.prompt_tokens, r.cached_tokens) for r in records]


# ---- slow tier: the cases on the plain `k3 serve` defaults ----

@pytest.fixture(scope="module")
def default_server(tiny_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-defaults") / "serve.log"
    proc = K3ServerProcess(["--model-path", str(tiny_dir)], log)
    proc.start(timeout_s=float(os.environ.get("K3_TEST_STARTUP_S", "400")))
    yield proc
    proc.stop()


@pytest.mark.slow
def test_defaults_three_requests_sharing_1500_tokens_hit_1024(default_server):
    first, second, third = _shared_prefix_hits(default_server.url, 1500, 50, "i42-defaults")
    assert first.cached_tokens == 0
    assert second.cached_tokens >= 1024 and third.cached_tokens >= 1024, (first, second, third)


@pytest.mark.slow
def test_defaults_eight_paused_6k_sessions_resume_at_least_90_percent(default_server):
    traffic = SessionTraffic(sessions=8, first_tokens=6000, tool_tokens=256, output_tokens=8, turns=2, seed=42)
    fractions = resumed_fractions(run_sessions(default_server.url, traffic))
    assert len(fractions) == 8 and min(fractions) >= 0.9, fractions
