"""The SGLang-served k3-tiny (float32) against the plain reference forward (float64, full recompute)."""

from __future__ import annotations

import httpx
import pytest
import torch

from tests.e2e.reference_checks import REFERENCE_NEW_TOKENS as NEW_TOKENS
from tests.e2e.reference_checks import reference_prompts as _prompts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


def _generate(server, ids: list[int], new_tokens: int, **extra) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}, **extra}
    resp = httpx.post(server.url + "/generate", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.mark.parametrize("index", [0, 1, 2], ids=["short", "medium", "crosses-chunks"])
def test_greedy_tokens_identical_to_reference(server, reference_outputs, index):
    got = _generate(server, _prompts()[index], NEW_TOKENS)["output_ids"]
    assert len(got) == NEW_TOKENS
    assert got == reference_outputs[index]


def test_teacher_forced_input_logprobs_match_reference(server, reference):
    ids = _prompts()[2]  # longer than the chunk: KDA state and conv windows cross chunk boundaries
    meta = _generate(server, ids, 1, return_logprob=True, logprob_start_len=0)["meta_info"]
    got = torch.tensor([lp for lp, _tok, *_ in meta["input_token_logprobs"][1:]], dtype=torch.float64)
    logp = torch.log_softmax(reference.logits(ids), dim=-1)
    want = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert not torch.isnan(got).any()
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-3


def test_prefix_cache_reuse_gives_same_output(server):
    """A follow-up turn (first turn's prompt + its answer + new text) hits the radix cache."""
    first = _prompts()[2]
    answer = _generate(server, first, 8)["output_ids"]
    follow_up = first + answer + [11, 22, 33, 44, 55]
    cached = _generate(server, follow_up, 16)
    assert cached["meta_info"]["cached_tokens"] > 0
    assert httpx.post(server.url + "/flush_cache", timeout=60).status_code == 200
    fresh = _generate(server, follow_up, 16)
    assert fresh["meta_info"]["cached_tokens"] == 0
    assert cached["output_ids"] == fresh["output_ids"]


def test_concurrent_batch_matches_reference(server, reference_outputs):
    """The three prompts decoded together (batched KDA and MLA decode, different lengths)."""
    import concurrent.futures

    prompts = _prompts()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda ids: _generate(server, ids, 12)["output_ids"], prompts))
    assert got == [want[:12] for want in reference_outputs]
