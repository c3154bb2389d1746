"""K3_CSV's sampled verification against the installed SGLang (k3_sglang/spec/sampled_verify.py).

The target distribution it builds from raw logits (temperature, top-k, top-p, min-p) must be the one SGLang's own
sampler draws from: SGLang's pytorch sampling backend (CPU serving's), fed many copies of the same logits, must
pass a chi-square test against it (p-value > 1e-3, V = 8), and a hand reference of the four transforms must agree
to float32 rounding. accept_sampled keeps greedy requests of a mixed batch on greedy acceptance, token for token.
About 3 s on 2 CPU cores.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare

from k3_sglang.spec.accept import accept_greedy
from k3_sglang.spec.sampled_verify import accept_sampled, filtered_probs

V = 8
TOP_K_ALL = 1 << 30


def _info(temps, top_ks, top_ps, min_ps):
    return SimpleNamespace(
        temperatures=torch.tensor(temps, dtype=torch.float32).view(-1, 1),
        top_ks=torch.tensor(top_ks, dtype=torch.int32),
        top_ps=torch.tensor(top_ps, dtype=torch.float32), min_ps=torch.tensor(min_ps, dtype=torch.float32),
        is_all_greedy=all(k <= 1 for k in top_ks), need_top_k_sampling=any(k != TOP_K_ALL for k in top_ks),
        need_top_p_sampling=any(p != 1.0 for p in top_ps), need_min_p_sampling=any(m > 0 for m in min_ps))


def _reference(logits, temp, top_k, top_p, min_p):
    """softmax(logits / T); keep the top_k largest, those whose larger neighbours sum to at most top_p, and those
    at least min_p times the largest; renormalise."""
    p = torch.softmax(logits.double() / temp, -1)
    order = torch.argsort(p, descending=True)
    sorted_p = p[order]
    keep = torch.arange(V) < top_k
    keep &= (torch.cumsum(sorted_p, 0) - sorted_p) <= top_p
    keep &= sorted_p >= sorted_p[0] * min_p
    out = torch.zeros_like(p)
    out[order[keep]] = sorted_p[keep]
    return out / out.sum()


CASES = [(0.7, TOP_K_ALL, 1.0, 0.0), (1.3, 3, 1.0, 0.0), (1.0, TOP_K_ALL, 0.8, 0.0), (0.9, 5, 0.9, 0.0),
         (2.0, TOP_K_ALL, 1.0, 0.1), (1.0, 1, 1.0, 0.0)]


@pytest.fixture(scope="module")
def logits():
    return torch.randn(len(CASES), V, generator=torch.Generator().manual_seed(1)) * 2.0


def test_target_distribution_matches_a_hand_reference(logits):
    info = _info(*zip(*CASES))
    got = filtered_probs(logits.repeat_interleave(2, 0), info, torch.full((len(CASES),), 2))  # two rows each
    for i, case in enumerate(CASES):
        want = _reference(logits[i], *case)
        for r in (2 * i, 2 * i + 1):
            assert torch.allclose(got[r].double(), want, atol=1e-6), (case, got[r], want)


def test_sglangs_sampler_draws_from_the_target_distribution(logits):
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    n = 20_000
    torch.manual_seed(0)
    for i, (temp, k, p, m) in enumerate(CASES[:5]):
        info = _info([temp], [k], [p], [m])
        target = filtered_probs(logits[i: i + 1], info, torch.tensor([1]))[0].double()
        probs = torch.softmax(logits[i: i + 1] / temp, -1).expand(n, V).contiguous()
        drawn = top_k_top_p_min_p_sampling_from_probs_torch(
            probs, torch.full((n,), k, dtype=torch.int32), torch.full((n,), p), torch.full((n,), m), m > 0, None,
            None)
        observed = torch.bincount(drawn.long(), minlength=V).double()
        assert observed[target == 0].sum() == 0
        keep = target > 0
        if int(keep.sum()) > 1:
            assert chisquare(observed[keep].numpy(), (n * target[keep] / target[keep].sum()).numpy()).pvalue > 1e-3


def test_mixed_batch_keeps_greedy_requests_greedy(logits):
    """Three requests (greedy, sampled, greedy) with chains of 3, 2 and 4 rows: greedy rows as accept_greedy."""
    lens = [3, 2, 4]
    gen = torch.Generator().manual_seed(5)
    packed = torch.randn(sum(lens), V, generator=gen)
    argmax = torch.argmax(packed, -1)
    tokens = torch.randint(0, V, (sum(lens),), generator=gen)
    tokens[1], tokens[2] = argmax[0], argmax[1]  # request 0's drafts are right: all accepted, bonus argmax[2]
    info = _info([1.0, 0.8, 1.0], [1, TOP_K_ALL, 1], [1.0, 0.9, 1.0], [0.0, 0.0, 0.0])
    reqs = [SimpleNamespace(sampling_params=SimpleNamespace(top_k=k, sampling_seed=s))
            for k, s in ((1, None), (TOP_K_ALL, 7), (1, None))]
    commit, outs = accept_sampled(packed, tokens, lens, reqs, info, [10, 20, 30])
    g_commit, g_outs = accept_greedy(argmax, tokens, lens)
    assert commit[0] == 3 and outs[0] == argmax[:3].tolist()
    assert (commit[0], outs[0]) == (g_commit[0], g_outs[0]) and (commit[2], outs[2]) == (g_commit[2], g_outs[2])
    again = accept_sampled(packed, tokens, lens, reqs, info, [10, 20, 30])
    assert again == (commit, outs)  # the sampled request is seeded: same coins at the same position
    assert 1 <= commit[1] <= 2 and len(outs[1]) == commit[1]


def test_unmirrored_sampling_backends_are_not_verified(logits):
    """A backend whose transforms filtered_probs does not mirror (a registered custom sampler, Ascend's) is refused
    here, and StepPolicy outside a server (no backend known) lets sampled batches decode plainly."""
    from k3_sglang.spec.policy import StepPolicy
    from k3_sglang.spec.sampled_verify import backend_supported
    from k3_sglang.spec.settings import SpecSettings

    assert backend_supported("pytorch") and not backend_supported("token_oracle") and not backend_supported(None)
    with pytest.raises(ValueError, match="not mirrored"):
        filtered_probs(logits, _info(*zip(*CASES)), torch.ones(len(CASES), dtype=torch.int64), backend="ascend")
    assert not StepPolicy(SpecSettings(), gamma=3, vocab_size=V).sampled_ok
