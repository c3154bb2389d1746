"""Shared contract of the pooled KDA decode and speculative verify ops (torch path and Triton path).

Layouts (B requests, n tokens per request, H heads, K key dim, V value dim, W conv width, S pool slots):
  mixed_qkv [B, n, D] pre-conv projected rows, D = 2*H*K + H*V, channels ordered [q (H*K) | k (H*K) | v (H*V)]
  f [B, n, H*K] raw low-rank gate output;  b [B, n, H] raw beta logits;  g_out [B, n, H*V] raw output gate
  conv_pool [S, W-1, D] previous pre-conv rows per slot, oldest first, in mixed_qkv's dtype;
  state_pool [S, H, K, V] float32 (the torch path also takes float64)
  state_indices [B] int slot of each request (negative = padding: the request is skipped and its output is 0)
Output o [B, n, H*V] in mixed_qkv.dtype = gated_rms_norm(delta-rule output, g_out) per head.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KDAWeights:
    """Per-layer KDA weights the fused ops read: conv_weight [D, W] (fp32), A_log [>=H], dt_bias [H*K], o_norm [V]."""

    conv_weight: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    o_norm: torch.Tensor


@dataclass(frozen=True)
class KDAOptions:
    """Scalars of the K3 KDA layer. scale None means K ** -0.5."""

    scale: float | None = None
    lower_bound: float = -5.0
    norm_eps: float = 1e-5
    l2_eps: float = 1e-6


@dataclass(frozen=True)
class VerifyScratch:
    """Where a verify leaves each request's state after every verified token (SGLang's speculative scratch, the
    mamba pool's `intermediate_ssm` / `intermediate_conv_window` of one layer): request b's state after token t goes
    to state[rows[b], t] [H, K, V] (fp32) and its conv window (the last W-1 pre-conv rows, oldest first) to
    conv[rows[b], t] [W-1, D]. SGLang's commit after acceptance copies the accepted step of each into the pools.

    state [R, N, H, K, V], conv [R, N, W-1, D] (N >= n tokens per request), rows [B] int (padding requests: any).
    """

    state: torch.Tensor
    conv: torch.Tensor
    rows: torch.Tensor


@dataclass(frozen=True)
class KDADims:
    B: int
    n: int
    H: int
    K: int
    V: int
    W: int

    @property
    def D(self) -> int:
        return 2 * self.H * self.K + self.H * self.V


def check_decode_args(name, mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices) -> KDADims:
    """Validate shapes (ValueError naming the offending tensor) and return the dimensions."""
    if mixed_qkv.dim() != 3 or b.dim() != 3 or tuple(b.shape[:2]) != tuple(mixed_qkv.shape[:2]):
        raise ValueError(f"{name}: mixed_qkv {tuple(mixed_qkv.shape)} must be [B, n, D] and b {tuple(b.shape)} [B, n, H]")
    B, n, D = mixed_qkv.shape
    H = b.shape[2]
    V = weights.o_norm.shape[0]
    if f.dim() != 3 or tuple(f.shape[:2]) != (B, n) or f.shape[2] % H:
        raise ValueError(f"{name}: f {tuple(f.shape)} must be [B, n, H*K] with H={H}")
    K = f.shape[2] // H
    W = weights.conv_weight.shape[-1]
    dims = KDADims(B, n, H, K, V, W)
    if D != dims.D or tuple(weights.conv_weight.shape) != (D, W) or W < 2:
        raise ValueError(
            f"{name}: mixed_qkv {tuple(mixed_qkv.shape)} needs D = 2*H*K + H*V = {dims.D} and conv_weight "
            f"{tuple(weights.conv_weight.shape)} [D, W>=2]"
        )
    if tuple(g_out.shape) != (B, n, H * V):
        raise ValueError(f"{name}: g_out {tuple(g_out.shape)} must be [B, n, H*V] = {(B, n, H * V)}")
    if weights.A_log.dim() != 1 or weights.A_log.shape[0] < H or weights.dt_bias.numel() != H * K:
        raise ValueError(f"{name}: A_log {tuple(weights.A_log.shape)} needs >= {H} entries, dt_bias {tuple(weights.dt_bias.shape)} {H * K}")
    S = state_pool.shape[0]
    if tuple(state_pool.shape[1:]) != (H, K, V) or not state_pool.is_floating_point():
        raise ValueError(f"{name}: state_pool {tuple(state_pool.shape)} must be float [S, H, K, V] = [S, {H}, {K}, {V}]")
    if tuple(conv_pool.shape) != (S, W - 1, D) or conv_pool.dtype != mixed_qkv.dtype:
        raise ValueError(
            f"{name}: conv_pool {tuple(conv_pool.shape)} {conv_pool.dtype} must be [S, W-1, D] = {(S, W - 1, D)} "
            f"in mixed_qkv's dtype {mixed_qkv.dtype}"
        )
    if tuple(state_indices.shape) != (B,) or state_indices.is_floating_point():
        raise ValueError(f"{name}: state_indices {tuple(state_indices.shape)} must be integer [B] = [{B}]")
    return dims


def check_scratch(name, scratch: VerifyScratch, dims: KDADims, conv_pool, state_pool) -> None:
    """Validate a verify's scratch against the batch (ValueError naming the offending tensor)."""
    st, cv, rows = scratch.state, scratch.conv, scratch.rows
    if st.dim() != 5 or tuple(st.shape[2:]) != tuple(state_pool.shape[1:]) or st.shape[1] < dims.n:
        raise ValueError(f"{name}: scratch state {tuple(st.shape)} must be [R, N >= {dims.n}, "
                         f"{', '.join(map(str, state_pool.shape[1:]))}]")
    if cv.dim() != 4 or tuple(cv.shape[2:]) != tuple(conv_pool.shape[1:]) or cv.shape[:2] != st.shape[:2]:
        raise ValueError(f"{name}: scratch conv {tuple(cv.shape)} must be [R, N, "
                         f"{', '.join(map(str, conv_pool.shape[1:]))}] beside state {tuple(st.shape)}")
    if cv.dtype != conv_pool.dtype or st.dtype != state_pool.dtype:
        raise ValueError(f"{name}: scratch dtypes {cv.dtype}/{st.dtype} must match the pools' "
                         f"{conv_pool.dtype}/{state_pool.dtype}")
    if tuple(rows.shape) != (dims.B,) or rows.is_floating_point():
        raise ValueError(f"{name}: scratch rows {tuple(rows.shape)} must be integer [B] = [{dims.B}]")


def resolve_scale(opts: KDAOptions, K: int) -> float:
    return K ** -0.5 if opts.scale is None else opts.scale


def chain_layout(query_start_loc: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed chains (request b owns rows qsl[b]:qsl[b+1] of num_tokens, lengths equal or ragged) ->
    (dense index [B, L] int64: the packed row of token t of request b, num_tokens where t is past its chain, L the
    longest chain; packed index [T] int64: each packed row's cell in a flattened [B, L]), on qsl's device."""
    starts = query_start_loc.long().cpu()
    lens = starts[1:] - starts[:-1]
    L = int(lens.max()) if lens.numel() else 0
    steps = torch.arange(L)[None, :]
    valid = steps < lens[:, None]
    index = torch.where(valid, starts[:-1, None] + steps, torch.full_like(steps, num_tokens))
    return index.to(query_start_loc.device), valid.flatten().nonzero().flatten().to(query_start_loc.device)
