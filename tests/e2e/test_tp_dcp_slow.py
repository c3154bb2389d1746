"""TP and DCP at the sizes too slow for the default run (slow: `make test-slow`), each against the TP1 server of
conftest.py with the same chunks and per-rank pool: TP2 alone and TP4/EP4/DCP4 (all-to-all merge) on a 4K-token prompt,
8 concurrent requests and prefix-cache hits, and TP8/DCP8 (eight ranks on two cores) on a k3-tiny variant with 8 KDA and 8 MLA heads:
it starts, answers greedily like TP1 of the same checkpoint and reports 8x the logical KV of one rank's pool."""
from __future__ import annotations

import os

import pytest

from k3_sglang.serving.process import K3ServerProcess
from tests.e2e.parallel_checks import (
    assert_concurrent_match, assert_matches_tp1, assert_prefix_hits_match, generate, logical_kv_tokens, prompt,
)
from tests.e2e.test_tp_dcp import SAME_AS_TP1, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]
STARTUP_S = float(os.environ.get("K3_TEST_STARTUP_S", "400"))


@pytest.mark.parametrize("name,extra,factor", [
    ("tp2", ["--tp-size", "2"], 1),
    # --ep-size 4: k3-tiny's 64-wide MXFP4 experts split four ways would cut their 32-element scale groups
    # (sglang_cpu_limits refuses TP4 without EP on it)
    ("tp4-ep4-dcp4", ["--tp-size", "4", "--ep-size", "4", "--dcp-size", "4", "--dcp-comm-backend", "a2a"], 4),
])
def test_parallel_server_matches_tp1(server, reference, tiny_dir, tmp_path_factory, name, extra, factor):
    proc = start_server(tiny_dir, tmp_path_factory, f"serve-{name}", extra)
    try:
        figures = assert_matches_tp1(server, proc, reference, prompt(4096, 21), 12)
        print(f"{name} vs TP1:", {k: f"{v:.2e}" for k, v in figures.items()})
        assert_concurrent_match(server, proc, count=8)
        assert_prefix_hits_match(server, proc)
        assert logical_kv_tokens(proc) == factor * logical_kv_tokens(server)
    finally:
        proc.stop()


@pytest.mark.xfail(strict=True, reason="SGLang's K3 on CPU serves TP/DCP up to 4 (serving/sglang_cpu_limits.py); DCP8 "
                   "is refused with exit 2 until 8 ranks have an end-to-end test (issue 37, width)")
def test_dcp8_on_eight_ranks_starts_answers_and_holds_8x(tmp_path_factory):
    from k3_sglang.tiny.checkpoint import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(tmp_path_factory.mktemp("k3-tiny-8h"), preset_name="k3-tiny-8h")
    logs = tmp_path_factory.mktemp("serve-8h")
    flags = ["--model-path", str(ckpt), *SAME_AS_TP1]
    tp1 = K3ServerProcess(flags, logs / "tp1.log", env={"K3_MAX_N": "16"}).start(timeout_s=STARTUP_S)
    try:
        ids = prompt(300, 31)
        want = generate(tp1, ids, 6)["output_ids"]
        one_rank = logical_kv_tokens(tp1)
    finally:
        tp1.stop()
    dcp8 = K3ServerProcess([*flags, "--tp-size", "8", "--dcp-size", "8"], logs / "dcp8.log",
                           env={"K3_MAX_N": "16"}).start(timeout_s=3 * STARTUP_S)  # 8 ranks share 2 cores
    try:
        assert generate(dcp8, ids, 6)["output_ids"] == want
        assert logical_kv_tokens(dcp8) / one_rank >= 7.95
    finally:
        dcp8.stop()
