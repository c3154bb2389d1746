"""SGLang's own K3 at TP2/DCP2 on CPU (k3_dcp_mla) with SGLang's other DCP merge, `--dcp-comm-backend a2a`
(dcp_a2a_lse_reduce), against conftest.py's TP1 server (`make test-slow`): the DCP2 checks of test_tp_dcp.py (which
runs the default ag_rs merge, cp_lse_ag_out_rs_mla), run here on this module's `dcp2` fixture: a 2,100-token prompt
(greedy identical, teacher-forced logprobs as close to float64 as TP1's), 8 concurrent requests, prefix-cache hits on
both kinds of KDA snapshot (a decode step's, written by the extra_buffer decode tracking, and a mid-extend one), a
one-token prompt, twice TP1's logical KV on the same per-rank pool."""
from __future__ import annotations

import pytest

from tests.e2e.test_tp_dcp import start_server
from tests.e2e.test_tp_dcp import (  # noqa: F401  (collected here, on this module's fixtures)
    test_dcp2_eight_concurrent_requests_match_tp1, test_dcp2_long_prompt_matches_tp1,
    test_dcp2_one_token_prompt_matches_tp1, test_dcp2_prefix_cache_hits_match_tp1, test_dcp2_reports_twice_the_logical_kv_on_the_same_per_rank_pool,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def dcp2(tiny_dir, tmp_path_factory):
    proc = start_server(tiny_dir, tmp_path_factory, "sglang-k3-dcp2-a2a",
                        ["--tp-size", "2", "--dcp-size", "2", "--dcp-comm-backend", "a2a"])
    yield proc
    proc.stop()
