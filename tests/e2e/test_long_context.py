"""Chunk-only MLA extend on the served tiny K3 (float32) against the float64 reference forward.

Prompts of 2K-4K tokens cross many 256-token prefill chunks, so every chunk after the first attends a cached
prefix in the pool; a follow-up turn hits the radix cache; long and short prompts are batched together.
Greedy identity is checked teacher-forced: the reference is causal, so its argmax at every generated position
(one forward over prompt + output) equals its own greedy continuation exactly when the server's tokens match.
"""
from __future__ import annotations

import concurrent.futures
import os

import httpx
import pytest
import torch

from k3_sglang.serving.process import K3ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]
CHUNK = 256
POOL = 16384
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def long_server(tiny_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-long") / "serve.log"
    proc = K3ServerProcess(["--model-path", str(tiny_dir), "--dtype", "float32", "--chunked-prefill-size", str(CHUNK),
                            "--max-total-tokens", str(POOL)], log)
    proc.start(timeout_s=float(os.environ.get("K3_TEST_STARTUP_S", "400")))
    yield proc
    proc.stop()


def _prompt(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 760, (n,), generator=gen).tolist()


def _generate(server, ids: list[int], new_tokens: int, **extra) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True},
            **extra}
    resp = httpx.post(server.url + "/generate", json=body, timeout=900)
    assert resp.status_code == 200, resp.text[:500]
    return resp.json()


def _assert_reference_greedy(reference, prompt: list[int], output: list[int]) -> torch.Tensor:
    """Reference argmax at each generated position equals the server's token; returns the reference logits."""
    logits = reference.logits(prompt + output)
    want = logits[len(prompt) - 1: len(prompt) + len(output) - 1].argmax(-1).tolist()
    assert output == want, f"first mismatch at generated token {next(i for i, (a, b) in enumerate(zip(output, want)) if a != b)}"
    return logits


def test_long_prompt_greedy_and_logprobs_match_reference(long_server, reference):
    prompt = _prompt(3000, 7)  # 12 chunks of 256: chunks 2-12 attend a cached prefix
    out = _generate(long_server, prompt, NEW_TOKENS, return_logprob=True, logprob_start_len=0)
    output = out["output_ids"]
    assert len(output) == NEW_TOKENS
    logits = _assert_reference_greedy(reference, prompt, output)
    got = torch.tensor([lp for lp, _tok, *_ in out["meta_info"]["input_token_logprobs"][1:]], dtype=torch.float64)
    logp = torch.log_softmax(logits[: len(prompt) - 1], dim=-1)
    want = logp[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    assert not torch.isnan(got).any() and got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-3


def test_follow_up_turn_hits_prefix_cache_and_matches_reference(long_server, reference):
    first = _prompt(2200, 8)
    answer = _generate(long_server, first, 8)["output_ids"]
    follow_up = first + answer + _prompt(700, 9)  # the cached prefix, then 3 new chunks over it
    out = _generate(long_server, follow_up, NEW_TOKENS)
    assert out["meta_info"]["cached_tokens"] >= 2048
    _assert_reference_greedy(reference, follow_up, out["output_ids"])


def test_long_and_short_prompts_batched_together_match_reference(long_server, reference):
    prompts = [_prompt(n, 20 + n) for n in (2600, 40, 700, 5)]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        outputs = list(pool.map(lambda ids: _generate(long_server, ids, 12)["output_ids"], prompts))
    for prompt, output in zip(prompts, outputs):
        _assert_reference_greedy(reference, prompt, output)


def test_prompt_longer_than_the_kv_pool_gets_400_and_server_keeps_serving(long_server):
    resp = httpx.post(long_server.url + "/generate", timeout=120,
                      json={"input_ids": _prompt(POOL + 100, 3), "sampling_params": {"max_new_tokens": 2}})
    assert resp.status_code == 400, resp.text[:300]
    assert "exceeds the maximum allowed length" in resp.json()["error"]["message"]
    assert len(_generate(long_server, _prompt(50, 4), 2)["output_ids"]) == 2
