"""K3's KDA mixer inside SGLang: projections here, the recurrence through `k3_sglang.kernels.dispatch`.

The conv windows and fp32 recurrent states live in SGLang's mamba pool
(`req_to_token_pool.mamba2_layer_cache(layer_id)`: conv [slots, W-1, 3P] holding the q|k|v
pre-conv rows, temporal [slots, H, K, V]); the slot of each request comes from the hybrid
backend's forward metadata. Under attention TP each rank holds H / tp heads: its q|k|v|g|f_b|b rows, conv
channels, A_log and dt_bias, o_proj columns (all-reduced), and SGLang's pool holds the same head shard of the
state ([W-1, 3P/tp], [H/tp, K, V]). Prefill is `dispatch.kda_prefill` (chunked KDA, varlen), decode
`dispatch.kda_decode` (one fused step for the whole batch): Triton on CUDA, torch elsewhere, one
contract (kernels/kda/decode_common.py), including padding requests (slot -1, as SGLang's
CUDA-graph decode pads): output 0 and no pool row touched. A TARGET_VERIFY forward (speculative chains) follows
SGLang's verify contract, as SGLang's own KDA backend does: `dispatch.kda_verify` leaves the pools alone and writes
the state and conv window after every chain token into the mamba pool's per-draft scratch (`intermediate_ssm`,
`intermediate_conv_window`, at the row SGLang's `select_verify_intermediate_state_indices` gives each request);
SGLang's hybrid backend commits the accepted step after acceptance (`update_mamba_state_after_mtp_verify`).
When SGLang's `extra_buffer` prefix cache asks for state
snapshots in its track slots, extend and decode leave them (model/kda_snapshot.py, checked against a per-token
reference, and end to end under DCP against TP1: tests/e2e/test_tp_dcp.py); `k3 serve` picks it under DCP.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from k3_sglang.config import K3Config
from k3_sglang.kernels import dispatch
from k3_sglang.kernels.kda.decode_common import KDAOptions, KDAWeights, VerifyScratch, chain_layout
from k3_sglang.model.common import FusedWeightCache, WeightOnly
from k3_sglang.model.kda_snapshot import SnapshotPlan, copy_snapshots, prefill_with_snapshots, snapshot_plan
from k3_sglang.model.parallel import ModelParallel, all_reduce, column, mark_sharded, row
from k3_sglang.parallel.tp import Shard


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
    snapshots: SnapshotPlan | None = None  # extra_buffer: track-slot snapshots this forward must leave


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
                        slots=meta.mamba_cache_indices.long(), query_start_loc=meta.query_start_loc,
                        snapshots=snapshot_plan(forward_batch, getattr(meta, "mamba_track_indices", None)))


def verify_scratch(forward_batch, layer_id: int, slots: torch.Tensor) -> VerifyScratch:
    """SGLang's per-draft scratch of one KDA layer for a TARGET_VERIFY forward: intermediate_ssm [R, N, H, K, V],
    intermediate_conv_window [R, N, W-1, D] and each request's row, chosen as SGLang's KDA backend chooses it
    (request i -> row i; under SGLang's pipeline speculation the request's req-pool row, stable across stages)."""
    from sglang.srt.layers.attention.linear.utils import select_verify_intermediate_state_indices
    from sglang.srt.model_executor.forward_context import get_attn_backend

    linear = get_attn_backend().linear_attn_backend
    cache = linear.req_to_token_pool.mamba2_layer_cache(layer_id)
    state = getattr(cache, "intermediate_ssm", None)
    if state is None:
        raise RuntimeError("K3 KDA verify needs SGLang's speculative mamba scratch (MambaPool.SpeculativeState); "
                           "none was allocated")
    bs = slots.shape[0]
    rows = select_verify_intermediate_state_indices(linear.verify_intermediate_state_indices,
                                                    forward_batch.req_pool_indices, slots >= 0,
                                                    linear.req_to_token_pool.size)[:bs]
    return VerifyScratch(state, cache.intermediate_conv_window[0], rows.to(slots.device))


def _shard(param: nn.Parameter, heads: Shard) -> nn.Parameter:
    return mark_sharded(param, 0, heads) if heads.size > 1 else param


def _sharded(holder: WeightOnly, heads: Shard) -> WeightOnly:
    _shard(holder.weight, heads)
    return holder


class KDAMixer(nn.Module):
    """Kimi Delta Attention for one layer. Input/output [T, hidden]."""

    def __init__(self, cfg: K3Config, layer_id: int):
        super().__init__()
        kda, hidden = cfg.kda, cfg.hidden_size
        self.layer_id = layer_id
        self.mp = ModelParallel.current()
        heads, what = self.mp.attn_tp, "the KDA head count"
        self.num_heads, self.head_dim = heads.part(kda.num_heads, what), kda.head_dim  # this rank's heads
        self.proj_dim = self.num_heads * kda.head_dim
        self.conv_width = kda.conv_kernel_size
        self.lower_bound = kda.gate_lower_bound
        self.eps = cfg.rms_norm_eps
        self.scale = kda.head_dim ** -0.5
        p, full = self.proj_dim, kda.proj_dim
        self.q_proj = column(hidden, full, heads, what)
        self.k_proj = column(hidden, full, heads, what)
        self.v_proj = column(hidden, full, heads, what)
        self.g_proj = column(hidden, full, heads, what)  # full-rank output gate
        self.f_a_proj = nn.Linear(hidden, kda.head_dim, bias=False)
        self.f_b_proj = column(kda.head_dim, full, heads, what)
        self.b_proj = column(hidden, kda.num_heads, heads, what)
        self.o_proj = row(full, hidden, heads, what)
        fp32 = torch.float32
        self.q_conv1d = _sharded(WeightOnly(p, 1, self.conv_width, dtype=fp32), heads)
        self.k_conv1d = _sharded(WeightOnly(p, 1, self.conv_width, dtype=fp32), heads)
        self.v_conv1d = _sharded(WeightOnly(p, 1, self.conv_width, dtype=fp32), heads)
        # A_log is stored wider than the head count in K3 checkpoints; the loader narrows it, then shards it.
        self.A_log = _shard(nn.Parameter(torch.zeros(self.num_heads, dtype=fp32), requires_grad=False), heads)
        self.dt_bias = _shard(nn.Parameter(torch.zeros(p, dtype=fp32), requires_grad=False), heads)
        self.o_norm = WeightOnly(kda.head_dim, dtype=fp32, fill=1.0)
        self._in_proj = FusedWeightCache()  # q|k|v|g|f_a|b as one matmul
        self._conv = FusedWeightCache()  # the q|k|v depthwise kernels as one [3P, 1, W] weight

    # -- pieces shared by prefill and decode
    def kernel_args(self) -> tuple[KDAWeights, KDAOptions]:
        """The layer's weights and scalars in the dispatch ops' form (conv kernel [3P, W] for the q|k|v channels)."""
        conv = self._conv.get([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight]).squeeze(1)
        weights = KDAWeights(conv_weight=conv, A_log=self.A_log, dt_bias=self.dt_bias, o_norm=self.o_norm.weight)
        return weights, KDAOptions(scale=self.scale, lower_bound=self.lower_bound, norm_eps=self.eps)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [T, hidden] -> the raw kernel inputs, contiguous, in x.dtype: pre-conv q|k|v [T, 3P],
        gate input f [T, H*K], beta logits b [T, H], output gate [T, H*V]."""
        d, h, p = self.head_dim, self.num_heads, self.proj_dim
        weights = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.g_proj.weight,
                   self.f_a_proj.weight, self.b_proj.weight]
        if sum(w.numel() * w.element_size() for w in weights) <= FUSED_PROJ_MAX_BYTES:
            fused = x @ self._in_proj.get(weights).T
        else:  # a fused copy of K3-full's projections would double ~0.7 GB per layer
            fused = torch.cat([x @ w.T for w in weights], dim=-1)
        qkv, out_gate, f_low, b = fused.split([3 * p, p, d, h], dim=-1)
        return qkv.contiguous(), self.f_b_proj(f_low), b.contiguous(), out_gate.contiguous()

    # -- SGLang forward
    def forward(self, x: torch.Tensor, forward_batch) -> torch.Tensor:
        mode = forward_batch.forward_mode
        if x.shape[0] == 0 or mode.is_idle():
            return torch.zeros_like(x)
        state = kda_state_view(forward_batch, self.layer_id)
        if mode.is_target_verify():  # before is_extend: SGLang counts TARGET_VERIFY as an extend mode
            return self.forward_verify(x, state, forward_batch)
        if mode.is_decode():
            return self.forward_decode(x, state)
        return self.forward_extend(x, state, forward_batch.extend_prefix_lens_cpu)

    def forward_decode(self, x: torch.Tensor, state: KDAStateView) -> torch.Tensor:
        """One new token per request: x [B, hidden] -> [B, hidden]; a padding request (slot -1) gives 0."""
        pre, f, b, out_gate = self.project(x)
        weights, opts = self.kernel_args()
        o = dispatch.kda_decode(pre.to(state.conv.dtype)[:, None], f[:, None], b[:, None], out_gate[:, None], weights,
                                state.conv, state.temporal, state.slots, opts)  # [B, 1, H*V]
        if state.snapshots is not None:
            copy_snapshots(state.conv, state.temporal, state.slots, state.snapshots)
        return all_reduce(self.o_proj(o[:, 0].to(x.dtype)), self.mp.attn_tp, "attn_tp_group")

    def forward_extend(self, x: torch.Tensor, state: KDAStateView, prefix_lens: list[int]) -> torch.Tensor:
        """Variable-length prefill chunks x [T, hidden] -> [T, hidden]; request i owns rows qsl[i]:qsl[i+1] and
        continues from its slot's state when it has a cached prefix; state.snapshots' track slots are written."""
        pre, f, b, out_gate = self.project(x)
        weights, opts = self.kernel_args()
        has_state = torch.tensor([int(n) > 0 for n in prefix_lens], dtype=torch.bool, device=x.device)

        def prefill(qkv, f_, b_, g_, cu, slots, init):
            return dispatch.kda_prefill(qkv, f_, b_, g_, cu, weights, state.conv, state.temporal, slots, init, opts)

        o = prefill_with_snapshots(prefill, pre.to(state.conv.dtype), f, b, out_gate, state.query_start_loc,
                                   state.conv, state.temporal, state.slots, has_state, state.snapshots)  # [T, H*V]
        return all_reduce(self.o_proj(o.to(x.dtype)), self.mp.attn_tp, "attn_tp_group")

    def forward_verify(self, x: torch.Tensor, state: KDAStateView, forward_batch) -> torch.Tensor:
        """Speculative chains x [T, hidden] -> [T, hidden], the pools untouched (SGLang's verify contract).

        Request b owns packed rows qsl[b]:qsl[b+1] (SGLang's ragged verify layout, or draft_token_num each). They run
        as batched recurrent steps from each slot's state (the same per-step ops as decode, so a committed step is
        bit-identical to decoding those tokens); the state and window after every token go to SGLang's per-draft
        scratch, which SGLang's hybrid backend commits after acceptance."""
        pre, f, b, out_gate = self.project(x)
        weights, opts = self.kernel_args()
        index, packed = chain_layout(state.query_start_loc, x.shape[0])  # [B, L] packed row (T = padding), [T]

        def dense(t: torch.Tensor) -> torch.Tensor:  # [T, C] -> [B, L, C], zero rows past each chain
            return torch.cat([t, t.new_zeros(1, t.shape[1])])[index]

        scratch = verify_scratch(forward_batch, self.layer_id, state.slots[: index.shape[0]])
        o = dispatch.kda_verify(dense(pre.to(state.conv.dtype)), dense(f), dense(b), dense(out_gate), weights,
                                state.conv, state.temporal, state.slots[: index.shape[0]], scratch, opts)
        o = o.reshape(-1, o.shape[-1])[packed]  # [T, H*V]
        return all_reduce(self.o_proj(o.to(x.dtype)), self.mp.attn_tp, "attn_tp_group")

