"""The speculative-sampling acceptance rule (k3_sglang/spec/rejection.py): its output distribution is plain sampling.

A two-position "target model" on V = 8 tokens (p0 for the first token, p1[t1] for the second) is served by
speculative decoding: one verify step over root + two drafts, and, when it emitted only one token, a second verify
step for position two. The joint distribution of the emitted (t1, t2) over N requests (one batched call, fixed
seeds) must pass a chi-square goodness-of-fit test against p0(t1) * p1[t1](t2) (the 56 cells the target can emit, 55
degrees of freedom, p-value > 1e-3), for point-mass drafts (K3_CSV's drafters) and for drafts drawn from a general
q. The same check must reject two deliberately wrong rules: accept every draft, and draw from p instead of the
residual after a rejection. About 3 s on 2 CPU cores.
"""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from k3_sglang.spec.rejection import request_coins, sample_inverse_cdf, speculative_sample

V, N = 8, 60_000
P_VALUE_BOUND = 1e-3


def _dist(gen: torch.Generator, *shape: int, sharp: float = 1.5) -> torch.Tensor:
    return torch.softmax(sharp * torch.randn(*shape, V, generator=gen, dtype=torch.float64), dim=-1)


@pytest.fixture(scope="module")
def model():
    """p0 [V], p1 [V, V] (second token given the first), p2 [V, V, V] (third given both), q0, q1 alike."""
    gen = torch.Generator().manual_seed(7)
    p0, p1, p2 = _dist(gen), _dist(gen, V), _dist(gen, V, V)
    p0[3] = 0.0  # a token the target never emits (top-k/top-p cut it)
    p0 /= p0.sum()
    q0, q1 = _dist(gen, sharp=1.0), _dist(gen, V, sharp=1.0)
    return p0, p1, p2, q0, q1


def _draw(dist: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return sample_inverse_cdf(dist, torch.rand(dist.shape[0], generator=gen, dtype=torch.float64))


def _serve_two_tokens(model, point_mass: bool, rule=speculative_sample, seed: int = 0) -> torch.Tensor:
    """[N, 2] tokens emitted by speculative decoding with `rule`, drafts fixed (point mass) or drawn from q."""
    p0, p1, p2, q0, q1 = model
    gen = torch.Generator().manual_seed(seed)
    if point_mass:
        x1, x2 = torch.full((N,), 2), torch.full((N,), 5)
        draft_probs = None
    else:
        x1 = _draw(q0.expand(N, V), gen)
        x2 = _draw(q1[x1], gen)
        draft_probs = torch.stack([q0.expand(N, V), q1[x1]], dim=1)
    target = torch.stack([p0.expand(N, V), p1[x1], p2[x1, x2]], dim=1)  # [N, 3, V]
    lens = torch.full((N,), 3)
    commit, out = rule(target, torch.stack([x1, x2], 1), lens, torch.rand(N, 2, generator=gen, dtype=torch.float64),
                       torch.rand(N, generator=gen, dtype=torch.float64), draft_probs)
    t1 = out[:, 0]
    # requests that emitted one token verify position two in a second step: root t1, one draft
    y = torch.full((N,), 5) if point_mass else _draw(q1[t1], gen)
    second_q = None if point_mass else torch.stack([q1[t1]], dim=1)
    target2 = torch.stack([p1[t1], p2[t1, y]], dim=1)
    _, out2 = rule(target2, y[:, None], torch.full((N,), 2), torch.rand(N, 1, generator=gen, dtype=torch.float64),
                   torch.rand(N, generator=gen, dtype=torch.float64), second_q)
    t2 = torch.where(commit >= 2, out[:, 1], out2[:, 0])
    return torch.stack([t1, t2], dim=1)


def _joint_p_value(model, tokens: torch.Tensor) -> float:
    p0, p1 = model[0], model[1]
    expected = (p0[:, None] * p1).flatten()
    observed = torch.bincount(tokens[:, 0] * V + tokens[:, 1], minlength=V * V).to(torch.float64)
    assert observed[expected == 0].sum() == 0, "a token the target never emits was emitted"
    keep = expected > 0
    return float(chisquare(observed[keep].numpy(), (N * expected[keep]).numpy()).pvalue)


def _always_accept(target, drafts, lens, coins, final, draft_probs=None):
    return speculative_sample(target, drafts, lens, torch.zeros_like(coins), final, torch.zeros_like(target[:, 1:]))


def _residual_replaced_by_p(target, drafts, lens, coins, final, draft_probs=None):
    commit, out = speculative_sample(target, drafts, lens, coins, final, draft_probs)
    rows = torch.arange(target.shape[0])
    redraw = sample_inverse_cdf(target[rows, commit - 1], final)
    rejected = commit < lens
    out[rows[rejected], (commit - 1)[rejected]] = redraw[rejected]
    return commit, out


@pytest.mark.parametrize("point_mass", [True, False], ids=["point-mass-q", "general-q"])
def test_joint_of_two_positions_matches_plain_sampling(model, point_mass):
    tokens = _serve_two_tokens(model, point_mass)
    assert _joint_p_value(model, tokens) > P_VALUE_BOUND


@pytest.mark.parametrize("rule", [_always_accept, _residual_replaced_by_p], ids=["always-accept", "no-residual"])
@pytest.mark.parametrize("point_mass", [True, False], ids=["point-mass-q", "general-q"])
def test_wrong_rules_fail_the_same_check(model, point_mass, rule):
    tokens = _serve_two_tokens(model, point_mass, rule=rule)
    assert _joint_p_value(model, tokens) < P_VALUE_BOUND


def test_point_mass_target_is_greedy_acceptance():
    """With p a point mass (top-k 1), a draft is kept iff it is the argmax, and the emitted token is the argmax."""
    gen = torch.Generator().manual_seed(3)
    argmax = torch.randint(0, V, (64, 4), generator=gen)
    target = torch.nn.functional.one_hot(argmax, V).to(torch.float64)
    drafts = torch.where(torch.rand(64, 3, generator=gen) < 0.7, argmax[:, :3], (argmax[:, :3] + 1) % V)
    lens = torch.randint(1, 5, (64,), generator=gen)
    commit, out = speculative_sample(target, drafts, lens, torch.rand(64, 3, generator=gen),
                                     torch.rand(64, generator=gen))
    for b in range(64):
        c = 0
        while c + 1 < int(lens[b]) and int(drafts[b, c]) == int(argmax[b, c]):
            c += 1
        assert int(commit[b]) == c + 1
        assert out[b, : c + 1].tolist() == argmax[b, : c + 1].tolist()


def test_lengths_and_shapes_are_checked():
    target = torch.full((2, 3, V), 1.0 / V)
    with pytest.raises(ValueError, match="drafts"):
        speculative_sample(target, torch.zeros(2, 3, dtype=torch.int64), torch.tensor([3, 3]),
                           torch.zeros(2, 2), torch.zeros(2))
    commit, out = speculative_sample(target, torch.zeros(2, 2, dtype=torch.int64), torch.tensor([1, 2]),
                                     torch.zeros(2, 2), torch.zeros(2))
    assert commit[0] == 1 and commit[1] == 2  # a length-1 chain only draws its bonus token; coins 0 accept


def test_seeded_coins_depend_on_seed_and_position_only():
    a1, f1 = request_coins([11, None, 11], [40, 40, 41], 4, generator=torch.Generator().manual_seed(0))
    a2, f2 = request_coins([5, 11], [9, 40], 4)
    assert torch.equal(a1[0], a2[1]) and f1[0] == f2[1]
    assert not torch.equal(a1[0], a1[2])  # the next position draws new coins
    assert a1.shape == (3, 3) and f1.shape == (3,) and bool(((a1 >= 0) & (a1 < 1)).all())


def test_inverse_cdf_never_draws_a_zero_weight_token():
    weights = torch.tensor([[0.0, 1.0, 0.0, 2.0, 0.0]] * 5, dtype=torch.float64)
    coins = torch.tensor([0.0, 0.3333, 0.34, 0.999999, 1.0], dtype=torch.float64)
    assert sample_inverse_cdf(weights, coins).tolist() == [1, 1, 3, 3, 3]
