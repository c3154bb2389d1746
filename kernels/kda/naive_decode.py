"""Torch implementations of the pooled KDA decode and speculative verify (the CPU path of the dispatch layer).

Composed from the references in naive.py; the contract (layouts, in-place pool updates, padding slots) is in
decode_common.py. Decode and verify run every live request of the batch at once (one vectorised step per token),
so the served CPU decode stays bound by compute rather than by a Python loop over requests.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from k3_sglang.kernels.kda.decode_common import (
    KDAOptions,
    KDAWeights,
    VerifyScratch,
    check_decode_args,
    check_scratch,
    resolve_scale,
)
from k3_sglang.kernels.kda.naive import (
    chunk_kda,
    delta_rule_step,
    gated_rms_norm,
    kda_gate,
    l2_normalize,
    short_conv_silu,
)
from k3_sglang.kernels.norm.naive import compute_dtype


def _run_tokens(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts,
                scratch: VerifyScratch | None):
    """Every request of the batch at once, token by token; the pools are written back when scratch is None (decode),
    otherwise left untouched and the state and window after every token go to the scratch (verify).

    Padding requests (negative slot) compute on a stand-in row (slot 0, read only) and are then dropped: output 0,
    no pool or scratch row written. Computing all B rows keeps every op's shapes independent of which requests are
    padding, so a request's results are bit-identical in decode and verify of the same batch size (exact commits).
    """
    dims = check_decode_args("kda_decode", mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices)
    B, n, H, K, V = dims.B, dims.n, dims.H, dims.K, dims.V
    if scratch is not None:
        check_scratch("kda_verify", scratch, dims, conv_pool, state_pool)
    scale = resolve_scale(opts, K)
    dt = compute_dtype(mixed_qkv, state_pool)
    if n == 0:
        return torch.zeros(B, 0, H * V, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    valid = state_indices >= 0  # [B]
    live = valid.nonzero().flatten()
    safe = state_indices.long().clamp(min=0)
    window, S = conv_pool[safe].to(dt), state_pool[safe].to(dt)  # [B, W-1, D], [B, H, K, V]
    conv_w = weights.conv_weight.to(dt).t()  # [W, D]
    outs = []
    for t in range(n):
        def token(x):  # token t of every request, contiguous: the same memory layout whatever n is
            return x[:, t].to(dt).contiguous()

        rows = torch.cat([window, token(mixed_qkv)[:, None]], 1)  # [B, W, D]
        y = F.silu((rows * conv_w).sum(1))
        window = rows[:, 1:]
        q, k, v = y.split([H * K, H * K, H * V], -1)
        q, k = l2_normalize(q.reshape(B, H, K), opts.l2_eps), l2_normalize(k.reshape(B, H, K), opts.l2_eps)
        g = kda_gate(token(f).view(B, H, K), weights.A_log, weights.dt_bias, opts.lower_bound)
        out, S, _ = delta_rule_step(q, k, v.reshape(B, H, V), g, torch.sigmoid(token(b)), scale, S)
        outs.append(gated_rms_norm(out, token(g_out).view(B, H, V), weights.o_norm, opts.norm_eps))
        if scratch is not None and live.numel():
            at = scratch.rows.long()[live]
            scratch.state[at, t] = S[live].to(scratch.state.dtype)
            scratch.conv[at, t] = window[live].to(scratch.conv.dtype)
    o = torch.stack(outs, 1).reshape(B, n, H * V)  # zero for padding requests (where: stand-ins may be inf)
    o = torch.where(valid.view(B, 1, 1), o, torch.zeros((), dtype=o.dtype, device=o.device)).to(mixed_qkv.dtype)
    if scratch is None and live.numel():
        state_pool[safe[live]] = S[live].to(state_pool.dtype)
        conv_pool[safe[live]] = window[live].to(conv_pool.dtype)
    return o


def kda_decode_torch(mixed_qkv, f, b, g_out, weights: KDAWeights, conv_pool, state_pool, state_indices,
                     opts: KDAOptions = KDAOptions()) -> torch.Tensor:
    """Fused-decode semantics in torch: n tokens per request, pools updated in place. Returns o [B, n, H*V]."""
    return _run_tokens(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts, None)


def kda_verify_torch(mixed_qkv, f, b, g_out, weights: KDAWeights, conv_pool, state_pool, state_indices,
                     scratch: VerifyScratch, opts: KDAOptions = KDAOptions()) -> torch.Tensor:
    """Speculative verify of n tokens per request, pools untouched: the state and conv window after token t of
    request b go to scratch.state / scratch.conv [scratch.rows[b], t] (SGLang's per-draft scratch, which its commit
    after acceptance copies into the pools: bit-identical to decoding the accepted tokens). Returns o [B, n, H*V]."""
    return _run_tokens(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts, scratch)


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
        y, window = short_conv_silu(mixed_qkv[lo:hi].to(dt), weights.conv_weight, window)  # conv in fp32
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
