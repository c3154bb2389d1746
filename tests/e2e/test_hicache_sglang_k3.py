"""SGLang's HiCache with SGLang's own K3 (`K3_MODEL_IMPL=sglang`, k3_sglang/sglang_cpu) on CPU, float32: round-robin
agent sessions on a device pool too small for them are resumed from the host tier, and every greedy answer is
token-identical to the same traffic on a SGLang-K3 server with HiCache off (no_buffer KDA states, the strategy
SGLang's K3 serves on CPU). Slow tier: two server starts and 12 requests; 19.5 min measured on 2 cores at a
load average of ~16 (other engineers' servers), a few minutes on quiet cores."""
from __future__ import annotations

import pytest

from tests.e2e.session_checks import HICACHE, answers, assert_recomputed, assert_resumed_from, matches, run, serve
from tests.e2e.session_checks import traffic

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]
SGLANG_K3 = {"K3_MODEL_IMPL": "sglang"}
L2_TRAFFIC = traffic(3, 2)  # 3 sessions: the host tier (2 x the device pool) holds them all


def test_sglang_k3_sessions_resumed_from_the_host_tier_match_hicache_off(tiny_dir, tmp_path_factory):
    off = serve(tiny_dir, tmp_path_factory, "sglang-k3-off", [], env=SGLANG_K3)
    try:
        reference = run(off, L2_TRAFFIC)
    finally:
        off.stop()
    assert_recomputed(reference)
    server = serve(tiny_dir, tmp_path_factory, "sglang-k3-l2", HICACHE, env=SGLANG_K3)
    try:
        records = run(server, L2_TRAFFIC)
        log = server.log_tail(10 ** 7)
    finally:
        server.stop()
    assert "hicache_attached=True" in log and "k3_cpu_mla" in log  # SGLang's K3 on its CPU backend, HiCache on
    assert_resumed_from(records, "host")
    assert matches(records, answers(reference))
