"""K3Config: presets, HF round trip, 1-based layer lists, nested quantization, validation errors."""

from __future__ import annotations

import copy
import json

import pytest

from k3_sglang.config import K3Config, preset
from k3_sglang.config_presets import k3_layer_split


def test_full_preset_structure():
    cfg = preset("k3-full")
    assert (cfg.num_kda_layers, cfg.num_mla_layers) == (69, 24)
    assert cfg.mla.layer_ids[-2:] == (91, 92)
    assert cfg.mla.latent_dim == 576
    assert cfg.mla_kv_bytes_per_token() == 27_648
    assert cfg.kda_state_bytes_per_request() == 449_372_160
    assert cfg.kda_state_bytes_per_request(ssm_dtype_bytes=2) == 232_316_928
    assert cfg.quant.experts_mxfp4 and cfg.quant.group_size == 32
    assert cfg.attn_res.num_blocks(cfg.num_layers) == 8


def test_tiny_preset_keeps_every_structural_feature():
    cfg = preset("k3-tiny")
    kda, mla = set(cfg.kda.layer_ids), set(cfg.mla.layer_ids)
    assert {cfg.num_layers - 1, cfg.num_layers - 2} <= mla  # last two layers are MLA
    assert 0 in kda and not cfg.moe.is_moe_layer(0)  # dense first layer, KDA
    assert all(cfg.moe.is_moe_layer(i) for i in range(1, cfg.num_layers))
    assert cfg.moe.num_shared_experts > 0 and cfg.moe.routed_expert_hidden_size < cfg.hidden_size
    assert cfg.attn_res.num_blocks(cfg.num_layers) >= 2
    assert cfg.mla.q_lora_rank > 0 and cfg.mla.kv_lora_rank > 0 and cfg.mla.use_nope
    assert cfg.quant.experts_mxfp4
    assert cfg.tokens.eos == cfg.vocab_size - 256 + 2  # <|end_of_msg|> at K3's control offset


def test_layer_split_matches_published_lists():
    kda, mla = k3_layer_split(93)
    assert [i + 1 for i in mla] == list(range(4, 93, 4)) + [93]
    assert len(kda) == 69


@pytest.mark.parametrize("name", ["k3-full", "k3-tiny"])
def test_hf_round_trip(name):
    cfg = preset(name)
    hf = json.loads(json.dumps(cfg.to_hf()))
    assert "quantization_config" in hf["text_config"] and "quantization_config" not in hf
    back = K3Config.from_hf(hf, name=name)
    assert back == cfg


def test_flat_text_config_parses():
    hf = preset("k3-tiny").to_hf()
    flat = {**hf["text_config"]}
    assert K3Config.from_hf(flat, name="k3-tiny") == preset("k3-tiny")


def test_from_json_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(preset("k3-tiny").to_hf()))
    assert K3Config.from_json(tmp_path).kda == preset("k3-tiny").kda


def _mutated(path: list[str], value):
    hf = copy.deepcopy(preset("k3-tiny").to_hf())
    node = hf
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return hf


@pytest.mark.parametrize("path,value,field", [
    (["text_config", "hidden_size"], -4, "hidden_size"),
    (["text_config", "hidden_size"], "128", "hidden_size"),
    (["text_config", "num_experts"], KeyError, "num_experts"),
    (["text_config", "num_experts_per_token"], 99, "num_experts_per_token"),
    (["text_config", "hidden_act"], "silu", "hidden_act"),
    (["text_config", "mla_use_nope"], False, "mla_use_nope"),
    (["text_config", "linear_attn_config", "kda_layers"], [0, 1], "kda_layers"),
    (["text_config", "linear_attn_config", "full_attn_layers"], [4, 8], "full_attn_layers"),
    (["text_config", "linear_attn_config", "gate_lower_bound"], 1.0, "gate_lower_bound"),
    (["text_config", "topk_method"], "greedy", "topk_method"),
    (["text_config", "linear_attn_config", "num_heads"], KeyError, "linear_attn_config.num_heads"),
    (["text_config", "moe_intermediate_size"], 48, "moe_intermediate_size"),
])
def test_invalid_configs_name_the_field(path, value, field):
    with pytest.raises(ValueError, match=field):
        K3Config.from_hf(_mutated(path, value))


def test_unknown_preset_and_bad_json(tmp_path):
    with pytest.raises(ValueError, match="unknown K3 preset"):
        preset("k3-huge")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        K3Config.from_json(tmp_path)
    with pytest.raises(ValueError, match="no config.json"):
        K3Config.from_json(tmp_path / "missing")
