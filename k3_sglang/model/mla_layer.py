"""K3's gated NoPE MLA inside SGLang, in the absorbed (MQA-over-latent) form.

Each token's cache row is [c (kv_lora_rank, post-norm) | k_pe (rope dim, not rotated)], stored
in SGLang's MLA KV pool through `RadixAttention`. Queries are absorbed per head,
q_lat = [W_UK,h^T q_nope,h | q_pe,h], so attention is MQA with one latent-wide key and the
first kv_lora_rank columns as the value; the output is un-absorbed with W_UV,h.
"""

from __future__ import annotations

import torch
from torch import nn

from k3_sglang.config import K3Config
from k3_sglang.model.common import RMSNorm
from k3_sglang.model.mla_extend import mla_extend_forward
from k3_sglang.model.settings import model_settings


class MLAMixer(nn.Module):
    """Gated MLA for one layer. Input/output [T, hidden]."""

    def __init__(self, cfg: K3Config, layer_id: int):
        super().__init__()
        from sglang.srt.layers.radix_attention import RadixAttention

        mla, hidden = cfg.mla, cfg.hidden_size
        self.num_heads = mla.num_heads
        self.nope_dim, self.rope_dim, self.v_dim = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        self.kv_lora_rank = mla.kv_lora_rank
        self.q_a_proj = nn.Linear(hidden, mla.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(mla.q_lora_rank, mla.lora_norm_eps)
        self.q_b_proj = nn.Linear(mla.q_lora_rank, mla.num_heads * mla.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, mla.latent_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, mla.lora_norm_eps)
        self.kv_b_proj = nn.Linear(mla.kv_lora_rank, mla.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False)
        self.g_proj = nn.Linear(hidden, mla.num_heads * mla.v_head_dim, bias=False)
        self.o_proj = nn.Linear(mla.num_heads * mla.v_head_dim, hidden, bias=False)
        self.chunk_extend = model_settings().mla_extend == "chunk"
        self.attn = RadixAttention(
            num_heads=mla.num_heads, head_dim=mla.latent_dim, scaling=mla.softmax_scale,
            num_kv_heads=1, layer_id=layer_id, v_head_dim=mla.kv_lora_rank,
        )

    def _decode_batched(self, q_lat: torch.Tensor, rows: torch.Tensor, forward_batch) -> torch.Tensor:
        """One new token per request through `dispatch.mla_decode` (Triton split-KV on CUDA; elsewhere one padded
        batched attention, since SGLang's torch_native decode loops over requests in Python).

        q_lat [B, H, L], rows [B, L] (this step's cache rows, written to the pool first) -> o_lat [B, H*C].
        Each request's keys are its req_to_token rows up to the device-side seq_lens (never seq_lens_cpu, a fill
        value during CUDA-graph capture). The LSE comes back too (for DCP's merge; unused at one rank).
        """
        from sglang.srt.model_executor.forward_context import get_attn_backend

        from k3_sglang.kernels import dispatch
        from k3_sglang.kernels.mla.decode_layout import decode_kv_layout

        backend = get_attn_backend()
        backend = getattr(backend, "full_attn_backend", backend)
        pool = backend.token_to_kv_pool
        pool.set_kv_buffer(self.attn, forward_batch.out_cache_loc, rows.unsqueeze(1), None)
        cache = pool.get_key_buffer(self.attn.layer_id)  # [N, 1, L]
        kv_indices, kv_indptr = decode_kv_layout(backend.req_to_token_pool.req_to_token,
                                                 forward_batch.req_pool_indices, forward_batch.seq_lens)
        o_lat, _lse = dispatch.mla_decode(q_lat, cache.view(cache.shape[0], -1), kv_indices, kv_indptr,
                                          self.kv_lora_rank, self.attn.scaling)  # [B, H, C], [B, H]
        return o_lat.reshape(q_lat.shape[0], -1)

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [H, Dn, C], W_UV [H, Dv, C]) split per head from kv_b_proj [H*(Dn+Dv), C]."""
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
        if forward_batch.forward_mode.is_decode():
            o_lat = self._decode_batched(q_lat, rows, forward_batch)
        elif self.chunk_extend:
            o_lat = mla_extend_forward(self.attn, q_lat, rows, forward_batch, self.kv_lora_rank)
        else:  # SGLang's torch_native extend (recomputes prefix + chunk): the long-context baseline only
            o_lat = self.attn(q_lat, rows.unsqueeze(1), rows[:, : self.kv_lora_rank].unsqueeze(1), forward_batch)
        _, w_uv = self.absorbed_weights()
        o_lat = o_lat.view(t, self.num_heads, self.kv_lora_rank).transpose(0, 1)  # [H, T, C]
        o = torch.bmm(o_lat, w_uv.transpose(1, 2)).transpose(0, 1)  # [T, H, Dv]
        o = o * torch.sigmoid(self.g_proj(x).view(t, self.num_heads, self.v_dim))
        return self.o_proj(o.reshape(t, -1))
