"""K3_STEP_TIMING on a real server (slow tier; `k3 bench plain-decode` is its user): a K3_CSV server that never drafts
writes one record per decode step, with the model forward inside run_batch inside the scheduler loop."""
from __future__ import annotations

import time

import httpx
import pytest

from k3_sglang.serving.process import K3ServerProcess
from k3_sglang.serving.step_timing import FLUSH_SECONDS, read_steps

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_speculative_server_times_its_decode_steps(tiny_dir, tmp_path):
    prefix = tmp_path / "steps"
    env = {"K3_STEP_TIMING": str(prefix), "K3_SPEC_VERIFY_MODE": "decode"}
    proc = K3ServerProcess(["--model-path", str(tiny_dir), "--speculative-algorithm", "K3_CSV",
                            "--speculative-num-draft-tokens", "4"], tmp_path / "serve.log", env=env).start(timeout_s=600)
    try:
        start = time.perf_counter()  # after SGLang's own warm-up request, whose steps are left out below
        for seed in range(3):
            body = {"input_ids": list(range(3 + seed, 40 + seed)),
                    "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}}
            r = httpx.post(proc.url + "/generate", json=body, timeout=600)
            assert r.status_code == 200, r.text
        time.sleep(3 * FLUSH_SECONDS)  # the writer thread's last flush: stop() signals, atexit does not run
    finally:
        proc.stop()
    rows = [row for row in read_steps(prefix) if row["t"] >= start]
    # 39 decode steps per request; a step is written when the next decode step begins, so each request's last one
    # (followed by idle) is not: every other step is on disk, none twice
    assert len(rows) == 3 * 38, len(rows)
    assert len({row["t"] for row in rows}) == len(rows)
    for row in rows:
        assert row["b"] == 1
        assert 0 < row["fwd"] <= row["run"] < row["loop"], row  # after run_batch: process_batch_result, scheduling
        assert set(row) == {"t", "b", "loop", "run", "fwd"}, row
