"""100K-token prompts on the embedded default (slow: minutes on 2 cores; `make test-slow`).

No reference can recompute 100K tokens here (its unabsorbed attention alone would hold a 100K x 100K score
matrix per head), so these check what can be checked at that length: the default `k3 serve` (bf16, its own
pool and chunk defaults) completes a 100K-token request, and in float32 the greedy continuation does not depend
on how the prompt was cut into prefill chunks (every chunk boundary moves; the cached-prefix attention, KDA
state carry and pool layout must all agree). The 2K-4K prompts of test_long_context.py carry the
reference comparison.
"""
from __future__ import annotations

import os
import time

import httpx
import pytest
import torch

from k3_sglang.serving.process import K3ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]
LENGTH = 100_000


def _prompt(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 760, (n,), generator=gen).tolist()


def _greedy(server, ids: list[int], new_tokens: int) -> dict:
    resp = httpx.post(server.url + "/generate", timeout=3000, json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}})
    assert resp.status_code == 200, resp.text[:500]
    return resp.json()


def _served(args: list[str], log, ids: list[int], new_tokens: int) -> tuple[list[int], float]:
    server = K3ServerProcess(args, log).start(timeout_s=float(os.environ.get("K3_TEST_STARTUP_S", "400")))
    try:
        start = time.perf_counter()
        out = _greedy(server, ids, new_tokens)
        return out["output_ids"], time.perf_counter() - start
    finally:
        server.stop()


def test_default_server_completes_a_100k_token_prompt(tmp_path):
    output, seconds = _served([], tmp_path / "serve.log", _prompt(LENGTH, 1), 16)
    assert len(output) == 16
    print(f"100K-token prompt + 16 tokens on the default server: {seconds:.0f} s")


def test_100k_greedy_output_does_not_depend_on_the_chunk_size(tiny_dir, tmp_path):
    ids = _prompt(LENGTH, 2)
    base = ["--model-path", str(tiny_dir), "--dtype", "float32"]
    a, _ = _served(base + ["--chunked-prefill-size", "4096"], tmp_path / "a.log", ids, 16)
    b, _ = _served(base + ["--chunked-prefill-size", "1536"], tmp_path / "b.log", ids, 16)
    assert a == b
