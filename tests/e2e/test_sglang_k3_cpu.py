"""SGLang's own K3 (`sglang.srt.models.kimi_k3`, what GPU users run) served on CPU by `k3 serve` with
K3_MODEL_IMPL=sglang (k3_sglang/sglang_cpu), against the float64 reference and against the portable model on the
same prompts; SGLang's own pipeline (PP2, its AttnRes bank carried between stages) against its single stage."""
from __future__ import annotations

import concurrent.futures
import os
import warnings

import pytest
import torch

from k3_sglang.serving.process import K3ServerProcess
from tests.e2e.reference_checks import (
    CHUNK,
    LOGPROB_TOLERANCE,
    REFERENCE_NEW_TOKENS,
    generate,
    logprob_report,
    reference_prompts,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
STARTUP_S = float(os.environ.get("K3_TEST_STARTUP_S", "400"))


def _start(tiny_dir, tmp_path_factory, name: str, *flags: str) -> K3ServerProcess:
    log = tmp_path_factory.mktemp(name) / "serve.log"
    proc = K3ServerProcess(["--model-path", str(tiny_dir), "--dtype", "float32", "--chunked-prefill-size", str(CHUNK),
                            "--max-total-tokens", "8192", *flags], log, env={"K3_MODEL_IMPL": "sglang"})
    proc.start(timeout_s=STARTUP_S)
    return proc


@pytest.fixture(scope="module")
def sglang_k3(tiny_dir, tmp_path_factory):
    proc = _start(tiny_dir, tmp_path_factory, "sglang-k3")
    yield proc
    proc.stop()


def test_the_server_runs_sglangs_kda_backend_with_our_cpu_kernel(sglang_k3):
    """SGLang's KDA backend (which only SGLang's K3 goes through; the portable layers bypass it) built its kernel
    dispatcher and our CPU kernel holds every role."""
    text = sglang_k3.log_path.read_text()
    assert "KDA kernel dispatcher on k3_cpu: decode, verify and extend run K3CpuKDAKernel" in text
    assert "'attention_backend': 'k3_cpu_mla'" in text


@pytest.mark.parametrize("index", [0, 1, 2], ids=["short", "medium", "crosses-chunks"])
def test_greedy_identical_to_the_float64_reference(sglang_k3, reference_outputs, index):
    got = generate(sglang_k3.url, reference_prompts()[index], REFERENCE_NEW_TOKENS)["output_ids"]
    assert got == reference_outputs[index]


def test_teacher_forced_logprobs_within_tolerance_of_the_reference(sglang_k3, reference):
    worst, near_ties, positions = logprob_report(sglang_k3.url, reference, reference_prompts()[2])
    if near_ties:
        warnings.warn(f"{near_ties} of {positions} positions are MoE routing near-ties in the reference (not checked)")
    assert worst < LOGPROB_TOLERANCE, f"max |logprob - reference| = {worst:.2e} ({near_ties} near-ties excluded)"


def test_same_greedy_tokens_as_the_portable_model(sglang_k3, server):
    for ids in reference_prompts():
        ours = generate(server.url, ids, 16)["output_ids"]
        theirs = generate(sglang_k3.url, ids, 16)["output_ids"]
        assert theirs == ours


def test_eight_concurrent_requests_identical_to_each_alone(sglang_k3):
    gen = torch.Generator().manual_seed(99)
    prompts = [torch.randint(0, 760, (int(n),), generator=gen).tolist()
               for n in torch.randint(5, 3 * CHUNK, (8,), generator=gen)]
    alone = [generate(sglang_k3.url, ids, 12)["output_ids"] for ids in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda ids: generate(sglang_k3.url, ids, 12)["output_ids"], prompts))
    assert together == alone


def test_prefix_cache_hit_gives_the_same_output(sglang_k3):
    first = reference_prompts()[2]
    answer = generate(sglang_k3.url, first, 8)["output_ids"]
    follow_up = first + answer + [11, 22, 33]
    cached = generate(sglang_k3.url, follow_up, 12)
    assert cached["meta_info"]["cached_tokens"] > 0
    import httpx

    assert httpx.post(sglang_k3.url + "/flush_cache", timeout=60).status_code == 200
    fresh = generate(sglang_k3.url, follow_up, 12)
    assert fresh["meta_info"]["cached_tokens"] == 0 and cached["output_ids"] == fresh["output_ids"]


@pytest.mark.slow  # 73 s of CI's default run; SGLang's K3 PP2 is also checked by test_spec_serve's slow PP2 case
def test_pipeline_of_two_stages_identical_to_one(sglang_k3, tiny_dir, tmp_path_factory):
    """SGLang's own PP (its stage split, its AttnRes bank wire format) on CPU: greedy tokens as the single stage."""
    pp2 = _start(tiny_dir, tmp_path_factory, "sglang-k3-pp2", "--pp-size", "2")
    try:
        for ids in reference_prompts():
            assert generate(pp2.url, ids, 12)["output_ids"] == generate(sglang_k3.url, ids, 12)["output_ids"]
    finally:
        pp2.stop()
