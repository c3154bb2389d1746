"""DCP attention over real gloo process groups: each rank attends its stripe of the keys (position p on rank
p mod c) through `kernels.dispatch` and the exact LSE merge (all-gather + reduce-scatter and all-to-all) gives the
float64 full attention, for decode (ranks with no key included) and for chunked extend over a cached prefix.
The pool rows nobody owns are NaN, so a stripe reading a wrong row fails. SGLang's own per-rank length rule
(`layers/dcp/layout.get_dcp_lens`) agrees with ours."""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from k3_sglang.net import free_port
from k3_sglang.parallel.dcp import local_key_count, merge_weights

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("c", [2, 4])
def test_dcp_attention_over_gloo_matches_full_attention(c):
    from tests.unit.dcp_gloo_worker import run

    mp.spawn(run, args=(c, free_port(), 1234 + c), nprocs=c, join=True)


def test_local_key_count_matches_sglangs_dcp_lens():
    from sglang.srt.layers.dcp.layout import get_dcp_lens

    lens = torch.arange(0, 70)
    for c in (1, 2, 3, 4, 8):
        for r in range(c):
            want = get_dcp_lens(lens, c, r).tolist()
            assert [local_key_count(int(n), c, r) for n in lens] == want, (c, r)


def test_merge_weights_of_empty_partials_are_zero_not_nan():
    lses = torch.tensor([[float("-inf"), 0.5], [float("-inf"), float("-inf")]])
    w, lse = merge_weights(lses)
    assert torch.equal(w[:, 0], torch.zeros(2)) and torch.isneginf(lse[0])
    assert torch.allclose(w[:, 1], torch.tensor([1.0, 0.0])) and lse[1] == 0.5
