"""SGLang's K3 at TP2 with DCP2 on CPU, on the k3_dcp_mla backend (two gloo ranks on two cores), against the one-rank
server of conftest.py (same chunks and the same per-rank pool, --max-total-tokens 8192) and the float64 reference:
the MLA KV is striped by position across the two ranks; decode attends each rank's stripe and SGLang's forward_mla
merges the partials (cp_lse_ag_out_rs_mla, its Triton kernels on our torch paths); prefill chunks attend SGLang's
all-gathered prefix; the radix cache runs on the extra_buffer KDA prefix cache. Slower sizes
(TP2 alone, TP4/DCP4, DCP8) are in test_tp_dcp_slow.py."""
from __future__ import annotations

import httpx
import pytest

from k3_sglang.serving.process import K3ServerProcess
from tests.e2e.parallel_checks import (
    assert_concurrent_match, assert_matches_tp1, assert_prefix_hits_match, generate, logical_kv_tokens, prompt, start_k3,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
# --mem-fraction-static: the pool is capped by --max-total-tokens, and a CPU host shared with other work must not fail
# SGLang's weights-vs-free-memory check
SAME_AS_TP1 = ["--dtype", "float32", "--chunked-prefill-size", "64", "--max-total-tokens", "8192",
               "--mem-fraction-static", "0.98"]


def start_server(tiny_dir, tmp_path_factory, name: str, extra: list[str]) -> K3ServerProcess:
    return start_k3(tiny_dir, tmp_path_factory, name, [*SAME_AS_TP1, *extra], timeout_s=400)


@pytest.fixture(scope="module")
def dcp2(tiny_dir, tmp_path_factory):
    proc = start_server(tiny_dir, tmp_path_factory, "serve-dcp2", ["--tp-size", "2", "--dcp-size", "2"])
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


def test_dcp2_long_prompt_matches_tp1(server, dcp2, reference):
    # 2,100 tokens in 64-token chunks: every later chunk attends the sharded prefix of the earlier ones
    figures = assert_matches_tp1(server, dcp2, reference, prompt(2100, 11), 16)
    print("DCP2 vs TP1:", {k: f"{v:.2e}" for k, v in figures.items()})


def test_dcp2_eight_concurrent_requests_match_tp1(server, dcp2):
    assert_concurrent_match(server, dcp2, count=8)


def test_dcp2_prefix_cache_hits_match_tp1(server, dcp2):
    # KDA state snapshots from a decode step and from inside an extend, restored on a hit, with the sharded KV
    assert_prefix_hits_match(server, dcp2)


def test_dcp2_one_token_prompt_matches_tp1(server, dcp2):
    # one token: DCP rank 1 holds no key of it during the prefill
    assert generate(dcp2, [5], 4)["output_ids"] == generate(server, [5], 4)["output_ids"]


def test_dcp2_reports_twice_the_logical_kv_on_the_same_per_rank_pool(server, dcp2):
    assert logical_kv_tokens(dcp2) == 2 * logical_kv_tokens(server) == 2 * 8192
