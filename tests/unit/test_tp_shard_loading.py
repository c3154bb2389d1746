"""Loading the tiny K3 as each rank of a TP / EP layout: every sharded parameter holds exactly its block of the
single-rank parameter (concatenating the ranks' blocks rebuilds it), replicated ones equal it, and EP ranks hold
their whole experts. MXFP4 experts are dequantised before they are sliced."""
from __future__ import annotations

import pytest
import torch

from k3_sglang.config import preset
from k3_sglang.loader.weights import K3WeightLoader
from k3_sglang.model.decoder import K3Model
from k3_sglang.model.parallel import ModelParallel, use_model_parallel
from k3_sglang.parallel.tp import Shard
from k3_sglang.tiny.checkpoint import tiny_state_dict


class _Holder(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.model = K3Model(cfg)
        self.lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)


def _load(cfg, state, mp: ModelParallel) -> dict[str, torch.Tensor]:
    with use_model_parallel(mp):
        model = _Holder(cfg)
    loader = K3WeightLoader(model)
    loader.load(state.items())
    loader.finish()
    return dict(model.named_parameters())


@pytest.fixture(scope="module")
def single():
    cfg = preset("k3-tiny")
    state = tiny_state_dict(cfg, seed=3)
    return cfg, state, _load(cfg, state, ModelParallel())


def _layout(tp: int, ep: int, rank: int) -> ModelParallel:
    moe_tp = tp // ep
    return ModelParallel(attn_tp=Shard(tp, rank), tp=Shard(tp, rank), moe_tp=Shard(moe_tp, rank % moe_tp),
                         moe_ep=Shard(ep, rank // moe_tp))


@pytest.mark.parametrize("tp,ep", [(2, 1), (4, 1), (4, 2), (2, 2)])
def test_rank_blocks_rebuild_the_single_rank_parameters(single, tp, ep):
    cfg, state, whole = single
    ranks = [_load(cfg, state, _layout(tp, ep, r)) for r in range(tp)]
    sharded = 0
    for name, full in whole.items():
        blocks = [r[name] for r in ranks]
        shard = getattr(blocks[0], "k3_shard", None)
        if name.endswith(("experts.w1", "experts.w2", "experts.w3")):
            moe_tp = tp // ep
            dim = shard[0] if shard else None
            for r, b in enumerate(blocks):
                ep_rank, tp_rank = r // moe_tp, r % moe_tp
                e = full.shape[0] // ep
                want = full[ep_rank * e: (ep_rank + 1) * e]
                if dim is not None:
                    n = want.shape[dim] // moe_tp
                    want = want.narrow(dim, tp_rank * n, n)
                assert torch.equal(b, want), f"{name} rank {r}"
            sharded += dim is not None or ep > 1
        elif shard is not None:
            dim = shard[0]
            assert torch.equal(torch.cat(blocks, dim), full), name
            sharded += 1
        else:
            for r, b in enumerate(blocks):
                assert torch.equal(b, full), f"{name} replicated on rank {r}"
    assert sharded >= 10, f"only {sharded} sharded parameters"
