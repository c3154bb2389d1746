"""K3's KDA mixer inside SGLang: projections here, state in SGLang's hybrid linear-state pool.

The conv windows and fp32 recurrent states live in SGLang's mamba pool
(`req_to_token_pool.mamba2_layer_cache(layer_id)`: conv [slots, W-1, 3P] holding the q|k|v
pre-conv rows, temporal [slots, H, K, V]); the slot of each request comes from the hybrid
backend's forward metadata. Prefill runs the chunked KDA form (no per-token loop); decode runs
one vectorised recurrent step for the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from k3_sglang.config import K3Config
from k3_sglang.model.common import FusedWeightCache, WeightOnly
from k3_sglang.kernels.kda.naive import (
    chunk_kda,
    gated_rms_norm,
    kda_gate,
    kda_recurrent_step,
    l2_normalize,
    short_conv_silu,
)


# The six input projections run as one matmul over a cached concatenated weight while that copy
# stays small (the tiny model on CPU); larger layers run them separately.
FUSED_PROJ_MAX_BYTES = 32 << 20


@dataclass(frozen=True)
class KDAStateView:
    """Where one KDA layer's per-request state lives for the current batch."""

    conv: torch.Tensor  # [slots, W-1, 3P]
    temporal: torch.Tensor  # [slots, H, K, V] (fp32)
    slots: torch.Tensor  # [B] int64 slot per request
    query_start_loc: torch.Tensor  # [B+1]


def kda_state_view(forward_batch, layer_id: int) -> KDAStateView:
    """Find the layer's state tensors and the batch's slot indices in SGLang's hybrid pool."""
    from sglang.srt.model_executor.forward_context import get_attn_backend

    backend = get_attn_backend()
    linear = getattr(backend, "linear_attn_backend", None)
    if linear is None:
        raise RuntimeError("K3 KDA layers need SGLang's hybrid linear attention backend "
                           f"(got {type(backend).__name__}); is the config's linear_attn_config set?")
    meta = linear.forward_metadata
    cache = linear.req_to_token_pool.mamba2_layer_cache(layer_id)
    return KDAStateView(conv=cache.conv[0], temporal=cache.temporal,
                        slots=meta.mamba_cache_indices.long(), query_start_loc=meta.query_start_loc)


class KDAMixer(nn.Module):
    """Kimi Delta Attention for one layer. Input/output [T, hidden]."""

    def __init__(self, cfg: K3Config, layer_id: int):
        super().__init__()
        kda, hidden = cfg.kda, cfg.hidden_size
        self.layer_id = layer_id
        self.num_heads, self.head_dim = kda.num_heads, kda.head_dim
        self.proj_dim = kda.proj_dim
        self.conv_width = kda.conv_kernel_size
        self.lower_bound = kda.gate_lower_bound
        self.eps = cfg.rms_norm_eps
        self.scale = kda.head_dim ** -0.5
        p = self.proj_dim
        self.q_proj = nn.Linear(hidden, p, bias=False)
        self.k_proj = nn.Linear(hidden, p, bias=False)
        self.v_proj = nn.Linear(hidden, p, bias=False)
        self.g_proj = nn.Linear(hidden, p, bias=False)  # full-rank output gate
        self.f_a_proj = nn.Linear(hidden, kda.head_dim, bias=False)
        self.f_b_proj = nn.Linear(kda.head_dim, p, bias=False)
        self.b_proj = nn.Linear(hidden, kda.num_heads, bias=False)
        self.o_proj = nn.Linear(p, hidden, bias=False)
        fp32 = torch.float32
        self.q_conv1d = WeightOnly(p, 1, self.conv_width, dtype=fp32)
        self.k_conv1d = WeightOnly(p, 1, self.conv_width, dtype=fp32)
        self.v_conv1d = WeightOnly(p, 1, self.conv_width, dtype=fp32)
        # A_log is stored wider than the head count in K3 checkpoints; the loader narrows it.
        self.A_log = nn.Parameter(torch.zeros(kda.num_heads, dtype=fp32), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.zeros(p, dtype=fp32), requires_grad=False)
        self.o_norm = WeightOnly(kda.head_dim, dtype=fp32, fill=1.0)
        self._in_proj = FusedWeightCache()  # q|k|v|g|f_a|b as one matmul

    # -- pieces shared by prefill and decode
    def _conv_weight(self) -> torch.Tensor:
        """[3P, W] depthwise kernel for the concatenated q|k|v channels."""
        return torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight], dim=0).squeeze(1)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [T, hidden] -> (pre-conv q|k|v [T, 3P] fp32, g [T, H, K] log-decay, beta [T, H], out_gate [T, H, V])."""
        t, h, d, p = x.shape[0], self.num_heads, self.head_dim, self.proj_dim
        weights = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.g_proj.weight,
                   self.f_a_proj.weight, self.b_proj.weight]
        if sum(w.numel() * w.element_size() for w in weights) <= FUSED_PROJ_MAX_BYTES:
            fused = x @ self._in_proj.get(weights).T
        else:  # a fused copy of K3-full's projections would double ~0.7 GB per layer
            fused = torch.cat([x @ w.T for w in weights], dim=-1)
        qkv, out_gate, f_low, b = fused.split([3 * p, p, d, h], dim=-1)
        f = self.f_b_proj(f_low).view(t, h, d)
        g = kda_gate(f, self.A_log, self.dt_bias, self.lower_bound)
        return qkv.float(), g, torch.sigmoid(b.float()), out_gate.reshape(t, h, d)

    def _split_qkv(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Post-conv [T, 3P] -> q, k (L2-normalised) [T, H, K] and v [T, H, V], fp32."""
        t, h, d = y.shape[0], self.num_heads, self.head_dim
        q, k, v = y.float().split(self.proj_dim, dim=-1)
        return l2_normalize(q.view(t, h, d)), l2_normalize(k.view(t, h, d)), v.reshape(t, h, d)

    def _output(self, o: torch.Tensor, out_gate: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        o = gated_rms_norm(o, out_gate.float(), self.o_norm.weight, self.eps)
        return self.o_proj(o.reshape(o.shape[0], self.proj_dim).to(dtype))

    # -- SGLang forward
    def forward(self, x: torch.Tensor, forward_batch) -> torch.Tensor:
        mode = forward_batch.forward_mode
        if x.shape[0] == 0 or mode.is_idle():
            return torch.zeros_like(x)
        state = kda_state_view(forward_batch, self.layer_id)
        if mode.is_decode():
            return self._forward_decode(x, state)
        return self._forward_extend(x, state, forward_batch.extend_prefix_lens_cpu)

    def _forward_decode(self, x: torch.Tensor, state: KDAStateView) -> torch.Tensor:
        """One new token per request: x [B, hidden]."""
        slots = state.slots
        window = state.conv[slots].float()  # [B, W-1, 3P]
        pre, g, beta, out_gate = self._project(x)
        rows = torch.cat([window, pre.unsqueeze(1)], dim=1)  # [B, W, 3P]
        y = F.silu((rows * self._conv_weight().t().unsqueeze(0)).sum(dim=1))
        state.conv[slots] = rows[:, 1:].to(state.conv.dtype)
        q, k, v = self._split_qkv(y)
        o, new_state = kda_recurrent_step(q, k, v, g, beta, self.scale, state.temporal[slots].float())
        state.temporal[slots] = new_state.to(state.temporal.dtype)
        return self._output(o, out_gate, x.dtype)

    def _forward_extend(self, x: torch.Tensor, state: KDAStateView, prefix_lens: list[int]) -> torch.Tensor:
        """Variable-length prefill chunks; request i owns rows qsl[i]:qsl[i+1]."""
        pre, g_all, beta_all, gate_all = self._project(x)
        weight = self._conv_weight()
        out = torch.empty(x.shape[0], self.num_heads, self.head_dim, dtype=torch.float32, device=x.device)
        bounds = state.query_start_loc.tolist()
        for i, slot in enumerate(state.slots.tolist()):
            lo, hi = bounds[i], bounds[i + 1]
            if hi == lo:
                continue
            fresh = prefix_lens[i] == 0
            window = None if fresh else state.conv[slot].float()
            init = None if fresh else state.temporal[slot].float()
            y, new_window = short_conv_silu(pre[lo:hi], weight, window)
            q, k, v = self._split_qkv(y)
            o, final = chunk_kda(q, k, v, g_all[lo:hi], beta_all[lo:hi], self.scale, initial_state=init)
            out[lo:hi] = o
            state.conv[slot] = new_window.to(state.conv.dtype)
            state.temporal[slot] = final.to(state.temporal.dtype)
        return self._output(out, gate_all, x.dtype)
