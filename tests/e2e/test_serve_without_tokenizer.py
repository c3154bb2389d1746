"""`k3 serve --skip-tokenizer-init` loads a K3-layout checkpoint that ships no tokenizer."""

from __future__ import annotations

import httpx
import pytest

from k3_sglang.serving.process import K3ServerProcess
from k3_sglang.tiny.checkpoint import write_tiny_checkpoint

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.mark.slow  # 40 s of the default run; --skip-tokenizer-init's flag handling is unit-tested (test_serve_cli.py)
def test_token_id_generation_without_tokenizer(tmp_path):
    model = write_tiny_checkpoint(tmp_path / "no-tokenizer", with_tokenizer=False)
    assert not (model / "tokenizer.json").exists()
    args = ["--model-path", str(model), "--skip-tokenizer-init", "--max-total-tokens", "4096"]
    with K3ServerProcess(args, tmp_path / "serve.log") as server:
        body = {"input_ids": [5, 17, 99, 300], "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
        resp = httpx.post(server.url + "/generate", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        out = resp.json()
        assert len(out["output_ids"]) == 6
        assert all(0 <= t < 1024 for t in out["output_ids"])
