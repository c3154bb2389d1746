"""K3_CSV's verify plan on the pipeline wire (spec/pp_plan.py): what the first stage sends is what later stages
run, and a plan for another batch is refused."""
from __future__ import annotations

import random

import pytest
import torch

from k3_sglang.spec.pp_plan import DRAFTS_KEY, LENS_KEY, plan_from_wire, plan_to_wire


def _random_plan(rng: random.Random, bs: int, gamma: int) -> tuple[list[int], list[list[int]]]:
    lens = [rng.randint(1, gamma + 1) for _ in range(bs)]
    drafts = [[rng.randrange(1 << 20) for _ in range(rng.randint(n - 1, gamma))] for n in lens]  # extra drafts ok
    return lens, drafts


@pytest.mark.parametrize("seed", range(20))
def test_round_trip_keeps_lengths_and_the_verified_drafts(seed):
    rng = random.Random(seed)
    gamma = rng.randint(1, 8)
    lens, drafts = _random_plan(rng, rng.randint(1, 40), gamma)
    wire = plan_to_wire(lens, drafts, gamma)
    assert wire[LENS_KEY].dtype == wire[DRAFTS_KEY].dtype == torch.int64
    assert wire[DRAFTS_KEY].shape == (len(lens), gamma)
    got_lens, got_drafts = plan_from_wire({**wire, "hidden_states": torch.zeros(3, 2)}, len(lens))
    assert got_lens == lens
    assert got_drafts == [d[: n - 1] for d, n in zip(drafts, lens)]


def test_no_plan_on_the_wire_is_none():
    assert plan_from_wire({"hidden_states": torch.zeros(2, 4), "__msg_type__": "proxy"}, 2) is None


@pytest.mark.parametrize("tensors,bs,message", [
    (plan_to_wire([2, 1], [[5], []], 3), 3, "out of step"),
    ({LENS_KEY: torch.tensor([1])}, 1, "needs both"),
    ({LENS_KEY: torch.tensor([0]), DRAFTS_KEY: torch.zeros(1, 3, dtype=torch.int64)}, 1, "outside 1..4"),
    ({LENS_KEY: torch.tensor([5]), DRAFTS_KEY: torch.zeros(1, 3, dtype=torch.int64)}, 1, "outside 1..4"),
])
def test_malformed_or_foreign_plans_are_refused(tensors, bs, message):
    with pytest.raises(ValueError, match=message):
        plan_from_wire(tensors, bs)


@pytest.mark.parametrize("lens,drafts,gamma,message", [
    ([3], [[1]], 3, "has 1 drafts"),
    ([5], [[1, 2, 3, 4]], 3, "outside 1..4"),
    ([1, 1], [[]], 3, "2 lengths for 1"),
    ([1], [[]], 0, "gamma must be >= 1"),
])
def test_bad_plans_are_not_sent(lens, drafts, gamma, message):
    with pytest.raises(ValueError, match=message):
        plan_to_wire(lens, drafts, gamma)
