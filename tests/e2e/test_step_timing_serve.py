"""K3_STEP_TIMING on a real server (slow tier; `k3 bench plain-decode` is its user): a K3_CSV server that never drafts
writes one record per decode step, with the model forward inside run_batch inside the scheduler loop."""
from __future__ import annotations

import httpx
import pytest

from k3_sglang.serving.process import K3ServerProcess
from k3_sglang.serving.step_timing import read_steps

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_speculative_server_times_its_decode_steps(tiny_dir, tmp_path):
    prefix = tmp_path / "steps"
    env = {"K3_STEP_TIMING": str(prefix), "K3_SPEC_VERIFY_MODE": "decode"}
    proc = K3ServerProcess(["--model-path", str(tiny_dir), "--speculative-algorithm", "K3_CSV",
                            "--speculative-num-draft-tokens", "4"], tmp_path / "serve.log", env=env).start(timeout_s=600)
    try:
        for seed in range(3):  # 3 x 39 decode steps: more than one flush block
            body = {"input_ids": list(range(3 + seed, 40 + seed)),
                    "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}}
            r = httpx.post(proc.url + "/generate", json=body, timeout=600)
            assert r.status_code == 200, r.text
    finally:
        proc.stop()
    rows = read_steps(prefix)
    assert len(rows) >= 64, len(rows)
    for row in rows:
        assert row["b"] == 1
        assert 0 < row["fwd"] <= row["run"] <= row["loop"], row
        assert 0 < row["result"] < row["loop"], row
