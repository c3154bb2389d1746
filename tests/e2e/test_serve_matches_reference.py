"""The served k3-tiny (float32): SGLang's own K3 (`sglang.srt.models.kimi_k3`, what GPU users run) on the k3_cpu
platform (k3_sglang/sglang_cpu), against the plain reference forward (float64, full recompute,
tests/utils/reference_k3.py); batching, the prefix cache and SGLang's own pipeline (PP2, its AttnRes bank carried
between stages) against the same server's single answers."""

from __future__ import annotations

import concurrent.futures
import os
import warnings

import httpx
import pytest
import torch

from k3_sglang.serving.process import K3ServerProcess
from tests.e2e.reference_checks import CHUNK, LOGPROB_TOLERANCE, generate, logprob_report
from tests.e2e.reference_checks import REFERENCE_NEW_TOKENS as NEW_TOKENS
from tests.e2e.reference_checks import reference_prompts as _prompts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
STARTUP_S = float(os.environ.get("K3_TEST_STARTUP_S", "400"))


def test_the_server_runs_sglangs_kda_backend_with_our_cpu_kernel(server):
    """SGLang's KDA backend built its kernel dispatcher and our CPU kernel holds every role; MLA runs k3_cpu_mla."""
    text = server.log_path.read_text()
    assert "KDA kernel dispatcher on k3_cpu: decode, verify and extend run K3CpuKDAKernel" in text
    assert "'attention_backend': 'k3_cpu_mla'" in text


@pytest.mark.parametrize("index", [0, 1, 2], ids=["short", "medium", "crosses-chunks"])
def test_greedy_tokens_identical_to_reference(server, reference_outputs, index):
    got = generate(server.url, _prompts()[index], NEW_TOKENS)["output_ids"]
    assert len(got) == NEW_TOKENS
    assert got == reference_outputs[index]


def test_teacher_forced_input_logprobs_within_tolerance_of_the_reference(server, reference):
    """The prompt is longer than the chunk: KDA state and conv windows cross chunk boundaries."""
    worst, near_ties, positions = logprob_report(server.url, reference, _prompts()[2])
    if near_ties:
        warnings.warn(f"{near_ties} of {positions} positions are MoE routing near-ties in the reference (not checked)")
    assert worst < LOGPROB_TOLERANCE, f"max |logprob - reference| = {worst:.2e} ({near_ties} near-ties excluded)"


def test_prefix_cache_reuse_gives_same_output(server):
    """A follow-up turn (first turn's prompt + its answer + new text) hits the radix cache."""
    first = _prompts()[2]
    answer = generate(server.url, first, 8)["output_ids"]
    follow_up = first + answer + [11, 22, 33, 44, 55]
    cached = generate(server.url, follow_up, 16)
    assert cached["meta_info"]["cached_tokens"] > 0
    assert httpx.post(server.url + "/flush_cache", timeout=60).status_code == 200
    fresh = generate(server.url, follow_up, 16)
    assert fresh["meta_info"]["cached_tokens"] == 0
    assert cached["output_ids"] == fresh["output_ids"]


def test_concurrent_batch_matches_reference(server, reference_outputs):
    """The three prompts decoded together (batched KDA and MLA decode, different lengths)."""
    prompts = _prompts()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda ids: generate(server.url, ids, 12)["output_ids"], prompts))
    assert got == [want[:12] for want in reference_outputs]


def test_eight_concurrent_requests_identical_to_each_alone(server):
    gen = torch.Generator().manual_seed(99)
    prompts = [torch.randint(0, 760, (int(n),), generator=gen).tolist()
               for n in torch.randint(5, 3 * CHUNK, (8,), generator=gen)]
    alone = [generate(server.url, ids, 12)["output_ids"] for ids in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda ids: generate(server.url, ids, 12)["output_ids"], prompts))
    assert together == alone


@pytest.mark.slow  # 73 s of CI's default run; SGLang's K3 PP2 is also checked by test_pp_serve and test_spec_serve
def test_pipeline_of_two_stages_identical_to_one(server, tiny_dir, tmp_path_factory):
    """SGLang's own PP (its stage split, its AttnRes bank wire format) on CPU: greedy tokens as the single stage."""
    log = tmp_path_factory.mktemp("pp2") / "serve.log"
    pp2 = K3ServerProcess(["--model-path", str(tiny_dir), "--dtype", "float32", "--chunked-prefill-size", str(CHUNK),
                           "--max-total-tokens", "8192", "--pp-size", "2"], log).start(timeout_s=STARTUP_S)
    try:
        for ids in _prompts():
            assert generate(pp2.url, ids, 12)["output_ids"] == generate(server.url, ids, 12)["output_ids"]
    finally:
        pp2.stop()
