"""K3's gated NoPE MLA inside SGLang, in the absorbed (MQA-over-latent) form.

Each token's cache row is [c (kv_lora_rank, post-norm) | k_pe (rope dim, not rotated)], stored
in SGLang's MLA KV pool (`mla_attention.py`; `RadixAttention` names the layer). Queries are absorbed per head,
q_lat = [W_UK,h^T q_nope,h | q_pe,h], so attention is MQA with one latent-wide key and the
first kv_lora_rank columns as the value; the output is un-absorbed with W_UV,h.
"""

from __future__ import annotations

import torch
from torch import nn

from k3_sglang.config import K3Config
from k3_sglang.model.common import RMSNorm
from k3_sglang.model.mla_attention import mla_attention
from k3_sglang.model.parallel import ModelParallel, all_reduce, column, row
from k3_sglang.model.settings import worker_settings


class MLAMixer(nn.Module):
    """Gated MLA for one layer. Input/output [T, hidden].

    Under attention TP each rank holds H / tp heads (q_b, kv_b and g rows; o_proj columns, all-reduced); the
    latent projections and norms are replicated, so every rank computes the same cache rows. Under DCP those
    rows are striped over the DCP group by SGLang's pool (see mla_attention.py).
    """

    def __init__(self, cfg: K3Config, layer_id: int):
        super().__init__()
        from sglang.srt.layers.radix_attention import RadixAttention

        mla, hidden = cfg.mla, cfg.hidden_size
        self.mp = ModelParallel.current()
        heads = self.mp.attn_tp
        self.num_heads = heads.part(mla.num_heads, "the MLA head count")  # this rank's heads
        self.nope_dim, self.rope_dim, self.v_dim = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        self.kv_lora_rank = mla.kv_lora_rank
        self.q_a_proj = nn.Linear(hidden, mla.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(mla.q_lora_rank, mla.lora_norm_eps)
        self.q_b_proj = column(mla.q_lora_rank, mla.num_heads * mla.qk_head_dim, heads, "the MLA head count")
        self.kv_a_proj_with_mqa = nn.Linear(hidden, mla.latent_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, mla.lora_norm_eps)
        self.kv_b_proj = column(mla.kv_lora_rank, mla.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim), heads,
                                "the MLA head count")
        self.g_proj = column(hidden, mla.num_heads * mla.v_head_dim, heads, "the MLA head count")
        self.o_proj = row(mla.num_heads * mla.v_head_dim, hidden, heads, "the MLA head count")
        self.chunk_extend = worker_settings().mla_extend == "chunk"
        self.attn = RadixAttention(
            num_heads=self.num_heads, head_dim=mla.latent_dim, scaling=mla.softmax_scale,
            num_kv_heads=1, layer_id=layer_id, v_head_dim=mla.kv_lora_rank,
        )

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [H, Dn, C], W_UV [H, Dv, C]) split per head from kv_b_proj [H*(Dn+Dv), C] (this rank's heads)."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        return w[:, : self.nope_dim], w[:, self.nope_dim:]

    def latent_rows(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> cache rows [T, C + Dr] = [rms_norm(c) | k_pe]."""
        ckv = self.kv_a_proj_with_mqa(x)
        c, k_pe = ckv.split([self.kv_lora_rank, self.rope_dim], dim=-1)
        return torch.cat([self.kv_a_layernorm(c), k_pe], dim=-1)

    def absorbed_query(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> q_lat [T, H, C + Dr]."""
        t = x.shape[0]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_nope, q_pe = q.view(t, self.num_heads, -1).split([self.nope_dim, self.rope_dim], dim=-1)
        w_uk, _ = self.absorbed_weights()
        q_abs = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [T, H, C]
        return torch.cat([q_abs, q_pe], dim=-1)

    def forward(self, x: torch.Tensor, forward_batch) -> torch.Tensor:
        t = x.shape[0]
        if t == 0:
            return torch.zeros_like(x)
        rows = self.latent_rows(x)
        q_lat = self.absorbed_query(x)
        mode = forward_batch.forward_mode
        if self.chunk_extend or mode.is_decode() or mode.is_target_verify():
            o_lat = mla_attention(self.attn, q_lat, rows, forward_batch, self.kv_lora_rank, self.mp.dcp,
                                  self.mp.dcp_merge, self.mp.tp.rank)
        else:  # SGLang's torch_native extend (recomputes prefix + chunk): the long-context baseline only
            o_lat = self.attn(q_lat, rows.unsqueeze(1), rows[:, : self.kv_lora_rank].unsqueeze(1), forward_batch)
        _, w_uv = self.absorbed_weights()
        o_lat = o_lat.view(t, self.num_heads, self.kv_lora_rank).transpose(0, 1)  # [H, T, C]
        o = torch.bmm(o_lat, w_uv.transpose(1, 2)).transpose(0, 1)  # [T, H, Dv]
        o = o * torch.sigmoid(self.g_proj(x).view(t, self.num_heads, self.v_dim))
        return all_reduce(self.o_proj(o.reshape(t, -1)), self.mp.attn_tp, "attn_tp_group")
