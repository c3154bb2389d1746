"""SGLang's own K3 (K3_MODEL_IMPL=sglang) at TP2/DCP2 on CPU, on the k3_dcp_mla backend: one server (two gloo ranks)
against the float64 reference. Decode attends each rank's stripe and SGLang's forward_mla merges the partials
(cp_lse_ag_out_rs_mla, its Triton kernels on our torch paths); prefill chunks attend SGLang's all-gathered prefix;
the radix cache runs on the extra_buffer KDA prefix cache (its decode-time state tracking on our torch path).
Against SGLang's K3 TP1, the a2a merge and a decode-step snapshot hit: test_sglang_k3_dcp_slow.py."""
from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from k3_sglang.serving.process import K3ServerProcess
from tests.e2e.parallel_checks import generate, logical_kv_tokens, prompt, start_k3

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
POOL = 8192
# SGLang's K3 on CPU, float32, 64-token chunks; --mem-fraction-static: the pool is capped by --max-total-tokens, and a
# CPU host shared with other work must not fail SGLang's weights-vs-free-memory check
SGLANG_K3 = ["--dtype", "float32", "--chunked-prefill-size", "64", "--max-total-tokens", str(POOL),
             "--mem-fraction-static", "0.98"]


def start_sglang_k3(tiny_dir, tmp_path_factory, name: str, extra: list[str]) -> K3ServerProcess:
    return start_k3(tiny_dir, tmp_path_factory, name, [*SGLANG_K3, *extra], env={"K3_MODEL_IMPL": "sglang"})


@pytest.fixture(scope="module")
def dcp2(tiny_dir, tmp_path_factory):
    proc = start_sglang_k3(tiny_dir, tmp_path_factory, "sglang-k3-dcp2", ["--tp-size", "2", "--dcp-size", "2"])
    yield proc
    proc.stop()


def test_dcp2_runs_on_k3_dcp_mla(dcp2):
    info = httpx.get(dcp2.url + "/get_server_info", timeout=30).json()
    assert info["dcp_size"] == 2 and info["decode_attention_backend"] == "k3_dcp_mla", {
        k: info.get(k) for k in ("dcp_size", "attention_backend", "decode_attention_backend")}
    assert info["mamba_radix_cache_strategy"] == "extra_buffer"


@pytest.mark.parametrize("length", [45, 2 * 64 + 37])
def test_dcp2_greedy_matches_the_float64_reference(dcp2, reference, length):
    # 165 tokens: three 64-token chunks, each later one attending the gathered prefix of the earlier ones
    ids = prompt(length, 1234 + length)
    assert generate(dcp2, ids, 12)["output_ids"] == reference.greedy(ids, 12)


def test_dcp2_eight_concurrent_requests_match_each_alone(dcp2):
    prompts = [prompt(5 + 23 * i, 600 + i) for i in range(8)]  # up to 166 tokens: up to three chunks
    alone = [generate(dcp2, ids, 8)["output_ids"] for ids in prompts]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda ids: generate(dcp2, ids, 8)["output_ids"], prompts))
    assert together == alone


def test_dcp2_prefix_cache_hit_matches_a_cold_run(dcp2):
    # 300 tokens in 64-token chunks leave an extra_buffer KDA snapshot at 256 (a multiple of the DCP2 radix page);
    # the follow-up hits it and attends the sharded KV of the first 256 positions
    first = prompt(300, 21)
    follow = first + generate(dcp2, first, 8)["output_ids"] + prompt(5, 22)
    hit = generate(dcp2, follow, 12)
    assert 0 < hit["meta_info"]["cached_tokens"] < len(follow), hit["meta_info"]
    assert httpx.post(dcp2.url + "/flush_cache", timeout=60).status_code == 200
    cold = generate(dcp2, follow, 12)
    assert cold["meta_info"]["cached_tokens"] == 0
    assert hit["output_ids"] == cold["output_ids"]


def test_dcp2_holds_twice_the_logical_kv_of_its_per_rank_pool(dcp2):
    assert logical_kv_tokens(dcp2) == 2 * POOL
