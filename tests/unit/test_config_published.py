"""config.json shaped like the published K3 one (tests/data/k3-published/config.json: every field the design notes
list for the model card, the vision tower at SGLang's KimiK3VisionConfig defaults) parses to the k3-full preset and
agrees with SGLang's own KimiK3Config; keys SGLang defaults take SGLang's defaults; the quantization format is read
per config group as SGLang's compressed-tensors loader reads it. About 30 s (imports SGLang's config classes)."""
from __future__ import annotations

import copy
import dataclasses
import inspect
import json
from pathlib import Path

import pytest
from sglang.srt.configs.kimi_k3 import KimiK3Config
from sglang.srt.configs.kimi_linear import KimiLinearConfig
from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

from k3_sglang.config import K3Config, preset
from k3_sglang.config_hf import SGLANG_LINEAR_ATTN_DEFAULTS, SGLANG_TEXT_DEFAULTS, parse_hf_config

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "k3-published"
PUBLISHED = json.loads((FIXTURE / "config.json").read_text())
# K3Config field for each defaulted text_config key
FIELD = {
    "vocab_size": lambda c: c.vocab_size, "hidden_size": lambda c: c.hidden_size,
    "intermediate_size": lambda c: c.moe.dense_intermediate_size, "num_attention_heads": lambda c: c.mla.num_heads,
    "rms_norm_eps": lambda c: c.rms_norm_eps, "tie_word_embeddings": lambda c: c.tie_word_embeddings,
    "moe_renormalize": lambda c: c.moe.renormalize, "moe_router_activation_func": lambda c: c.moe.router_activation,
    "num_shared_experts": lambda c: c.moe.num_shared_experts, "routed_scaling_factor": lambda c: c.moe.routed_scaling_factor,
    "first_k_dense_replace": lambda c: c.moe.first_k_dense_replace, "moe_layer_freq": lambda c: c.moe.moe_layer_freq,
    "num_expert_group": lambda c: c.moe.num_expert_group, "topk_group": lambda c: c.moe.topk_group,
    "topk_method": lambda c: c.moe.topk_method, "latent_moe_use_norm": lambda c: c.moe.latent_moe_use_norm,
    "max_position_embeddings": lambda c: c.max_position_embeddings,
    "bos_token_id": lambda c: c.tokens.bos, "eos_token_id": lambda c: c.tokens.eos, "pad_token_id": lambda c: c.tokens.pad,
}
# keys whose SGLang default describes another architecture than K3's: refused, the key named
ARCHITECTURE_KEYS = {"hidden_act", "mla_use_nope", "mla_use_output_gate"}


def test_published_shape_parses_to_the_k3_full_preset():
    assert K3Config.from_json(FIXTURE) == dataclasses.replace(preset("k3-full"), name="k3-published")


def test_sglang_reads_the_same_model():
    sglang = KimiK3Config(**copy.deepcopy(PUBLISHED))
    ours = K3Config.from_json(FIXTURE)
    text = sglang.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.vocab_size) == (ours.hidden_size, ours.num_layers, ours.vocab_size)
    assert tuple(text.linear_layer_ids) == ours.kda.layer_ids and tuple(text.full_attention_layer_ids) == ours.mla.layer_ids
    assert (text.num_experts, text.num_experts_per_tok, text.moe_intermediate_size) == (
        ours.moe.num_experts, ours.moe.num_experts_per_token, ours.moe.moe_intermediate_size)
    assert sglang.quantization_config["format"] == "mxfp4-pack-quantized" and ours.quant.experts_mxfp4


def test_default_table_matches_sglangs_config_class():
    params = inspect.signature(KimiLinearConfig.__init__).parameters
    assert SGLANG_TEXT_DEFAULTS == {key: params[key].default for key in SGLANG_TEXT_DEFAULTS}
    from sglang.srt.models import kimi_k3

    source = inspect.getsource(kimi_k3)
    for key, value in SGLANG_LINEAR_ATTN_DEFAULTS.items():
        assert f'get(\n            "{key}", {value}\n        )' in source or f'get("{key}", {value})' in source


@pytest.mark.parametrize("key", sorted(SGLANG_TEXT_DEFAULTS))
def test_a_missing_key_takes_sglangs_default(key):
    hf = copy.deepcopy(PUBLISHED)
    for level in (hf, hf["text_config"]):  # token ids also sit at the top level
        level.pop(key, None)
    sglang_value = getattr(KimiLinearConfig(**copy.deepcopy(hf["text_config"])), key)
    if key in ARCHITECTURE_KEYS:
        with pytest.raises(ValueError, match=key):
            parse_hf_config(hf)
    elif key == "num_hidden_layers":  # SGLang's 32 layers cannot hold the 93-entry layer lists: named there
        with pytest.raises(ValueError, match="linear_attn_config"):
            parse_hf_config(hf)
    else:
        assert FIELD[key](parse_hf_config(hf)) == sglang_value


def test_missing_k3_gates_are_named():
    hf = copy.deepcopy(PUBLISHED)
    del hf["text_config"]["linear_attn_config"]["use_full_rank_gate"]  # SGLang: False
    with pytest.raises(ValueError, match="use_full_rank_gate"):
        parse_hf_config(hf)
    hf = copy.deepcopy(PUBLISHED)
    del hf["text_config"]["linear_attn_config"]["gate_lower_bound"]  # SGLang: None, the plain KDA gate
    with pytest.raises(ValueError, match="gate_lower_bound: missing"):
        parse_hf_config(hf)


def _quant_variant(top_format, group_format, **extra):
    hf = copy.deepcopy(PUBLISHED)
    qc = hf["text_config"]["quantization_config"]
    qc.pop("format")
    if top_format is not None:
        qc["format"] = top_format
    if group_format is not None:
        qc["config_groups"]["group_0"]["format"] = group_format
    qc.update(extra)
    return hf


@pytest.mark.parametrize("top,group", [("mxfp4-pack-quantized", None), (None, "mxfp4-pack-quantized"),
                                       ("mixed-precision", "mxfp4-pack-quantized")])
def test_format_read_per_group_as_sglang_does(top, group):
    hf = _quant_variant(top, group)
    quant = parse_hf_config(hf).quant
    assert quant.experts_mxfp4 and quant.group_size == 32 and quant.cpu_problem() is None
    scheme = CompressedTensorsConfig.from_config(hf["text_config"]["quantization_config"]).target_scheme_map["Linear"]
    assert scheme["format"] == group  # SGLang keeps the group's own format (None: the top-level one applies)


def test_other_quantizations_parse_and_are_refused_on_cpu(tmp_path):
    from k3_sglang.deployment import parse_sglang_argv
    from k3_sglang.serving.sglang_cpu_limits import refusals

    for hf, named in ((_quant_variant("mixed-precision", "nvfp4-pack-quantized"), "nvfp4-pack-quantized"),
                      (_quant_variant("float-quantized", None, quant_method="fp8"), "fp8")):
        cfg = parse_hf_config(hf)
        assert cfg.quant.method == "other" and named in cfg.quant.scheme and named in cfg.quant.cpu_problem()
        (tmp_path / "config.json").write_text(json.dumps(hf))
        reasons = refusals(parse_sglang_argv(["--model-path", str(tmp_path), "--disable-cuda-graph"]))
        assert any("SGLang's K3 on CPU loads unquantised checkpoints or MXFP4" in r for r in reasons)
