"""Torch implementations of the pooled KDA decode / verify / commit (the CPU path of the dispatch layer).

Composed from the references in naive.py; the contract (layouts, in-place pool updates) is in decode_common.py.
"""
from __future__ import annotations

import torch

from k3_sglang.kernels.kda.decode_common import (
    KDAOptions,
    KDAWeights,
    VerifyRecord,
    check_commit_args,
    check_decode_args,
    resolve_scale,
)
from k3_sglang.kernels.kda.naive import (
    add_rank_one,
    chunk_kda,
    decay_state,
    delta_rule_step,
    gated_rms_norm,
    kda_gate,
    l2_normalize,
    short_conv_silu,
)
from k3_sglang.kernels.norm.naive import compute_dtype


def _token(x, f, b, g_out, weights, window, S, opts, scale, dims, dt):
    """One token of one request: x [D], f [H*K], b [H], g_out [H*V]. Returns (o [H*V], window, S, (k, delta, g))."""
    H, K, V = dims.H, dims.K, dims.V
    y, window = short_conv_silu(x[None], weights.conv_weight, window)
    q, k, v = y[0].to(dt).split([H * K, H * K, H * V], -1)
    q, k = l2_normalize(q.view(H, K), opts.l2_eps), l2_normalize(k.view(H, K), opts.l2_eps)
    g = kda_gate(f.to(dt).view(H, K), weights.A_log, weights.dt_bias, opts.lower_bound)
    out, S, delta = delta_rule_step(q, k, v.view(H, V), g, torch.sigmoid(b.to(dt)), scale, S)
    o = gated_rms_norm(out, g_out.view(H, V).to(dt), weights.o_norm, opts.norm_eps).reshape(H * V)
    return o, window, S, (k, delta, g)


def _run_tokens(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts, write_back):
    """Token by token (so every token sees the same shapes as a one-token decode: bit-exact commits)."""
    dims = check_decode_args("kda_decode", mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices)
    B, n, H, K, V = dims.B, dims.n, dims.H, dims.K, dims.V
    scale = resolve_scale(opts, K)
    o = torch.zeros(B, n, H * V, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    dt = compute_dtype(mixed_qkv, state_pool)
    rec = [torch.zeros(B, n, H, d, dtype=dt, device=mixed_qkv.device) for d in (K, V, K)]
    for i, slot in enumerate(state_indices.tolist()):
        if slot < 0:
            continue
        window, S = conv_pool[slot], state_pool[slot].to(dt)
        for t in range(n):
            o_t, window, S, recorded = _token(mixed_qkv[i, t], f[i, t], b[i, t], g_out[i, t], weights, window, S,
                                              opts, scale, dims, dt)
            o[i, t] = o_t.to(o.dtype)
            for buf, val in zip(rec, recorded):
                buf[i, t] = val
        if write_back:
            state_pool[slot] = S
            conv_pool[slot] = window
    return o, VerifyRecord(rec[0], rec[1], rec[2], mixed_qkv)


def kda_decode_torch(mixed_qkv, f, b, g_out, weights: KDAWeights, conv_pool, state_pool, state_indices,
                     opts: KDAOptions = KDAOptions()) -> torch.Tensor:
    """Fused-decode semantics in torch: n tokens per request, pools updated in place. Returns o [B, n, H*V]."""
    return _run_tokens(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts, True)[0]


def kda_verify_torch(mixed_qkv, f, b, g_out, weights: KDAWeights, conv_pool, state_pool, state_indices,
                     opts: KDAOptions = KDAOptions()) -> tuple[torch.Tensor, VerifyRecord]:
    """Speculative verify: outputs for n draft tokens, pools untouched. Returns (o [B, n, H*V], record)."""
    return _run_tokens(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts, False)


def kda_commit_torch(record: VerifyRecord, conv_pool, state_pool, state_indices, num_accepted) -> None:
    """Commit the first num_accepted[b] verified tokens of each request into the pools, in place."""
    check_commit_args("kda_commit", record, conv_pool, state_pool, state_indices, num_accepted)
    W1 = conv_pool.shape[1]
    for i, (slot, acc) in enumerate(zip(state_indices.tolist(), num_accepted.tolist())):
        if slot < 0 or acc <= 0:
            continue
        S = state_pool[slot]
        for t in range(acc):
            S = add_rank_one(decay_state(S, record.g[i, t]), record.k[i, t], record.delta[i, t])
        state_pool[slot] = S
        rows = torch.cat([conv_pool[slot], record.mixed_qkv[i, :acc].to(conv_pool.dtype)])
        conv_pool[slot] = rows[rows.shape[0] - W1:]


def kda_prefill_torch(mixed_qkv, f, b, g_out, cu_seqlens, weights: KDAWeights, conv_pool, state_pool, state_indices,
                      has_initial_state=None, opts: KDAOptions = KDAOptions(), chunk_size: int = 64) -> torch.Tensor:
    """Variable-length chunked prefill from and into the slot pools (chunk_kda per sequence).

    mixed_qkv [T, D], f [T, H*K], b [T, H], g_out [T, H*V] for all sequences packed; cu_seqlens [N+1] int;
    state_indices [N]; has_initial_state [N] bool (None = all True): False starts from a zero state and window.
    Writes each sequence's final state and last W-1 pre-conv rows to its slot. Returns o [T, H*V].
    """
    N = cu_seqlens.shape[0] - 1
    if cu_seqlens.dim() != 1 or N < 0 or tuple(state_indices.shape) != (N,):
        raise ValueError(f"kda_prefill: cu_seqlens {tuple(cu_seqlens.shape)} must be [N+1], state_indices {tuple(state_indices.shape)} [N]")
    if mixed_qkv.dim() != 2 or int(cu_seqlens[-1]) != mixed_qkv.shape[0]:
        raise ValueError(f"kda_prefill: mixed_qkv {tuple(mixed_qkv.shape)} must be [T, D] with T = cu_seqlens[-1]")
    dims = check_decode_args("kda_prefill", mixed_qkv[None], f[None], b[None], g_out[None], weights, conv_pool,
                             state_pool, state_indices[:1] if N else state_indices.new_zeros(1))
    H, K, V = dims.H, dims.K, dims.V
    dt = compute_dtype(mixed_qkv, state_pool)
    o = torch.zeros(mixed_qkv.shape[0], H * V, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    starts = cu_seqlens.tolist()
    init = [True] * N if has_initial_state is None else [bool(x) for x in has_initial_state.tolist()]
    for i, slot in enumerate(state_indices.tolist()):
        lo, hi = starts[i], starts[i + 1]
        if slot < 0 or hi <= lo:
            continue
        window = conv_pool[slot] if init[i] else torch.zeros_like(conv_pool[slot])
        y, window = short_conv_silu(mixed_qkv[lo:hi], weights.conv_weight, window)
        q, k, v = y.to(dt).split([H * K, H * K, H * V], -1)
        q, k = l2_normalize(q.reshape(-1, H, K), opts.l2_eps), l2_normalize(k.reshape(-1, H, K), opts.l2_eps)
        g = kda_gate(f[lo:hi].to(dt).view(-1, H, K), weights.A_log, weights.dt_bias, opts.lower_bound)
        beta = torch.sigmoid(b[lo:hi].to(dt))
        s0 = state_pool[slot].to(dt) if init[i] else None
        out, S = chunk_kda(q, k, v.reshape(-1, H, V), g, beta, resolve_scale(opts, K), s0, chunk_size)
        o[lo:hi] = gated_rms_norm(out, g_out[lo:hi].view(-1, H, V).to(dt), weights.o_norm,
                                  opts.norm_eps).reshape(-1, H * V).to(o.dtype)
        state_pool[slot] = S.to(state_pool.dtype)
        conv_pool[slot] = window
    return o
