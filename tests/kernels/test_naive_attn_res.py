"""AttnRes read reference against an explicit per-token loop."""
import pytest
import torch

from k3_sglang.kernels.attn_res import attn_res_read
from tests.utils.numerics import assert_close


@pytest.mark.parametrize("N", [1, 4, 9])
def test_attn_res_read_loop(N):
    T, D = 3, 10
    cand, w = torch.randn(N, T, D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)
    out = attn_res_read(cand, w, 1e-5)
    for t in range(T):
        scores = []
        for i in range(N):
            v = cand[i, t]
            key = v / torch.sqrt((v * v).mean() + 1e-5)
            scores.append(sum(w[c] * key[c] for c in range(D)))
        alpha = torch.stack(scores).softmax(0)
        assert_close(f"token {t}", sum(alpha[i] * cand[i, t] for i in range(N)), out[t], 1e-12)
    assert attn_res_read(cand.bfloat16(), w.float(), 1e-5).dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"weight \(9,\)"):
        attn_res_read(cand, torch.randn(9), 1e-5)
