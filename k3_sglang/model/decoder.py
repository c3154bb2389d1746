"""K3 decoder layers and the Block-AttnRes walk over depth (SGLang-served text model).

Walk (per token, nothing persists across steps):
    live = embed(ids); bank = []
    for layer l:
        h = live if not bank else read(bank + [live], w_attn[l])
        if l % block == 0: bank.append(live); live = None         # seal the raw stream
        live = (live or 0) + mixer_l(input_norm(h))
        live = live + ffn_l(post_norm(read(bank + [live], w_mlp[l])))
    out = read(bank + [live], w_out); logits = lm_head(final_norm(out))

Capture for a draft model (`layers_to_capture`, SGLang's DSpark seam `set_dspark_layers_to_capture`): the stream
after layer i as its next reader mixes it, pre-norm: layer i+1's attention-side read of bank + [live], or the output
read after the last layer (what SGLang's K3 captures on its AttnRes path), concatenated in layer order.

Under pipeline parallelism a stage runs layers [start, end) only: the first stage embeds, a later one starts
from the (live, bank) the previous stage sent (`k3_sglang.parallel.pipeline`), and only the last one reads the
output. Layers outside the stage are parameter-free placeholders, so parameter names stay global.
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
from k3_sglang.parallel.pipeline import StageRange


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


class MissingLayer(nn.Module):
    """Placeholder for a layer another pipeline stage runs (no parameters; never called)."""

    def __init__(self, layer_id: int):
        super().__init__()
        self.layer_id = layer_id

    def forward(self, *_args, **_kwargs):
        raise RuntimeError(f"layer {self.layer_id} belongs to another pipeline stage")


class K3Model(nn.Module):
    """Embedding, 93 (or tiny: 9) decoder layers, the output AttnRes read and final norm; under pipeline
    parallelism only `stage`'s layers (the embedding on the first stage, the output read and norm on the last)."""

    def __init__(self, cfg: K3Config, stage: StageRange | None = None):
        super().__init__()
        hidden = cfg.hidden_size
        self.stage = stage or StageRange.whole(cfg.num_layers)
        if self.stage.num_layers != cfg.num_layers:
            raise ValueError(f"stage {self.stage} is not a split of this {cfg.num_layers}-layer model")
        self.start_layer, self.end_layer = self.stage.start, self.stage.end
        self.hidden_size = hidden
        self.inherited_blocks = self.stage.inherited_blocks(cfg.attn_res.block_size)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, hidden) if self.stage.is_first else None
        self.layers = nn.ModuleList(K3DecoderLayer(cfg, i) if i in self.stage else MissingLayer(i)
                                    for i in range(cfg.num_layers))
        self.eps = cfg.rms_norm_eps
        self.layers_to_capture: tuple[int, ...] = ()  # set through the entry class (whole model only)
        if self.stage.is_last:
            self.norm = RMSNorm(hidden, cfg.rms_norm_eps)
            self.output_attn_res_norm = WeightOnly(hidden, fill=1.0)
            self.output_attn_res_proj = WeightOnly(1, hidden)

    def captured_stream(self, layer_id: int, live: torch.Tensor, bank: list[torch.Tensor]) -> torch.Tensor:
        """live [T, H] after layer `layer_id`, bank its sealed blocks -> [T, H], the stream as the next reader
        mixes it (module docstring)."""
        if layer_id + 1 < len(self.layers):
            nxt = self.layers[layer_id + 1]
            if not bank:
                return live
            return attn_res(bank, live, nxt.self_attention_res_norm, nxt.self_attention_res_proj, self.eps)
        return attn_res(bank, live, self.output_attn_res_norm, self.output_attn_res_proj, self.eps)

    def forward(self, input_ids: torch.Tensor, forward_batch, input_embeds: torch.Tensor | None = None,
                carry: tuple[torch.Tensor, list[torch.Tensor]] | None = None):
        """input_ids [T]. The first stage embeds them (or takes input_embeds [T, H]); a later stage continues
        from carry = (live [T, H], bank: inherited_blocks x [T, H]). Returns the final hidden states [T, H] on
        the last stage, else the (live, bank) to send on. With `layers_to_capture` (C layers, whole model): a pair
        (final hidden states [T, H], captured streams [T, C*H])."""
        if self.stage.is_first:
            live = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
            bank: list[torch.Tensor] = []
        else:
            if carry is None:
                raise ValueError(f"pipeline stage starting at layer {self.start_layer} needs the previous "
                                 "stage's carry")
            live, bank = carry[0], list(carry[1])
            if len(bank) != self.inherited_blocks:
                raise ValueError(f"pipeline stage starting at layer {self.start_layer} expects "
                                 f"{self.inherited_blocks} AttnRes blocks, got {len(bank)}")
        captured: list[torch.Tensor] = []
        for i in range(self.start_layer, self.end_layer):
            live = self.layers[i](live, bank, forward_batch)
            if i in self.layers_to_capture:
                captured.append(self.captured_stream(i, live, bank))
        if not self.stage.is_last:
            return live, bank
        out = self.norm(attn_res(bank, live, self.output_attn_res_norm, self.output_attn_res_proj, self.eps))
        return (out, torch.cat(captured, dim=-1)) if self.layers_to_capture else out
