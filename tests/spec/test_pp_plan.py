"""K3_CSV's verify plan on the pipeline wire (spec/pp_plan.py): what the first stage sends is what later stages
run, a round without a plan is a plain decode, and a plan for another batch is refused."""
from __future__ import annotations

import random

import pytest
import torch

from k3_sglang.spec.pp_plan import (ACCEPT_KEY, PLAN_KEY, pack_accept, plain_plan, plan_from_wire, plan_to_wire,
                                     unpack_accept)


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
    assert list(wire) == [PLAN_KEY]  # one tensor: one message per hop
    assert wire[PLAN_KEY].dtype == torch.int64 and wire[PLAN_KEY].shape == (len(lens), 1 + gamma)
    got_lens, got_drafts = plan_from_wire({**wire, "hidden_states": torch.zeros(3, 2)}, len(lens))
    assert got_lens == lens
    assert got_drafts == [d[: n - 1] for d, n in zip(drafts, lens)]


def test_no_plan_on_the_wire_is_none_and_means_plain_decode():
    assert plan_from_wire({"hidden_states": torch.zeros(2, 4), "__msg_type__": "proxy"}, 2) is None
    assert plain_plan(3) == ([1, 1, 1], [[], [], []])


@pytest.mark.parametrize("tensors,bs,message", [
    (plan_to_wire([2, 1], [[5], []], 3), 3, "out of step"),
    ({PLAN_KEY: torch.tensor([2, 5])}, 1, "out of step"),
    ({PLAN_KEY: torch.tensor([[0, 1, 2, 3]])}, 1, "outside 1..4"),
    ({PLAN_KEY: torch.tensor([[5, 1, 2, 3]])}, 1, "outside 1..4"),
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


def test_accept_results_pack_into_one_tensor_and_back():
    out = {"next_token_ids": torch.arange(6), "spec_accept_lens": torch.tensor([2, 1, 3], dtype=torch.int32),
           "spec_new_seq_lens": torch.tensor([10, 20, 30], dtype=torch.int64),
           "spec_bonus_tokens": torch.tensor([7, 8, 9])}
    plain_round = pack_accept(out, 4)
    assert set(plain_round) == {"next_token_ids", ACCEPT_KEY} and plain_round[ACCEPT_KEY].shape == (4, 3)
    back = unpack_accept(plain_round, torch.int32, 4)
    assert back["spec_accept_lens"].dtype == torch.int32 and back["spec_new_seq_lens"].dtype == torch.int32
    assert back["spec_accept_lens"].tolist() == [2, 1, 3] and back["spec_bonus_tokens"].tolist() == [7, 8, 9]
    assert back["spec_new_seq_lens"].tolist() == [10, 20, 30] and torch.equal(back["next_token_ids"], torch.arange(6))
    assert "spec_accept_index" not in back  # no verify: nothing for SGLang to commit
    index = torch.tensor([[0, 1, -1, -1], [4, -1, -1, -1], [8, 9, 10, -1]])
    verify_round = pack_accept({**out, "spec_accept_index": index}, 4)
    assert set(verify_round) == {"next_token_ids", ACCEPT_KEY}  # still one tensor on the wire
    assert torch.equal(unpack_accept(verify_round, torch.int64, 4)["spec_accept_index"], index)
    plain = {"next_token_ids": torch.arange(2)}
    assert pack_accept(plain, 4) is plain  # an extend round without speculative entries travels as it is
    assert unpack_accept({"next_token_ids": torch.arange(2)}, torch.int64, 4) is None
    with pytest.raises(ValueError, match="different lengths"):
        pack_accept({**out, "spec_bonus_tokens": torch.tensor([1])}, 4)
    with pytest.raises(ValueError, match="not the chain"):
        pack_accept({**out, "spec_accept_index": index.flip(0)}, 4)
    with pytest.raises(ValueError, match=r"\[4, B\]"):
        unpack_accept({ACCEPT_KEY: torch.zeros(3, 3)}, torch.int64, 4)
