"""K3 decoder layers and the Block-AttnRes walk over depth (SGLang-served text model).

Walk (per token, nothing persists across steps):
    live = embed(ids); bank = []
    for layer l:
        h = live if not bank else read(bank + [live], w_attn[l])
        if l % block == 0: bank.append(live); live = None         # seal the raw stream
        live = (live or 0) + mixer_l(input_norm(h))
        live = live + ffn_l(post_norm(read(bank + [live], w_mlp[l])))
    out = read(bank + [live], w_out); logits = lm_head(final_norm(out))
"""

from __future__ import annotations

import torch
from torch import nn

from k3_sglang.config import K3Config
from k3_sglang.kernels import dispatch
from k3_sglang.model.common import RMSNorm, WeightOnly
from k3_sglang.model.ffn import LatentMoE, SiTUMLP
from k3_sglang.model.kda_layer import KDAMixer
from k3_sglang.model.mla_layer import MLAMixer


def attn_res(bank: list[torch.Tensor], live: torch.Tensor, norm: WeightOnly, proj: WeightOnly, eps: float) -> torch.Tensor:
    """One AttnRes read site. bank: sealed [T, D] snapshots; live [T, D] -> mixed stream [T, D].

    The site's pseudo-query is the fused product res_norm.weight [D] * res_proj.weight[0] [D]; the read runs
    through `dispatch.attn_res_read` (Triton on CUDA, torch elsewhere).
    """
    weight = norm.weight.float() * proj.weight[0].float()
    return dispatch.attn_res_read(torch.stack([*bank, live]), weight, eps)


class K3DecoderLayer(nn.Module):
    def __init__(self, cfg: K3Config, layer_id: int):
        super().__init__()
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.layer_id = layer_id
        self.seals_block = cfg.attn_res.is_block_start(layer_id)
        self.is_moe = cfg.moe.is_moe_layer(layer_id)
        self.self_attn = KDAMixer(cfg, layer_id) if cfg.is_kda_layer(layer_id) else MLAMixer(cfg, layer_id)
        if self.is_moe:
            self.block_sparse_moe = LatentMoE(cfg)
        else:
            self.mlp = SiTUMLP(hidden, cfg.moe.dense_intermediate_size, cfg.situ.beta, cfg.situ.linear_beta)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.eps = eps
        self.self_attention_res_norm = WeightOnly(hidden, fill=1.0)
        self.self_attention_res_proj = WeightOnly(1, hidden)
        self.mlp_res_norm = WeightOnly(hidden, fill=1.0)
        self.mlp_res_proj = WeightOnly(1, hidden)

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_sparse_moe(x) if self.is_moe else self.mlp(x)

    def forward(self, live: torch.Tensor, bank: list[torch.Tensor], forward_batch) -> torch.Tensor:
        """Advance the walk by one layer; appends to `bank` when this layer starts a block."""
        h = live if not bank else attn_res(bank, live, self.self_attention_res_norm, self.self_attention_res_proj, self.eps)
        if self.seals_block:
            bank.append(live)
            live = None
        a = self.self_attn(self.input_layernorm(h), forward_batch)
        live = a if live is None else live + a
        h2 = attn_res(bank, live, self.mlp_res_norm, self.mlp_res_proj, self.eps)
        return live + self.ffn(self.post_attention_layernorm(h2))


class K3Model(nn.Module):
    """Embedding, 93 (or tiny: 9) decoder layers, the output AttnRes read and final norm."""

    def __init__(self, cfg: K3Config):
        super().__init__()
        hidden = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList(K3DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.eps = cfg.rms_norm_eps
        self.output_attn_res_norm = WeightOnly(hidden, fill=1.0)
        self.output_attn_res_proj = WeightOnly(1, hidden)

    def forward(self, input_ids: torch.Tensor, forward_batch, input_embeds: torch.Tensor | None = None) -> torch.Tensor:
        live = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        bank: list[torch.Tensor] = []
        for layer in self.layers:
            live = layer(live, bank, forward_batch)
        return self.norm(attn_res(bank, live, self.output_attn_res_norm, self.output_attn_res_proj, self.eps))
