"""Triton: fused KDA recurrent decode / speculative verify / commit, one launch per layer.

Per (request, head) program: short conv + SiLU on the q, k, v channels (window read from the conv pool), L2 norm of
q and k, K3's lower-bound decay gate from the raw gate, sigmoid beta, the gated delta rule on the fp32 state (read
from the state pool by slot), gated RMS output norm. Decode writes state and window back in place; verify leaves the
pools untouched and records (k, delta, g) per token so that commit can replay an accepted prefix exactly.
Layouts: see decode_common.py. The whole [K, V] state tile of a head lives in registers (K = V = 128 for K3).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from k3_sglang.kernels.kda.decode_common import (
    KDAOptions,
    KDAWeights,
    VerifyRecord,
    check_commit_args,
    check_decode_args,
    resolve_scale,
)


@triton.jit
def _window_tile(x_ptr, row0, n_tokens, win_ptr, t, ch, mch, rr, mr, D: tl.constexpr, W: tl.constexpr, valid,
                 win_valid):
    """Rows t .. t+W-2 of the virtual sequence concat(window, x): [BW, BLOCK] fp32 (0 where masked; the window
    reads as zeros unless win_valid)."""
    vr = t + rr
    in_win = vr < W - 1
    wv = tl.load(win_ptr + vr[:, None] * D + ch[None, :], mask=(in_win & mr & valid & win_valid)[:, None] & mch[None, :],
                 other=0.0)
    xr = tl.maximum(vr - (W - 1), 0)
    xv = tl.load(x_ptr + (row0 + xr)[:, None] * D + ch[None, :],
                 mask=((vr >= W - 1) & mr & valid)[:, None] & mch[None, :], other=0.0)
    return tl.where(in_win[:, None], wv.to(tl.float32), xv.to(tl.float32))


@triton.jit
def _conv_silu(x_ptr, row0, n_tokens, win_ptr, t, w_ptr, ch, mch, rr, mr, D: tl.constexpr, W: tl.constexpr, valid,
               win_valid):
    """silu(causal depthwise conv) of token t on channels ch: [BLOCK] fp32."""
    tile = _window_tile(x_ptr, row0, n_tokens, win_ptr, t, ch, mch, rr, mr, D, W, valid, win_valid)
    w_tile = tl.load(w_ptr + ch[None, :] * W + rr[:, None], mask=mr[:, None] & mch[None, :], other=0.0).to(tl.float32)
    w_cur = tl.load(w_ptr + ch * W + (W - 1), mask=mch, other=0.0).to(tl.float32)
    cur = tl.load(x_ptr + (row0 + t) * D + ch, mask=mch & valid, other=0.0).to(tl.float32)
    acc = tl.sum(tile * w_tile, 0) + cur * w_cur
    return acc * tl.sigmoid(acc)


@triton.jit
def _shift_window(x_ptr, row0, n_tokens, win_ptr, n_keep, ch, mch, rr, mr, D: tl.constexpr, W: tl.constexpr, valid,
                  win_valid):
    """Window <- rows n_keep .. n_keep+W-2 of concat(window, x) (in place; the barrier orders reads before writes)."""
    tile = _window_tile(x_ptr, row0, n_tokens, win_ptr, n_keep, ch, mch, rr, mr, D, W, valid, win_valid)
    tl.debug_barrier()
    tl.store(win_ptr + rr[:, None] * D + ch[None, :], tile.to(win_ptr.dtype.element_ty),
             mask=(mr & valid)[:, None] & mch[None, :])


@triton.jit(do_not_specialize=["n_tokens"])
def kda_recurrent_fwd_kernel(
    x_ptr, f_ptr, b_ptr, gate_ptr, conv_w_ptr, a_log_ptr, dt_bias_ptr, norm_w_ptr, conv_pool_ptr, state_pool_ptr,
    slot_ptr, o_ptr, rec_k_ptr, rec_d_ptr, rec_g_ptr, n_tokens, scale, lower_bound, norm_eps, l2_eps,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BW: tl.constexpr, WRITE_BACK: tl.constexpr, RECORD: tl.constexpr,
):
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    D: tl.constexpr = 2 * H * K + H * V
    slot = tl.load(slot_ptr + i_b).to(tl.int64)
    valid = slot >= 0
    slot = tl.maximum(slot, 0)
    kk, vv, rr = tl.arange(0, BK), tl.arange(0, BV), tl.arange(0, BW)
    mk, mv, mr = kk < K, vv < V, rr < W - 1
    ch_q, ch_k, ch_v = i_h * K + kk, H * K + i_h * K + kk, 2 * H * K + i_h * V + vv
    win_ptr = conv_pool_ptr + slot * (W - 1) * D
    s_ptrs = state_pool_ptr + slot * H * K * V + i_h * K * V + kk[:, None] * V + vv[None, :]
    m_s = mk[:, None] & mv[None, :]
    S = tl.load(s_ptrs, mask=m_s & valid, other=0.0)
    a = tl.exp(tl.load(a_log_ptr + i_h).to(tl.float32))
    dt_b = tl.load(dt_bias_ptr + i_h * K + kk, mask=mk, other=0.0).to(tl.float32)
    w_norm = tl.load(norm_w_ptr + vv, mask=mv, other=0.0).to(tl.float32)
    row0 = i_b * n_tokens
    for t in range(n_tokens):
        q = _conv_silu(x_ptr, row0, n_tokens, win_ptr, t, conv_w_ptr, ch_q, mk, rr, mr, D, W, valid, valid)
        k = _conv_silu(x_ptr, row0, n_tokens, win_ptr, t, conv_w_ptr, ch_k, mk, rr, mr, D, W, valid, valid)
        v = _conv_silu(x_ptr, row0, n_tokens, win_ptr, t, conv_w_ptr, ch_v, mv, rr, mr, D, W, valid, valid)
        q = q * tl.rsqrt(tl.sum(q * q, 0) + l2_eps)
        k = k * tl.rsqrt(tl.sum(k * k, 0) + l2_eps)
        tok = row0 + t
        f = tl.load(f_ptr + tok * H * K + i_h * K + kk, mask=mk, other=0.0).to(tl.float32)
        g = lower_bound * tl.sigmoid(a * (f + dt_b))
        beta = tl.sigmoid(tl.load(b_ptr + tok * H + i_h).to(tl.float32))
        S = S * tl.exp(g)[:, None]
        delta = beta * (v - tl.sum(k[:, None] * S, 0))
        S = S + k[:, None] * delta[None, :]
        o = tl.sum((q * scale)[:, None] * S, 0)
        gate = tl.load(gate_ptr + tok * H * V + i_h * V + vv, mask=mv, other=0.0).to(tl.float32)
        y = o * tl.rsqrt(tl.sum(o * o, 0) / V + norm_eps) * w_norm * tl.sigmoid(gate)
        y = tl.where(valid, y, 0.0)
        tl.store(o_ptr + tok * H * V + i_h * V + vv, y.to(o_ptr.dtype.element_ty), mask=mv)
        if RECORD:
            tl.store(rec_k_ptr + (tok * H + i_h) * K + kk, tl.where(valid, k, 0.0), mask=mk)
            tl.store(rec_g_ptr + (tok * H + i_h) * K + kk, tl.where(valid, g, 0.0), mask=mk)
            tl.store(rec_d_ptr + (tok * H + i_h) * V + vv, tl.where(valid, delta, 0.0), mask=mv)
    if WRITE_BACK:
        tl.store(s_ptrs, S, mask=m_s & valid)
        _shift_window(x_ptr, row0, n_tokens, win_ptr, n_tokens, ch_q, mk, rr, mr, D, W, valid, valid)
        _shift_window(x_ptr, row0, n_tokens, win_ptr, n_tokens, ch_k, mk, rr, mr, D, W, valid, valid)
        _shift_window(x_ptr, row0, n_tokens, win_ptr, n_tokens, ch_v, mv, rr, mr, D, W, valid, valid)


@triton.jit(do_not_specialize=["n_tokens"])
def kda_commit_fwd_kernel(
    x_ptr, conv_pool_ptr, state_pool_ptr, slot_ptr, acc_ptr, rec_k_ptr, rec_d_ptr, rec_g_ptr, n_tokens,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BW: tl.constexpr,
):
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    D: tl.constexpr = 2 * H * K + H * V
    slot = tl.load(slot_ptr + i_b).to(tl.int64)
    n_acc = tl.minimum(tl.load(acc_ptr + i_b).to(tl.int32), n_tokens)
    valid = (slot >= 0) & (n_acc > 0)
    slot = tl.maximum(slot, 0)
    kk, vv, rr = tl.arange(0, BK), tl.arange(0, BV), tl.arange(0, BW)
    mk, mv, mr = kk < K, vv < V, rr < W - 1
    s_ptrs = state_pool_ptr + slot * H * K * V + i_h * K * V + kk[:, None] * V + vv[None, :]
    m_s = mk[:, None] & mv[None, :]
    S = tl.load(s_ptrs, mask=m_s & valid, other=0.0)
    row0 = i_b * n_tokens
    for t in range(n_acc):
        tok = row0 + t
        g = tl.load(rec_g_ptr + (tok * H + i_h) * K + kk, mask=mk, other=0.0)
        k = tl.load(rec_k_ptr + (tok * H + i_h) * K + kk, mask=mk, other=0.0)
        delta = tl.load(rec_d_ptr + (tok * H + i_h) * V + vv, mask=mv, other=0.0)
        S = S * tl.exp(g)[:, None]
        S = S + k[:, None] * delta[None, :]
    tl.store(s_ptrs, S, mask=m_s & valid)
    win_ptr = conv_pool_ptr + slot * (W - 1) * D
    _shift_window(x_ptr, row0, n_tokens, win_ptr, n_acc, i_h * K + kk, mk, rr, mr, D, W, valid, valid)
    _shift_window(x_ptr, row0, n_tokens, win_ptr, n_acc, H * K + i_h * K + kk, mk, rr, mr, D, W, valid, valid)
    _shift_window(x_ptr, row0, n_tokens, win_ptr, n_acc, 2 * H * K + i_h * V + vv, mv, rr, mr, D, W, valid, valid)


def _launch_recurrent(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts, write_back):
    dims = check_decode_args("kda_fused_recurrent", mixed_qkv, f, b, g_out, weights, conv_pool, state_pool,
                             state_indices)
    tensors = (mixed_qkv, f, b, g_out, weights.conv_weight, weights.dt_bias, weights.o_norm, conv_pool, state_pool)
    assert all(t.is_contiguous() for t in tensors), "kda_fused_recurrent: inputs and pools must be contiguous"
    if state_pool.dtype != torch.float32:
        raise ValueError(f"kda_fused_recurrent: state_pool {tuple(state_pool.shape)} must be float32, got {state_pool.dtype}")
    B, n, H, K, V, W = dims.B, dims.n, dims.H, dims.K, dims.V, dims.W
    o = torch.empty(B, n, H * V, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    rec = [torch.empty(B, n, H, d, dtype=torch.float32, device=mixed_qkv.device) if not write_back else o
           for d in (K, V, K)]
    kda_recurrent_fwd_kernel[(B, H)](
        mixed_qkv, f, b, g_out, weights.conv_weight, weights.A_log, weights.dt_bias, weights.o_norm, conv_pool,
        state_pool, state_indices, o, rec[0], rec[1], rec[2], n, resolve_scale(opts, K), opts.lower_bound,
        opts.norm_eps, opts.l2_eps, H=H, K=K, V=V, W=W, BK=triton.next_power_of_2(K), BV=triton.next_power_of_2(V),
        BW=triton.next_power_of_2(W - 1), WRITE_BACK=write_back, RECORD=not write_back,
        num_warps=8 if K * V >= 64 * 64 else 4,
    )
    return o, (None if write_back else VerifyRecord(rec[0], rec[1], rec[2], mixed_qkv))


def kda_fused_decode(mixed_qkv, f, b, g_out, weights: KDAWeights, conv_pool, state_pool, state_indices,
                     opts: KDAOptions = KDAOptions()) -> torch.Tensor:
    """One launch: conv + SiLU, L2 norm, decay gate, sigmoid beta, delta rule, gated RMS norm; pools updated in place.

    mixed_qkv [B, n, 2*H*K + H*V], f [B, n, H*K], b [B, n, H], g_out [B, n, H*V], conv_pool [S, W-1, D],
    state_pool [S, H, K, V] fp32, state_indices [B] (negative = skip). n tokens per request run in order (n = 1 is
    plain decode). Returns o [B, n, H*V] in mixed_qkv.dtype.
    """
    return _launch_recurrent(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts, True)[0]


def kda_fused_verify(mixed_qkv, f, b, g_out, weights: KDAWeights, conv_pool, state_pool, state_indices,
                     opts: KDAOptions = KDAOptions()) -> tuple[torch.Tensor, VerifyRecord]:
    """Speculative verify of n draft tokens per request: same inputs as kda_fused_decode, pools untouched.

    Returns (o [B, n, H*V], record) where record holds k, delta [B, n, H, K|V] and g fp32 for kda_fused_commit.
    """
    return _launch_recurrent(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts, False)


def kda_fused_commit(record: VerifyRecord, conv_pool, state_pool, state_indices, num_accepted) -> None:
    """Commit the first num_accepted[b] (0..n) verified tokens into state and conv window, in place.

    The result equals, bit for bit, running kda_fused_decode on those tokens from the pre-verify pools.
    """
    check_commit_args("kda_fused_commit", record, conv_pool, state_pool, state_indices, num_accepted)
    B, n, H, K = record.k.shape
    V, W = record.delta.shape[-1], conv_pool.shape[1] + 1
    kda_commit_fwd_kernel[(B, H)](
        record.mixed_qkv, conv_pool, state_pool, state_indices, num_accepted, record.k, record.delta, record.g, n,
        H=H, K=K, V=V, W=W, BK=triton.next_power_of_2(K), BV=triton.next_power_of_2(V),
        BW=triton.next_power_of_2(W - 1), num_warps=8 if K * V >= 64 * 64 else 4,
    )
