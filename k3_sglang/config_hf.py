"""HF `config.json` <-> `K3Config`.

The published checkpoint nests the text model under `text_config` (with the
quantization_config inside it); a text-only export may be flat. Layer lists are 1-based
in the file and 0-based in `K3Config`.

What SGLang's own K3 config accepts is accepted here: a key SGLang's `KimiLinearConfig` gives a default takes that
default when config.json leaves it out (`SGLANG_TEXT_DEFAULTS`; tests/unit/test_config_published.py checks the table
against the installed class), and the quantization format is read per config group, as SGLang's compressed-tensors
loader reads it (a group's `format` wins over the top-level one, which may be "mixed-precision" or absent). Keys
SGLang leaves without a default (the layer lists, head counts, ranks, expert counts) are required, and K3's
architecture is checked: where SGLang's defaults describe another model (SiLU instead of SiTU, RoPE, no MLA gate, no
full-rank or lower-bound KDA gate) the field is named. A quantization other than MXFP4 experts parses as 'other'
(SGLang's K3 may load it on a GPU; refused on CPU, serving/sglang_cpu_limits.py).
"""

from __future__ import annotations

from k3_sglang.config import (
    MXFP4_FORMAT,
    MXFP4_IGNORE,
    AttnResConfig,
    K3Config,
    KDAConfig,
    MLAConfig,
    MoEConfig,
    QuantConfig,
    SiTUConfig,
    TokenIds,
    _require,
    _take,
    _take_opt,
)

TOP_ARCHITECTURE = "KimiK3ForConditionalGeneration"
TEXT_ARCHITECTURE = "KimiLinearForCausalLM"

# SGLang 0.5.23 `KimiLinearConfig.__init__` defaults of the text_config keys read here (None-default keys excluded).
SGLANG_TEXT_DEFAULTS = {
    "vocab_size": 163840, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "hidden_act": "silu", "rms_norm_eps": 1e-6, "pad_token_id": 0, "bos_token_id": 1,
    "eos_token_id": 2, "tie_word_embeddings": False, "moe_renormalize": True, "moe_router_activation_func": "sigmoid",
    "num_shared_experts": 0, "routed_scaling_factor": 1.0, "first_k_dense_replace": 0, "moe_layer_freq": 1,
    "num_expert_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "mla_use_nope": False,
    "latent_moe_use_norm": False, "mla_use_output_gate": False, "max_position_embeddings": 4096,
}
# linear_attn_config keys SGLang's K3 model reads with .get() and a default
SGLANG_LINEAR_ATTN_DEFAULTS = {"use_full_rank_gate": False}


def _text(tc: dict, name: str, kind: type):
    """A text_config key: its value, SGLang's default when missing, or an error naming it when SGLang has none."""
    if name in tc or name not in SGLANG_TEXT_DEFAULTS:
        return _take(tc, name, kind)
    return SGLANG_TEXT_DEFAULTS[name]


def _default_note(tc: dict, name: str) -> str:
    return f" (SGLang's default when {name} is missing)" if name not in tc else ""


def _layer_list(lac: dict, name: str, num_layers: int) -> tuple[int, ...]:
    raw = _take(lac, name, list, "linear_attn_config.")
    for v in raw:
        _require(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= num_layers,
                 f"linear_attn_config.{name}", f"entries are 1-based layer numbers in 1..{num_layers}, got {v!r}")
    _require(len(set(raw)) == len(raw), f"linear_attn_config.{name}", "duplicate entries")
    return tuple(sorted(v - 1 for v in raw))


def _is_mxfp4_group(group: dict, top_format: object) -> bool:
    weights = group.get("weights") or {}
    return ((group.get("format") or top_format) == MXFP4_FORMAT and isinstance(weights, dict)
            and weights.get("num_bits") == 4 and weights.get("type") == "float")


def _parse_quant(tc: dict) -> QuantConfig:
    qc = tc.get("quantization_config")
    if qc is None:
        return QuantConfig()
    _require(isinstance(qc, dict), "quantization_config", f"expected an object, got {type(qc).__name__}")
    method, top = qc.get("quant_method", "compressed-tensors"), qc.get("format")
    groups = qc.get("config_groups")
    if method != "compressed-tensors" or not isinstance(groups, dict) or not groups:
        return QuantConfig(method="other", scheme=f"quant_method {method!r}, format {top!r}")
    for name, group in groups.items():
        _require(isinstance(group, dict), f"quantization_config.config_groups.{name}", "expected an object")
    if not all(_is_mxfp4_group(g, top) for g in groups.values()):
        formats = sorted({str(g.get("format") or top) for g in groups.values()})
        return QuantConfig(method="other", scheme=f"compressed-tensors {', '.join(formats)}")
    name, group = next(iter(groups.items()))
    ignore = qc.get("ignore", [])
    _require(isinstance(ignore, list), "quantization_config.ignore", "expected a list")
    return QuantConfig(method="mxfp4", ignore=tuple(ignore),
                       group_size=_take(group["weights"], "group_size", int, f"quantization_config.config_groups.{name}.weights."))


def _token_id(hf: dict, tc: dict, name: str) -> int:
    """A control-token id: the top level's (KimiK3Config), else text_config's, else SGLang's text default."""
    return _take(hf, name, int) if hf.get(name) is not None else _text(tc, name, int)


def parse_hf_config(hf: dict, name: str = "custom") -> K3Config:
    """Parse a K3 HF config (nested `text_config` or flat) into a `K3Config`; ValueError names the field."""
    _require(isinstance(hf, dict), "config.json", f"expected a JSON object, got {type(hf).__name__}")
    tc = hf.get("text_config", hf)
    _require(isinstance(tc, dict), "text_config", f"expected an object, got {type(tc).__name__}")
    num_layers = _text(tc, "num_hidden_layers", int)
    lac = _take(tc, "linear_attn_config", dict)
    act = _text(tc, "hidden_act", str)
    _require(act == "situ", "hidden_act", f"K3 uses 'situ', got {act!r}{_default_note(tc, 'hidden_act')}")
    _require("gate_lower_bound" in lac, "linear_attn_config.gate_lower_bound",
             "missing (without it SGLang runs KDA's plain decay gate, not K3's lower-bound gate)")
    kda = KDAConfig(
        num_heads=_take(lac, "num_heads", int, "linear_attn_config."),
        head_dim=_take(lac, "head_dim", int, "linear_attn_config."),
        conv_kernel_size=_take(lac, "short_conv_kernel_size", int, "linear_attn_config."),
        gate_lower_bound=_take(lac, "gate_lower_bound", float, "linear_attn_config."),
        use_full_rank_gate=_take_opt(lac, "use_full_rank_gate", bool, SGLANG_LINEAR_ATTN_DEFAULTS["use_full_rank_gate"],
                                     "linear_attn_config."),
        layer_ids=_layer_list(lac, "kda_layers", num_layers),
    )
    mla = MLAConfig(
        num_heads=_text(tc, "num_attention_heads", int),
        q_lora_rank=_take(tc, "q_lora_rank", int),
        kv_lora_rank=_take(tc, "kv_lora_rank", int),
        qk_nope_head_dim=_take(tc, "qk_nope_head_dim", int),
        qk_rope_head_dim=_take(tc, "qk_rope_head_dim", int),
        v_head_dim=_take(tc, "v_head_dim", int),
        use_nope=_text(tc, "mla_use_nope", bool),
        use_output_gate=_text(tc, "mla_use_output_gate", bool),
        lora_norm_eps=_take_opt(tc, "mla_lora_norm_eps", float, 1e-6),
        layer_ids=_layer_list(lac, "full_attn_layers", num_layers),
    )
    moe = MoEConfig(
        num_experts=_take(tc, "num_experts", int),
        num_experts_per_token=_take(tc, "num_experts_per_token", int),
        num_shared_experts=_text(tc, "num_shared_experts", int),
        moe_intermediate_size=_take(tc, "moe_intermediate_size", int),
        routed_expert_hidden_size=_take(tc, "routed_expert_hidden_size", int),
        latent_moe_use_norm=_text(tc, "latent_moe_use_norm", bool),
        router_activation=_text(tc, "moe_router_activation_func", str),
        topk_method=_text(tc, "topk_method", str),
        num_expert_group=_text(tc, "num_expert_group", int),
        topk_group=_text(tc, "topk_group", int),
        renormalize=_text(tc, "moe_renormalize", bool),
        routed_scaling_factor=_text(tc, "routed_scaling_factor", float),
        first_k_dense_replace=_text(tc, "first_k_dense_replace", int),
        moe_layer_freq=_text(tc, "moe_layer_freq", int),
        dense_intermediate_size=_text(tc, "intermediate_size", int),
    )
    return K3Config(
        hidden_size=_text(tc, "hidden_size", int),
        num_layers=num_layers,
        vocab_size=_text(tc, "vocab_size", int),
        rms_norm_eps=_text(tc, "rms_norm_eps", float),
        max_position_embeddings=_text(tc, "max_position_embeddings", int),
        tie_word_embeddings=_text(tc, "tie_word_embeddings", bool),
        tokens=TokenIds(bos=_token_id(hf, tc, "bos_token_id"), eos=_token_id(hf, tc, "eos_token_id"),
                        pad=_token_id(hf, tc, "pad_token_id")),
        kda=kda,
        mla=mla,
        moe=moe,
        attn_res=AttnResConfig(block_size=_take(tc, "attn_res_block_size", int)),
        situ=SiTUConfig(beta=_take(tc, "activation_situ_beta", float), linear_beta=_take(tc, "activation_situ_linear_beta", float)),
        quant=_parse_quant(tc),
        name=name,
    )


def _quant_to_hf(q: QuantConfig) -> dict | None:
    if not q.experts_mxfp4:
        return None
    return {
        "quant_method": "compressed-tensors",
        "format": MXFP4_FORMAT,
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "float", "group_size": q.group_size, "strategy": "group",
                        "symmetric": True, "scale_dtype": "torch.uint8", "dynamic": False},
            "input_activations": None,
        }},
        "ignore": list(q.ignore or MXFP4_IGNORE),
    }


def to_hf_config(cfg: K3Config) -> dict:
    """Write `cfg` in the published nested layout (parse_hf_config(to_hf_config(c)) == c)."""
    text = {
        "architectures": [TEXT_ARCHITECTURE],
        "model_type": "kimi_linear",
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "vocab_size": cfg.vocab_size,
        "intermediate_size": cfg.moe.dense_intermediate_size,
        "first_k_dense_replace": cfg.moe.first_k_dense_replace,
        "moe_layer_freq": cfg.moe.moe_layer_freq,
        "hidden_act": "situ",
        "activation_situ_beta": cfg.situ.beta,
        "activation_situ_linear_beta": cfg.situ.linear_beta,
        "num_attention_heads": cfg.mla.num_heads,
        "num_key_value_heads": cfg.mla.num_heads,
        "head_dim": cfg.mla.qk_head_dim,
        "q_lora_rank": cfg.mla.q_lora_rank,
        "kv_lora_rank": cfg.mla.kv_lora_rank,
        "qk_nope_head_dim": cfg.mla.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.mla.qk_rope_head_dim,
        "v_head_dim": cfg.mla.v_head_dim,
        "mla_use_nope": cfg.mla.use_nope,
        "mla_use_output_gate": cfg.mla.use_output_gate,
        "mla_lora_norm_eps": cfg.mla.lora_norm_eps,
        "linear_attn_config": {
            "num_heads": cfg.kda.num_heads,
            "head_dim": cfg.kda.head_dim,
            "short_conv_kernel_size": cfg.kda.conv_kernel_size,
            "use_full_rank_gate": cfg.kda.use_full_rank_gate,
            "gate_lower_bound": cfg.kda.gate_lower_bound,
            "full_attn_layers": [i + 1 for i in cfg.mla.layer_ids],
            "kda_layers": [i + 1 for i in cfg.kda.layer_ids],
        },
        "num_experts": cfg.moe.num_experts,
        "num_experts_per_token": cfg.moe.num_experts_per_token,
        "num_shared_experts": cfg.moe.num_shared_experts,
        "moe_intermediate_size": cfg.moe.moe_intermediate_size,
        "routed_expert_hidden_size": cfg.moe.routed_expert_hidden_size,
        "latent_moe_use_norm": cfg.moe.latent_moe_use_norm,
        "moe_router_activation_func": cfg.moe.router_activation,
        "topk_method": cfg.moe.topk_method,
        "use_grouped_topk": True,
        "num_expert_group": cfg.moe.num_expert_group,
        "topk_group": cfg.moe.topk_group,
        "moe_renormalize": cfg.moe.renormalize,
        "routed_scaling_factor": cfg.moe.routed_scaling_factor,
        "attn_res_block_size": cfg.attn_res.block_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "num_nextn_predict_layers": 0,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.tokens.bos,
        "eos_token_id": cfg.tokens.eos,
        "pad_token_id": cfg.tokens.pad,
        "torch_dtype": "bfloat16",
    }
    quant = _quant_to_hf(cfg.quant)
    if quant is not None:
        text["quantization_config"] = quant
    return {
        "architectures": [TOP_ARCHITECTURE],
        "model_type": "kimi_k3",
        "dtype": "bfloat16",
        "bos_token_id": cfg.tokens.bos,
        "eos_token_id": cfg.tokens.eos,
        "pad_token_id": cfg.tokens.pad,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "text_config": text,
    }
