"""Loading K3-layout safetensors into the model: MXFP4 experts, A_log narrowing, clear errors."""

from __future__ import annotations

import pytest
import torch

from k3_sglang.config import preset
from k3_sglang.kernels.mxfp4.naive import dequant_mxfp4
from k3_sglang.loader.weights import K3WeightLoader, WeightLoadError, canonical_name
from k3_sglang.model.decoder import K3Model
from k3_sglang.tiny.checkpoint import tiny_state_dict


class _Holder(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.model = K3Model(cfg)
        self.lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)


@pytest.fixture(scope="module")
def state():
    return tiny_state_dict(preset("k3-tiny"))


def test_canonical_names():
    assert canonical_name("language_model.model.layers.3.self_attn.g_proj.weight") == "model.layers.3.self_attn.g_proj.weight"
    assert canonical_name("model.norm.weight") == "model.norm.weight"
    assert canonical_name("language_model.lm_head.weight") == "lm_head.weight"
    assert canonical_name("vision_tower.blocks.0.wqkv.weight") is None
    assert canonical_name("mm_projector.proj.0.weight") is None


def test_full_load_dequantises_experts_and_keeps_fp32(state):
    cfg = preset("k3-tiny")
    model = _Holder(cfg)
    loader = K3WeightLoader(model)
    loader.load(state.items())
    loader.finish()
    pre = "language_model.model.layers.2.block_sparse_moe.experts.5.w2."
    want = dequant_mxfp4(state[pre + "weight_packed"], state[pre + "weight_scale"])
    assert torch.equal(model.model.layers[2].block_sparse_moe.experts.w2[5], want)
    kda = model.model.layers[0].self_attn
    assert kda.q_conv1d.weight.dtype == torch.float32 and kda.A_log.dtype == torch.float32
    # the KDA g_proj (output gate) and the MLA g_proj land on their own layer types
    assert torch.equal(model.model.layers[3].self_attn.g_proj.weight,
                       state["language_model.model.layers.3.self_attn.g_proj.weight"].float())


def test_a_log_is_narrowed(state):
    cfg = preset("k3-tiny")
    model = _Holder(cfg)
    name = "language_model.model.layers.0.self_attn.A_log"
    wide = torch.arange(40, dtype=torch.float32)
    loader = K3WeightLoader(model)
    loader.load([(name, wide)])
    assert torch.equal(model.model.layers[0].self_attn.A_log, wide[: cfg.kda.num_heads])


@pytest.mark.parametrize("mutation,match", [
    ("drop", "missing"),
    ("shape", "shape"),
    ("unknown", "no matching model parameter"),
    ("half-expert", "MXFP4 expert"),
])
def test_bad_checkpoints_raise_clear_errors(state, mutation, match):
    bad = dict(state)
    if mutation == "drop":
        del bad["language_model.model.layers.4.self_attn.dt_bias"]
    elif mutation == "shape":
        bad["language_model.model.norm.weight"] = torch.ones(7)
    elif mutation == "unknown":
        bad["language_model.model.layers.0.self_attn.q_norm.weight"] = torch.ones(3)
    else:
        del bad["language_model.model.layers.1.block_sparse_moe.experts.3.w3.weight_scale"]
    loader = K3WeightLoader(_Holder(preset("k3-tiny")))
    with pytest.raises(WeightLoadError, match=match):
        loader.load(bad.items())
        loader.finish()
