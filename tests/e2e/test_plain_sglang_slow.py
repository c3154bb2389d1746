"""Plain `python -m sglang.launch_server` on a non-K3 model with k3-sglang installed answers as without our plugins.

A tiny Llama-shaped checkpoint (tests/utils/tiny_llama.py: random float32 weights, the tiny K3's tokenizer) is served
twice by SGLang's own launcher, not `k3 serve`: once with every general plugin of k3-sglang loaded, once with them all
skipped (SGLANG_PLUGINS names none of them). SGLang's own CPU path cannot run a Llama on this host (its rotary and
attention kernels come from sgl_kernel / vllm, absent here), so both servers run on our k3_cpu platform, the one thing
they share; greedy answers to the same prompts must be token-identical. That the plugins register no hook at all where
K3 is not in play is tests/unit/test_inert_elsewhere.py (default tier). Two server starts: 2-4 minutes, slow tier."""
from __future__ import annotations

import re
import sys

import httpx
import pytest

from k3_sglang.serving.process import K3ServerProcess
from tests.utils.tiny_llama import write_tiny_llama

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1200)]

PROMPTS = [[5, 17, 99, 230, 41], [300, 2, 2, 2, 511, 64, 7, 90], list(range(40, 72))]
NEW_TOKENS = 12


class PlainSGLangServer(K3ServerProcess):
    """SGLang's own launcher (no `k3 serve`, no K3 environment but the k3_cpu platform)."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "sglang.launch_server", "--port", str(self.port), "--host", "127.0.0.1",
                *self.args]


def _answers(model_dir, log, plugins: str | None) -> list[list[int]]:
    env = {"SGLANG_PLATFORM": "k3_cpu", "K3_SERVE_HOOKS": "", "SGLANG_EXTERNAL_MODEL_PACKAGE": ""}
    if plugins is not None:
        env["SGLANG_PLUGINS"] = plugins
    args = ["--model-path", str(model_dir), "--device", "cpu", "--dtype", "float32", "--attention-backend",
            "torch_native", "--max-total-tokens", "2048", "--disable-cuda-graph"]
    server = PlainSGLangServer(args, log, env=env)
    server.start(timeout_s=600)
    try:
        out = []
        for ids in PROMPTS:
            body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS,
                                                          "ignore_eos": True}}
            resp = httpx.post(server.url + "/generate", json=body, timeout=300)
            assert resp.status_code == 200, resp.text
            out.append(resp.json()["output_ids"])
        return out
    finally:
        server.stop()


def test_plain_launch_server_answers_as_without_k3_plugins(tmp_path):
    model = write_tiny_llama(tmp_path / "llama")
    with_plugins = _answers(model, tmp_path / "with.log", None)
    without = _answers(model, tmp_path / "without.log", "no-k3-sglang-plugin")
    assert all(len(a) == NEW_TOKENS for a in with_plugins)
    assert with_plugins == without
    proven = re.compile(r"k3-sglang: \d+ hooks in place, 7 plugins completed")
    assert proven.search((tmp_path / "with.log").read_text())  # our plugins ran (and hooked: k3_cpu) in the first
    assert "k3-sglang:" not in (tmp_path / "without.log").read_text()  # and not at all in the second
