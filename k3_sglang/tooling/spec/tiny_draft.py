"""A tiny random DSpark-style draft checkpoint for the tiny K3 (`K3_SPEC_DRAFTER=checkpoint` tests and demos).

`python -m k3_sglang.tooling.spec.tiny_draft OUT_DIR [--confidence-bias B]` writes config.json and
model.safetensors (about 1.3 MB): hidden size and vocabulary of the target preset (k3-tiny: H 128, V 1024), 2 draft
layers, 4 query / 2 KV heads of 32, MLP 256, Markov rank 16, block 7 (the default K3_CSV width 8 = root + 7), and
target_layer_ids (2, 5, 8) of the 9 target layers. No embed_tokens / lm_head: the draft shares the target's, as
SGLang's DSpark drafts do. Random weights: its drafts are noise, its confidence sigmoid(bias + small noise) unless
`confidence_bias` is None (then the bias is random too).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from k3_sglang.config import preset
from k3_sglang.spec.drafters.draft_checkpoint import DraftCheckpointConfig


def tiny_draft_config(target_preset: str = "k3-tiny", target_layer_ids: tuple[int, ...] = (2, 5, 8),
                      block_size: int = 7) -> dict:
    """config.json of the tiny draft for the target preset (SGLang's DSpark key names)."""
    target = preset(target_preset)
    return {
        "architectures": ["DSparkDraftModel"], "model_type": "dspark_draft",
        "hidden_size": target.hidden_size, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256, "vocab_size": target.vocab_size,
        "rms_norm_eps": 1e-6, "markov_rank": 16, "markov_head_type": "vanilla", "enable_confidence_head": True,
        "dspark_config": {"block_size": block_size, "mask_token_id": target.vocab_size - 1,
                          "target_layer_ids": list(target_layer_ids)},
    }


def tiny_draft_tensors(config: dict, seed: int = 0, confidence_bias: float | None = 0.0) -> dict[str, torch.Tensor]:
    """name -> float32 tensor of every draft weight (config's shapes), deterministic in seed."""
    cfg = DraftCheckpointConfig.from_dict(config)
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in sorted(cfg.expected_shapes().items()):
        if name.endswith("norm.weight"):
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            out[name] = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
    if confidence_bias is not None:
        out["confidence_head.proj.weight"] *= 0.1
        out["confidence_head.proj.bias"] = torch.tensor([float(confidence_bias)])
    return out


def write_tiny_draft(out_dir: str | Path, seed: int = 0, confidence_bias: float | None = 0.0,
                     target_preset: str = "k3-tiny", target_layer_ids: tuple[int, ...] = (2, 5, 8),
                     block_size: int = 7) -> Path:
    """Write the tiny draft checkpoint into out_dir (created) and return its path."""
    from safetensors.torch import save_file

    config = tiny_draft_config(target_preset, target_layer_ids, block_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file({"model." + k: v.contiguous() for k, v in tiny_draft_tensors(config, seed, confidence_bias).items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--confidence-bias", type=float, default=0.0,
                        help="the confidence head's bias (confidence about sigmoid of it); default 0 (0.5)")
    args = parser.parse_args(argv)
    print(write_tiny_draft(args.out_dir, args.seed, args.confidence_bias))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
