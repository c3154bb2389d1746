"""SGLang's own K3 at TP2/DCP2 on CPU (k3_dcp_mla) against SGLang's own K3 at TP1 (`make test-slow`), with both DCP
merges (`--dcp-comm-backend ag_rs`: cp_lse_ag_out_rs_mla; `a2a`: SGLang's dcp_a2a_lse_reduce): the portable model's
DCP2 checks of test_tp_dcp.py, run here on this module's `server` (SGLang's K3 at TP1) and `dcp2` fixtures: a
2,100-token prompt (greedy identical, teacher-forced logprobs as close to float64 as TP1's), 8 concurrent requests,
prefix-cache hits on both kinds of KDA snapshot (a decode step's, written by the extra_buffer decode tracking, and a
mid-extend one), a one-token prompt, twice TP1's logical KV on the same per-rank pool."""
from __future__ import annotations

import pytest

from tests.e2e.test_sglang_k3_dcp import POOL, start_sglang_k3
from tests.e2e.test_tp_dcp import (  # noqa: F401  (collected here, on this module's fixtures)
    test_dcp2_eight_concurrent_requests_match_tp1, test_dcp2_long_prompt_matches_tp1,
    test_dcp2_one_token_prompt_matches_tp1, test_dcp2_prefix_cache_hits_match_tp1, test_dcp2_reports_twice_the_logical_kv_on_the_same_per_rank_pool,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]
assert POOL == 8192  # test_tp_dcp's capacity check names the per-rank pool


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    """SGLang's K3 at TP1 (overrides conftest's portable-model server in this module)."""
    proc = start_sglang_k3(tiny_dir, tmp_path_factory, "sglang-k3-tp1", [])
    yield proc
    proc.stop()


@pytest.fixture(scope="module", params=["ag_rs", "a2a"])
def dcp2(request, tiny_dir, tmp_path_factory):
    proc = start_sglang_k3(tiny_dir, tmp_path_factory, f"sglang-k3-dcp2-{request.param}",
                           ["--tp-size", "2", "--dcp-size", "2", "--dcp-comm-backend", request.param])
    yield proc
    proc.stop()
