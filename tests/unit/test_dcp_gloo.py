"""DCP attention over real gloo process groups, as one DCP implementation serves both K3 models: each rank attends
its stripe of a paged pool in SGLang's layout (position p on rank p mod c) through the k3_dcp_mla kernel, and SGLang's
own LSE merges (all-gather + reduce-scatter, all-to-all; natural-log and base-2 LSE) over a real GroupCoordinator,
with our CPU hooks installed, give the float64 full attention, for decode (ranks with no key included) and for
several queries per request over a cached prefix. Pool pages nobody owns are NaN, so a stripe reading a wrong row
fails. Our per-rank key count agrees with SGLang's `get_dcp_lens`."""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from k3_sglang.kernels.mla.dcp_layout import local_key_counts
from k3_sglang.net import free_port

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("c", [2, 4])
def test_dcp_attention_over_gloo_matches_full_attention(c):
    from tests.unit.dcp_gloo_worker import run

    mp.spawn(run, args=(c, free_port(), 1234 + c), nprocs=c, join=True)


def test_local_key_counts_match_sglangs_dcp_lens():
    from sglang.srt.layers.dcp.layout import get_dcp_lens

    lens = torch.arange(0, 70)
    for c in (1, 2, 3, 4, 8):
        for r in range(c):
            assert local_key_counts(lens, c, r).tolist() == get_dcp_lens(lens, c, r).tolist(), (c, r)
