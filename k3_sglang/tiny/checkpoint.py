"""`k3 make-tiny DIR`: write a deterministic random k3-tiny checkpoint in the published HF layout.

config.json (nested text_config with quantization_config inside it), model.safetensors with
`language_model.`-prefixed text tensors and MXFP4 routed experts (packed nibbles + E8M0
scales), the BPE tokenizer with K3's control tokens and the XTML chat template.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from k3_sglang.config import K3Config, preset
from k3_sglang.tiny.manifest import TensorSpec, text_manifest
from k3_sglang.tiny.tokenizer import write_tokenizer

CHECKPOINT_PREFIX = "language_model."
CHAT_TEMPLATE_FILE = Path(__file__).with_name("chat_template.jinja")
TORCH_DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}
# SGLang's K3 class (`KimiK3ForConditionalGeneration`) builds its MoonViT vision tower and projector from
# `vision_config` on every rank, text-only servers included; without one it takes SGLang's default (27 layers,
# 1,024 wide: ~1.5 GB of float32 per rank, 8 ranks would not fit a small host). The miniature checkpoint has no
# vision weights, so it declares a miniature tower (one layer, 32 wide).
TINY_VISION_CONFIG = {"vt_num_hidden_layers": 1, "vt_hidden_size": 32, "vt_num_attention_heads": 2,
                      "vt_intermediate_size": 64, "qkv_hidden_size": 32}


def chat_template() -> str:
    return CHAT_TEMPLATE_FILE.read_text()


def _random_tensor(spec: TensorSpec, gen: torch.Generator) -> torch.Tensor:
    """A well-conditioned random value for one tensor, chosen by its role in the model."""
    name, shape = spec.name, spec.shape
    if name.endswith("A_log"):
        return torch.log(torch.rand(shape, generator=gen) * 15 + 1)
    if name.endswith("dt_bias") or name.endswith("e_score_correction_bias"):
        return torch.randn(shape, generator=gen) * 0.1
    if name.endswith("_res_proj.weight"):
        return torch.randn(shape, generator=gen) * (2.0 / math.sqrt(shape[-1]))
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if name.endswith("conv1d.weight"):
        return torch.randn(shape, generator=gen) * 0.5
    if name.endswith("embed_tokens.weight"):
        return torch.randn(shape, generator=gen)
    return torch.randn(shape, generator=gen) / math.sqrt(shape[-1])


def _expert_weights(cfg: K3Config, gen: torch.Generator) -> dict[tuple[int, str], torch.Tensor]:
    m = cfg.moe
    inter, lat = m.moe_intermediate_size, m.routed_expert_hidden_size
    shapes = {"w1": (inter, lat), "w3": (inter, lat), "w2": (lat, inter)}
    return {(e, w): torch.randn(s, generator=gen) / math.sqrt(s[1]) for e in range(m.num_experts) for w, s in shapes.items()}


def tiny_state_dict(cfg: K3Config, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every text tensor of the manifest, with MXFP4 experts quantised from random bf16-range values."""
    from k3_sglang.kernels.mxfp4.naive import quant_mxfp4

    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    experts = _expert_weights(cfg, gen)
    for spec in text_manifest(cfg, CHECKPOINT_PREFIX):
        if ".experts." in spec.name:
            continue
        tensors[spec.name] = _random_tensor(spec, gen).to(TORCH_DTYPES[spec.dtype]).contiguous()
    for layer in range(cfg.num_layers):
        if not cfg.moe.is_moe_layer(layer):
            continue
        base = f"{CHECKPOINT_PREFIX}model.layers.{layer}.block_sparse_moe.experts."
        for (e, w), dense in experts.items():
            packed, scales = quant_mxfp4(dense, cfg.quant.group_size)
            tensors[f"{base}{e}.{w}.weight_packed"] = packed.contiguous()
            tensors[f"{base}{e}.{w}.weight_scale"] = scales.contiguous()
    return tensors


def write_tiny_checkpoint(out_dir: str | Path, seed: int = 0, with_tokenizer: bool = True,
                          preset_name: str = "k3-tiny") -> Path:
    """Write the k3-tiny checkpoint (or another small preset's, e.g. the bench-only k3-tiny-pp) to `out_dir`
    (created if needed) and return its path."""
    from safetensors.torch import save_file

    cfg = preset(preset_name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf = {**cfg.to_hf(), "vision_config": TINY_VISION_CONFIG}
    (out / "config.json").write_text(json.dumps(hf, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": cfg.tokens.bos, "eos_token_id": [cfg.tokens.eos, cfg.tokens.bos + 9], "pad_token_id": cfg.tokens.pad}))
    save_file(tiny_state_dict(cfg, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    if with_tokenizer:
        write_tokenizer(out, cfg.vocab_size - 256, chat_template())
    return out
