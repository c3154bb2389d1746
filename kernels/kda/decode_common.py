"""Shared contract of the pooled KDA decode / verify / commit ops (torch path and Triton path).

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
class VerifyRecord:
    """What a verify pass keeps so that an accepted prefix can be committed without per-token state copies.

    k [B, n, H, K] normalised keys, delta [B, n, H, V] = beta * (v - S'^T k), g [B, n, H, K] log-decays (all fp32),
    mixed_qkv [B, n, D] the verified pre-conv rows (for the conv window). Commit replays S <- exp(g) S + k delta^T.
    """

    k: torch.Tensor
    delta: torch.Tensor
    g: torch.Tensor
    mixed_qkv: torch.Tensor


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


def check_commit_args(name, record: VerifyRecord, conv_pool, state_pool, state_indices, num_accepted) -> None:
    B, n = record.k.shape[:2]
    if tuple(num_accepted.shape) != (B,) or tuple(state_indices.shape) != (B,):
        raise ValueError(f"{name}: num_accepted {tuple(num_accepted.shape)} and state_indices {tuple(state_indices.shape)} must be [B] = [{B}]")
    if tuple(state_pool.shape[1:]) != tuple(record.k.shape[2:]) + (record.delta.shape[-1],):
        raise ValueError(f"{name}: state_pool {tuple(state_pool.shape)} does not match record k {tuple(record.k.shape)}")
    if conv_pool.shape[-1] != record.mixed_qkv.shape[-1]:
        raise ValueError(f"{name}: conv_pool {tuple(conv_pool.shape)} does not match mixed_qkv {tuple(record.mixed_qkv.shape)}")


def resolve_scale(opts: KDAOptions, K: int) -> float:
    return K ** -0.5 if opts.scale is None else opts.scale
