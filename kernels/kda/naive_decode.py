"""Torch implementations of the pooled KDA decode / verify / commit (the CPU path of the dispatch layer).

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


def _run_tokens(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts, write_back):
    """Every request of the batch at once, token by token.

    Padding requests (negative slot) compute on a stand-in row (slot 0, read only) and are then dropped: output 0,
    no pool row written. Computing all B rows keeps every op's shapes independent of which requests are padding, so
    a request's results are bit-identical in decode and verify of the same batch size (exact commits).
    """
    dims = check_decode_args("kda_decode", mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices)
    B, n, H, K, V = dims.B, dims.n, dims.H, dims.K, dims.V
    scale = resolve_scale(opts, K)
    dt = compute_dtype(mixed_qkv, state_pool)
    if n == 0:
        return (torch.zeros(B, 0, H * V, dtype=mixed_qkv.dtype, device=mixed_qkv.device),
                VerifyRecord(*(torch.zeros(B, 0, H, d, dtype=dt, device=mixed_qkv.device) for d in (K, V, K)), mixed_qkv))
    valid = state_indices >= 0  # [B]
    safe = state_indices.long().clamp(min=0)
    window, S = conv_pool[safe].to(dt), state_pool[safe].to(dt)  # [B, W-1, D], [B, H, K, V]
    conv_w = weights.conv_weight.to(dt).t()  # [W, D]
    outs, rec = [], ([], [], [])
    for t in range(n):
        def token(x):  # token t of every request, contiguous: the same memory layout whatever n is
            return x[:, t].to(dt).contiguous()

        rows = torch.cat([window, token(mixed_qkv)[:, None]], 1)  # [B, W, D]
        y = F.silu((rows * conv_w).sum(1))
        window = rows[:, 1:]
        q, k, v = y.split([H * K, H * K, H * V], -1)
        q, k = l2_normalize(q.reshape(B, H, K), opts.l2_eps), l2_normalize(k.reshape(B, H, K), opts.l2_eps)
        g = kda_gate(token(f).view(B, H, K), weights.A_log, weights.dt_bias, opts.lower_bound)
        out, S, delta = delta_rule_step(q, k, v.reshape(B, H, V), g, torch.sigmoid(token(b)), scale, S)
        outs.append(gated_rms_norm(out, token(g_out).view(B, H, V), weights.o_norm, opts.norm_eps))
        for buf, val in zip(rec, (k, delta, g)):
            buf.append(val)

    def stacked(xs, shape):  # [B, n, ...], zero for padding requests (where, not multiply: stand-ins may be inf)
        x = torch.stack(xs, 1).reshape(B, n, *shape)
        return torch.where(valid.view(B, *[1] * (x.dim() - 1)), x, torch.zeros((), dtype=x.dtype, device=x.device))

    o = stacked(outs, (H * V,)).to(mixed_qkv.dtype)
    record = VerifyRecord(stacked(rec[0], (H, K)), stacked(rec[1], (H, V)), stacked(rec[2], (H, K)), mixed_qkv)
    if write_back and bool(valid.any()):
        live = valid.nonzero().flatten()
        state_pool[safe[live]] = S[live].to(state_pool.dtype)
        conv_pool[safe[live]] = window[live].to(conv_pool.dtype)
    return o, record


def kda_decode_torch(mixed_qkv, f, b, g_out, weights: KDAWeights, conv_pool, state_pool, state_indices,
                     opts: KDAOptions = KDAOptions()) -> torch.Tensor:
    """Fused-decode semantics in torch: n tokens per request, pools updated in place. Returns o [B, n, H*V]."""
    return _run_tokens(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts, True)[0]


def kda_verify_torch(mixed_qkv, f, b, g_out, weights: KDAWeights, conv_pool, state_pool, state_indices,
                     opts: KDAOptions = KDAOptions()) -> tuple[torch.Tensor, VerifyRecord]:
    """Speculative verify: outputs for n draft tokens, pools untouched. Returns (o [B, n, H*V], record)."""
    return _run_tokens(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts, False)


def kda_commit_torch(record: VerifyRecord, conv_pool, state_pool, state_indices, num_accepted) -> None:
    """Commit the first num_accepted[b] verified tokens of each request into the pools, in place.

    Batched over requests, one elementwise replay step per token (S <- exp(g) S + k delta^T, masked where
    t >= num_accepted[b]): the same ops verify ran, so the result is bit-identical to decoding those tokens."""
    check_commit_args("kda_commit", record, conv_pool, state_pool, state_indices, num_accepted)
    acc = num_accepted.to(torch.long).cpu()
    live = ((state_indices.cpu() >= 0) & (acc > 0)).nonzero().flatten()
    if live.numel() == 0:
        return
    slots = state_indices.cpu().long()[live].to(state_pool.device)
    acc_l = acc[live].to(state_pool.device)
    S = state_pool[slots]
    li = live.to(record.k.device)
    k, delta, g = record.k[li], record.delta[li], record.g[li]
    for t in range(int(acc_l.max())):
        stepped = add_rank_one(decay_state(S, g[:, t]), k[:, t], delta[:, t]).to(S.dtype)
        S = torch.where((t < acc_l).view(-1, 1, 1, 1), stepped, S)
    state_pool[slots] = S
    W1 = conv_pool.shape[1]
    rows = torch.cat([conv_pool[slots], record.mixed_qkv[li].to(conv_pool.dtype)], 1)  # [L', W-1 + n, D]
    take = acc_l.view(-1, 1) + torch.arange(W1, device=rows.device).view(1, -1)  # the W-1 rows ending at acc
    conv_pool[slots] = torch.gather(rows, 1, take[:, :, None].expand(-1, -1, rows.shape[2]))


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
