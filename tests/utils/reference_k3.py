"""Reference K3 forward: plain PyTorch over a checkpoint's tensors, full recompute per step.

The oracle for the SGLang-served model (SGLang's own K3): it shares no code with SGLang's layers or our CPU kernels
plugged into them (it was the portable model's float64 reference and stays here, under tests/, as the oracle).
KDA runs the per-token recurrence, MLA the unabsorbed causal form (per-head keys/values
expanded from the latent), routed experts densely (all experts, off-route weights zero);
default dtype float64.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn.functional as F

from k3_sglang.config import K3Config
from k3_sglang.kernels.kda.naive import naive_recurrent_kda
from k3_sglang.kernels.mla.naive import mla_attention_unabsorbed
from k3_sglang.kernels.mxfp4.naive import dequant_mxfp4

SKIPPED_PREFIXES = ("vision_tower.", "mm_projector.", "language_model.vision_tower.", "language_model.mm_projector.")
EXPERT_RE = re.compile(r"^(model\.layers\.\d+\.block_sparse_moe\.experts)\.(\d+)\.(w[123])\.(weight|weight_packed|weight_scale)$")


def canonical_name(name: str) -> str | None:
    """Checkpoint name -> the text model's parameter name (None for tensors the text model skips)."""
    if name.startswith(SKIPPED_PREFIXES):
        return None
    if name.startswith("language_model."):
        name = name[len("language_model."):]
    if name.startswith("layers."):  # some exports drop the inner `model.`
        name = "model." + name
    return name


def load_reference_tensors(model_dir: str | Path, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    """All text tensors of a K3 checkpoint folder, canonical names, experts dequantised, cast to dtype."""
    from safetensors.torch import load_file

    raw: dict[str, torch.Tensor] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        raw.update(load_file(str(path)))
    out, parts = {}, {}
    for name, t in raw.items():
        name = canonical_name(name)
        if name is None:
            continue
        m = EXPERT_RE.match(name)
        if m and m.group(4) != "weight":
            parts.setdefault(f"{m.group(1)}.{m.group(2)}.{m.group(3)}", {})[m.group(4)] = t
        else:
            out[name] = t.to(dtype)
    for name, p in parts.items():
        out[name + ".weight"] = dequant_mxfp4(p["weight_packed"], p["weight_scale"], torch.float32).to(dtype)
    return out


def _rms(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def _situ(g: torch.Tensor, u: torch.Tensor, beta: float, lin: float) -> torch.Tensor:
    return beta * torch.tanh(g / beta) * torch.sigmoid(g) * (lin * torch.tanh(u / lin))


class ReferenceK3:
    """`logits(ids)` [T, vocab] for one sequence; `greedy(ids, n)` by full recompute per token."""

    def __init__(self, cfg: K3Config, tensors: dict[str, torch.Tensor]):
        self.cfg, self.w = cfg, tensors
        self._margins: list[torch.Tensor] | None = None  # set while routing_margins records

    def _t(self, name: str) -> torch.Tensor:
        return self.w[name]

    def _read(self, bank: list[torch.Tensor], live: torch.Tensor, site: str) -> torch.Tensor:
        cands = torch.stack([*bank, live])  # [N, T, D]
        q = self._t(f"{site}_res_norm.weight") * self._t(f"{site}_res_proj.weight")[0]
        scores = (_rms(cands, None, self.cfg.rms_norm_eps) * q).sum(-1)  # [N, T]
        return (torch.softmax(scores, dim=0).unsqueeze(-1) * cands).sum(0)

    def _mlp(self, x: torch.Tensor, pre: str) -> torch.Tensor:
        s = self.cfg.situ
        h = _situ(x @ self._t(pre + "gate_proj.weight").T, x @ self._t(pre + "up_proj.weight").T, s.beta, s.linear_beta)
        return h @ self._t(pre + "down_proj.weight").T

    def _moe(self, x: torch.Tensor, pre: str) -> torch.Tensor:
        """Dense formulation: every expert on every token, combined by a [T, E] weight matrix (zeros off-route)."""
        m, s = self.cfg.moe, self.cfg.situ
        scores = torch.sigmoid(x @ self._t(pre + "gate.weight").T)  # [T, E]
        biased = scores + self._t(pre + "gate.e_score_correction_bias")
        ids = torch.topk(biased, m.num_experts_per_token, dim=-1).indices
        if self._margins is not None and m.num_experts_per_token < m.num_experts:
            top = torch.topk(biased, m.num_experts_per_token + 1, dim=-1).values
            self._margins.append(top[:, -2] - top[:, -1])
        picked = torch.zeros_like(scores).scatter(1, ids, 1.0) * scores
        if m.renormalize:
            picked = picked / (picked.sum(-1, keepdim=True) + 1e-20)
        picked = picked * m.routed_scaling_factor
        z = x @ self._t(pre + "routed_expert_down_proj.weight").T  # [T, Dl]
        routed = torch.zeros_like(z)
        for e in range(m.num_experts):
            e_pre = f"{pre}experts.{e}."
            h = _situ(z @ self._t(e_pre + "w1.weight").T, z @ self._t(e_pre + "w3.weight").T, s.beta, s.linear_beta)
            routed += picked[:, e:e + 1] * (h @ self._t(e_pre + "w2.weight").T)
        routed = _rms(routed, self._t(pre + "routed_expert_norm.weight"), self.cfg.rms_norm_eps)
        out = routed @ self._t(pre + "routed_expert_up_proj.weight").T
        return out + self._mlp(x, pre + "shared_experts.") if m.num_shared_experts else out

    def _kda(self, x: torch.Tensor, pre: str) -> torch.Tensor:
        k, t = self.cfg.kda, x.shape[0]
        h, d = k.num_heads, k.head_dim

        def conv(name: str) -> torch.Tensor:
            pre_conv = (x @ self._t(f"{pre}{name}_proj.weight").T).T.unsqueeze(0)  # [1, P, T]
            w = self._t(f"{pre}{name}_conv1d.weight")  # [P, 1, W]
            y = F.conv1d(F.pad(pre_conv, (k.conv_kernel_size - 1, 0)), w, groups=w.shape[0])
            return F.silu(y[0].T).reshape(t, h, d)

        q, kk, v = conv("q"), conv("k"), conv("v")
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        kk = kk / torch.sqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
        f = (x @ self._t(pre + "f_a_proj.weight").T @ self._t(pre + "f_b_proj.weight").T).view(t, h, d)
        a = torch.exp(self._t(pre + "A_log")[:h]).view(h, 1)
        g = k.gate_lower_bound * torch.sigmoid(a * (f + self._t(pre + "dt_bias").view(h, d)))
        beta = torch.sigmoid(x @ self._t(pre + "b_proj.weight").T)
        o, _ = naive_recurrent_kda(q, kk, v, g, beta, d ** -0.5)
        gate = torch.sigmoid((x @ self._t(pre + "g_proj.weight").T).view(t, h, d))
        o = _rms(o, self._t(pre + "o_norm.weight"), self.cfg.rms_norm_eps) * gate
        return o.reshape(t, -1) @ self._t(pre + "o_proj.weight").T

    def _mla(self, x: torch.Tensor, pre: str) -> torch.Tensor:
        m, t = self.cfg.mla, x.shape[0]
        eps = m.lora_norm_eps
        cq = _rms(x @ self._t(pre + "q_a_proj.weight").T, self._t(pre + "q_a_layernorm.weight"), eps)
        q = (cq @ self._t(pre + "q_b_proj.weight").T).view(t, m.num_heads, m.qk_head_dim)
        ckv = x @ self._t(pre + "kv_a_proj_with_mqa.weight").T
        c = _rms(ckv[:, : m.kv_lora_rank], self._t(pre + "kv_a_layernorm.weight"), eps)
        kv = (c @ self._t(pre + "kv_b_proj.weight").T).view(t, m.num_heads, m.qk_nope_head_dim + m.v_head_dim)
        o = mla_attention_unabsorbed(q[..., : m.qk_nope_head_dim], q[..., m.qk_nope_head_dim:], kv[..., : m.qk_nope_head_dim],
                                     ckv[:, m.kv_lora_rank:], kv[..., m.qk_nope_head_dim:], m.softmax_scale, 0)
        o = o * torch.sigmoid((x @ self._t(pre + "g_proj.weight").T).view(t, m.num_heads, m.v_head_dim))
        return o.reshape(t, -1) @ self._t(pre + "o_proj.weight").T

    @torch.no_grad()
    def logits(self, ids: list[int]) -> torch.Tensor:
        return self._walk(ids, ())[0]

    @torch.no_grad()
    def captured_streams(self, ids: list[int], layer_ids: tuple[int, ...]) -> torch.Tensor:
        """[T, len(layer_ids) * H]: the stream after each of these (increasing) layers as its next reader mixes it
        (layer i+1's attention-side AttnRes read, the output read after the last layer), pre-norm."""
        return self._walk(ids, tuple(layer_ids))[1]

    def _walk(self, ids: list[int], capture: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        cfg = self.cfg
        live = self._t("model.embed_tokens.weight")[torch.tensor(ids)]
        bank: list[torch.Tensor] = []
        captured: list[torch.Tensor] = []
        for i in range(cfg.num_layers):
            if i - 1 in capture:
                captured.append(live if not bank else self._read(bank, live, f"model.layers.{i}.self_attention"))
            pre = f"model.layers.{i}."
            h = live if not bank else self._read(bank, live, pre + "self_attention")
            if cfg.attn_res.is_block_start(i):
                bank.append(live)
                live = None
            normed = _rms(h, self._t(pre + "input_layernorm.weight"), cfg.rms_norm_eps)
            a = self._kda(normed, pre + "self_attn.") if cfg.is_kda_layer(i) else self._mla(normed, pre + "self_attn.")
            live = a if live is None else live + a
            h2 = _rms(self._read(bank, live, pre + "mlp"), self._t(pre + "post_attention_layernorm.weight"), cfg.rms_norm_eps)
            live = live + (self._moe(h2, pre + "block_sparse_moe.") if cfg.moe.is_moe_layer(i) else self._mlp(h2, pre + "mlp."))
        mixed = self._read(bank, live, "model.output_attn")
        if cfg.num_layers - 1 in capture:
            captured.append(mixed)
        out = _rms(mixed, self._t("model.norm.weight"), cfg.rms_norm_eps)
        return out @ self._t("lm_head.weight").T, (torch.cat(captured, dim=-1) if capture else None)

    def routing_margins(self, ids: list[int]) -> torch.Tensor:
        """[T]: per position, the smallest gap over the MoE layers between the k-th and (k+1)-th biased expert
        score (the routing choice). A gap near zero is a near-tie that rounding elsewhere may flip."""
        self._margins = []
        try:
            self.logits(ids)
            margins = self._margins
        finally:
            self._margins = None
        return torch.stack(margins).min(0).values if margins else torch.full((len(ids),), float("inf"))

    def greedy(self, ids: list[int], new_tokens: int) -> list[int]:
        seq = list(ids)
        for _ in range(new_tokens):
            seq.append(int(self.logits(seq)[-1].argmax()))
        return seq[len(ids):]
