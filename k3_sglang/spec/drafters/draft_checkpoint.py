"""Loader and reference forward of a DSpark-style draft checkpoint with a confidence head (K3_SPEC_DRAFTER=checkpoint).

What it reads (learned from SGLang 0.5.23 `models/dspark.py`, `models/dflash.py`,
`speculative/dspark_components/dspark_config.py`; no code copied):
- config.json: hidden_size, num_hidden_layers, num_attention_heads, [num_key_value_heads], [head_dim],
  intermediate_size, vocab_size, [rms_norm_eps]; the draft block size (gamma) as `dspark_block_size`,
  `dspark_config.block_size`/`dflash_config.block_size` or `block_size`; `markov_rank` (> 0) and
  `markov_head_type` (only "vanilla" here); `mask_token_id`; `target_layer_ids` (which target layers' hidden states
  the draft reads, concatenated); `enable_confidence_head` (must not be false) and `confidence_head_with_markov`
  (default: markov_rank > 0). `dspark_*`-prefixed keys win over nested `dspark_config` / `dflash_config`
  ones, which win over top-level ones, as in SGLang.
- *.safetensors (an optional leading "model." is stripped): fc.weight [H, C*H] (C = len(target_layer_ids)),
  hidden_norm.weight [H], norm.weight [H], per draft layer i `layers.i.`{input_layernorm, post_attention_layernorm}
  .weight [H], self_attn.{q_proj [A*D, H], k_proj [K*D, H], v_proj [K*D, H], o_proj [H, A*D]}.weight,
  self_attn.{q_norm, k_norm}.weight [D], mlp.{gate_proj, up_proj [I, H], down_proj [H, I]}.weight;
  markov_head.markov_w1.weight [V, R], markov_head.markov_w2.weight [V, R];
  confidence_head.proj.weight [1, H (+R with markov)], confidence_head.proj.bias [1].
  embed_tokens.weight / lm_head.weight [V, H] are shared with the target in SGLang (skipped there); here they may be
  in the checkpoint or passed by the caller.

The module (`DSparkStyleDraft`) is the draft forward K3_CSV serves with (spec/drafters/checkpoint.py): from the
target's hidden states at each root [N, C*H] (the streams after `target_layer_ids`, concatenated in layer order, at
the row whose logits chose the root; spec/root_capture.py) and the root tokens [N] it drafts gamma tokens per request
with per-token confidence sigmoid(confidence_head), which the planner reads as conditional acceptance.
Simplifications against SGLang's draft (honest list): attention runs only inside the block [projected context,
anchor, gamma mask tokens] (no draft KV cache over the whole prefix: only the root's context features are read), no
RoPE, no STS temperature, greedy only, no TP (the draft runs whole on every rank), float32. It has been served and
tested only with tiny random checkpoints, never with a trained one, so nothing here says how a trained DSpark draft
would accept.

`check_draft_files` validates a checkpoint from its headers (start-up refusals); `target_mismatches` says why a draft
cannot read a target (hidden size, vocabulary, target_layer_ids).
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

_REQUIRED_INT_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def _nested(cfg: dict, key: str) -> Any:
    """dspark_<key> > dspark_config[key] > dflash_config[key] > <key> (SGLang's precedence)."""
    if cfg.get(f"dspark_{key}") is not None:
        return cfg[f"dspark_{key}"]
    for section in ("dspark_config", "dflash_config"):
        sub = cfg.get(section)
        if isinstance(sub, dict) and key in sub:
            return sub[key]
    return cfg.get(key)


@dataclass(frozen=True)
class DraftCheckpointConfig:
    """The draft's shapes, parsed once from config.json (H hidden, A/K heads, D head dim, I MLP, V vocab, R rank)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    gamma: int
    markov_rank: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    confidence_with_markov: bool

    @property
    def num_context_features(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config.json") -> "DraftCheckpointConfig":
        if not isinstance(cfg, dict):
            raise ValueError(f"draft checkpoint {source}: expected a JSON object")
        missing = [k for k in _REQUIRED_INT_KEYS if k not in cfg]
        gamma = _nested(cfg, "block_size")
        markov_rank = _nested(cfg, "markov_rank")
        mask_token_id = _nested(cfg, "mask_token_id")
        layer_ids = _nested(cfg, "target_layer_ids")
        for name, value in (("block_size", gamma), ("markov_rank", markov_rank), ("mask_token_id", mask_token_id),
                            ("target_layer_ids", layer_ids)):
            if value is None:
                missing.append(name)
        if missing:
            raise ValueError(f"draft checkpoint {source}: missing keys {', '.join(missing)}")
        head_type = str(_nested(cfg, "markov_head_type") or "vanilla").lower()
        if head_type != "vanilla":
            raise ValueError(f"draft checkpoint {source}: markov_head_type {head_type!r} not supported (only vanilla)")
        if cfg.get("enable_confidence_head") is False:
            raise ValueError(f"draft checkpoint {source}: enable_confidence_head is false; a confidence head is required")
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            out = cls(
                hidden_size=hidden,
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads", heads)),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                intermediate_size=int(cfg["intermediate_size"]),
                vocab_size=int(cfg["vocab_size"]),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                gamma=int(gamma),
                markov_rank=int(markov_rank),
                mask_token_id=int(mask_token_id),
                target_layer_ids=tuple(int(x) for x in layer_ids),
                confidence_with_markov=bool(cfg.get("confidence_head_with_markov", int(markov_rank) > 0)),
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"draft checkpoint {source}: malformed value ({exc})") from None
        positive = {k: getattr(out, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                  "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                                                  "gamma", "markov_rank")}
        bad = [f"{k}={v}" for k, v in positive.items() if v <= 0]
        if bad or not out.target_layer_ids or out.num_attention_heads % out.num_key_value_heads:
            raise ValueError(f"draft checkpoint {source}: invalid shapes {bad or ''} target_layer_ids="
                             f"{list(out.target_layer_ids)} heads {heads}/{out.num_key_value_heads}")
        if not 0 <= out.mask_token_id < out.vocab_size:
            raise ValueError(f"draft checkpoint {source}: mask_token_id {out.mask_token_id} outside vocab {out.vocab_size}")
        return out

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape of every draft tensor (embed_tokens / lm_head excluded: shared with the target)."""
        H, A, K, D, I, V, R = (self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim,
                               self.intermediate_size, self.vocab_size, self.markov_rank)
        shapes = {"fc.weight": (H, self.num_context_features * H), "hidden_norm.weight": (H,), "norm.weight": (H,),
                  "markov_head.markov_w1.weight": (V, R), "markov_head.markov_w2.weight": (V, R),
                  "confidence_head.proj.weight": (1, H + (R if self.confidence_with_markov else 0)),
                  "confidence_head.proj.bias": (1,)}
        for i in range(self.num_hidden_layers):
            p = f"layers.{i}."
            shapes.update({
                p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (A * D, H), p + "self_attn.k_proj.weight": (K * D, H),
                p + "self_attn.v_proj.weight": (K * D, H), p + "self_attn.o_proj.weight": (H, A * D),
                p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,),
                p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I),
            })
        return shapes


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class DSparkStyleDraft(nn.Module):
    """Reference DSpark-style draft forward; weights is name -> tensor as validated by `load_draft_checkpoint`."""

    def __init__(self, config: DraftCheckpointConfig, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.config = config
        self._names = sorted(weights)
        for name in self._names:
            self.register_buffer(name.replace(".", "__"), weights[name], persistent=False)

    def _w(self, name: str) -> torch.Tensor:
        return getattr(self, name.replace(".", "__"))

    def _layer(self, i: int, x: torch.Tensor) -> torch.Tensor:
        c, p = self.config, f"layers.{i}."
        n, s, _ = x.shape
        h = _rms(x, self._w(p + "input_layernorm.weight"), c.rms_norm_eps)
        q = (h @ self._w(p + "self_attn.q_proj.weight").T).view(n, s, c.num_attention_heads, c.head_dim)
        k = (h @ self._w(p + "self_attn.k_proj.weight").T).view(n, s, c.num_key_value_heads, c.head_dim)
        v = (h @ self._w(p + "self_attn.v_proj.weight").T).view(n, s, c.num_key_value_heads, c.head_dim)
        q = _rms(q, self._w(p + "self_attn.q_norm.weight"), c.rms_norm_eps).transpose(1, 2)
        k = _rms(k, self._w(p + "self_attn.k_norm.weight"), c.rms_norm_eps).transpose(1, 2)
        rep = c.num_attention_heads // c.num_key_value_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.transpose(1, 2).repeat_interleave(rep, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / c.head_dim ** 0.5, dim=-1) @ v  # block attention, no mask
        x = x + att.transpose(1, 2).reshape(n, s, -1) @ self._w(p + "self_attn.o_proj.weight").T
        h = _rms(x, self._w(p + "post_attention_layernorm.weight"), c.rms_norm_eps)
        gate = h @ self._w(p + "mlp.gate_proj.weight").T
        up = h @ self._w(p + "mlp.up_proj.weight").T
        return x + (torch.nn.functional.silu(gate) * up) @ self._w(p + "mlp.down_proj.weight").T

    @torch.no_grad()
    def forward(self, target_hidden: torch.Tensor, anchor_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """target_hidden [N, C*H] (the target_layer_ids hidden states at each root, concatenated), anchor_tokens [N]
        int64 (the roots) -> (draft tokens [N, gamma] int64, confidence [N, gamma] float32 in [0, 1])."""
        c = self.config
        n = target_hidden.shape[0]
        if target_hidden.shape != (n, c.num_context_features * c.hidden_size) or anchor_tokens.shape != (n,):
            raise ValueError(f"DSparkStyleDraft: target_hidden {tuple(target_hidden.shape)} must be "
                             f"[N, {c.num_context_features * c.hidden_size}] and anchor_tokens [N], got "
                             f"{tuple(anchor_tokens.shape)}")
        dtype = self._w("fc.weight").dtype
        ctx = _rms(target_hidden.to(dtype) @ self._w("fc.weight").T, self._w("hidden_norm.weight"), c.rms_norm_eps)
        embed = self._w("embed_tokens.weight")
        mask = embed[c.mask_token_id].expand(n, c.gamma, -1)
        x = torch.cat([ctx[:, None], embed[anchor_tokens][:, None], mask], dim=1)  # [N, gamma + 2, H]
        for i in range(c.num_hidden_layers):
            x = self._layer(i, x)
        feats = _rms(x[:, 2:], self._w("norm.weight"), c.rms_norm_eps)  # [N, gamma, H]
        base_logits = feats @ self._w("lm_head.weight").T  # [N, gamma, V]
        w1, w2 = self._w("markov_head.markov_w1.weight"), self._w("markov_head.markov_w2.weight")
        pw, pb = self._w("confidence_head.proj.weight"), self._w("confidence_head.proj.bias")
        prev = anchor_tokens.long()
        tokens, conf = [], []
        for j in range(c.gamma):
            latent = w1[prev]  # [N, R]
            logits = base_logits[:, j] + latent @ w2.T
            f = torch.cat([feats[:, j], latent], dim=-1) if c.confidence_with_markov else feats[:, j]
            conf.append(torch.sigmoid((f @ pw.T + pb).squeeze(-1).float()))
            prev = logits.argmax(dim=-1)
            tokens.append(prev)
        return torch.stack(tokens, 1), torch.stack(conf, 1)


def read_draft_config(path: str) -> DraftCheckpointConfig:
    """`path`/config.json parsed and checked (clear ValueError: missing, not JSON, missing keys, bad values)."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ValueError(f"draft checkpoint: no config.json in {path}")
    try:
        with open(cfg_path) as fh:
            return DraftCheckpointConfig.from_dict(json.load(fh), cfg_path)
    except json.JSONDecodeError as exc:
        raise ValueError(f"draft checkpoint {cfg_path}: not JSON ({exc})") from None


def _read_tensors(path: str, load: bool) -> dict[str, Any]:
    """name (leading "model." stripped) -> tensor (load) or its shape tuple from the safetensors header."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"draft checkpoint: no *.safetensors in {path}")
    out: dict[str, Any] = {}
    for f in files:
        try:
            with safe_open(f, framework="pt") as fh:
                for name in fh.keys():
                    key = name.removeprefix("model.")
                    out[key] = fh.get_tensor(name) if load else tuple(fh.get_slice(name).get_shape())
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise ValueError(f"draft checkpoint: cannot read {f} ({exc})") from None
    return out


def _check_names_and_shapes(path: str, config: DraftCheckpointConfig, shapes: dict[str, tuple[int, ...]],
                            heads_optional: bool) -> None:
    expected = config.expected_shapes()
    V, H = config.vocab_size, config.hidden_size
    heads = {"embed_tokens.weight": (V, H), "lm_head.weight": (V, H)}
    expected.update({n: s for n, s in heads.items() if n in shapes or not heads_optional})
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected))
    if missing or unexpected:
        raise ValueError(f"draft checkpoint {path}: missing tensors {missing[:8]}{'...' if len(missing) > 8 else ''}, "
                         f"unexpected tensors {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}")
    wrong = [f"{n} {tuple(shapes[n])} != {shape}" for n, shape in expected.items() if tuple(shapes[n]) != shape]
    if wrong:
        raise ValueError(f"draft checkpoint {path}: wrong shapes: {'; '.join(wrong[:8])}")


def check_draft_files(path: str) -> DraftCheckpointConfig:
    """The config, once config.json parses and every tensor's name and shape in the safetensors headers is right
    (no tensor data read; embed_tokens / lm_head may be absent: the target's). Clear ValueError otherwise."""
    config = read_draft_config(path)
    _check_names_and_shapes(path, config, _read_tensors(path, load=False), heads_optional=True)
    return config


def target_mismatches(config: DraftCheckpointConfig, hidden_size: int, vocab_size: int, num_layers: int) -> list[str]:
    """Why this draft cannot read this target (empty when it can): it shares the target's embedding and lm_head
    (same hidden size and vocabulary) and reads the streams after target_layer_ids (increasing, in range)."""
    out = []
    if config.hidden_size != int(hidden_size):
        out.append(f"draft hidden_size {config.hidden_size} != the target's {hidden_size}")
    if config.vocab_size != int(vocab_size):
        out.append(f"draft vocab_size {config.vocab_size} != the target's {vocab_size}")
    ids = list(config.target_layer_ids)
    if ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] >= int(num_layers):
        out.append(f"draft target_layer_ids {ids} must be increasing layer ids of the target (0..{num_layers - 1})")
    return out


def load_draft_checkpoint(
    path: str,
    *,
    embed_weight: torch.Tensor | None = None,
    lm_head_weight: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> DSparkStyleDraft:
    """Parse `path`/config.json, read and validate `path`/*.safetensors (names and shapes), build the module on
    `device`. embed_weight / lm_head_weight [V, H]: the target's, used when the checkpoint has none. Clear
    ValueError on a bad checkpoint (missing config or keys, missing / unexpected / mis-shaped tensors, NaN/inf)."""
    config = read_draft_config(path)
    tensors = _read_tensors(path, load=True)
    for name, given in (("embed_tokens.weight", embed_weight), ("lm_head.weight", lm_head_weight)):
        if name not in tensors:
            if given is None:
                raise ValueError(f"draft checkpoint: {name} is neither in the checkpoint nor passed (the target's; "
                                 "a target that shards it over TP ranks cannot lend it)")
            tensors[name] = given
    _check_names_and_shapes(path, config, {n: tuple(t.shape) for n, t in tensors.items()}, heads_optional=False)
    bad = [n for n, t in tensors.items() if not torch.isfinite(t.float()).all()]
    if bad:
        raise ValueError(f"draft checkpoint {path}: non-finite values in {bad[:8]}")
    return DSparkStyleDraft(config, {n: t.to(device=device, dtype=dtype) for n, t in tensors.items()})
