"""Triton: fused KDA recurrent decode / speculative verify, one launch per layer.

Per (request, head) program: short conv + SiLU on the q, k, v channels (window read from the conv pool), L2 norm of
q and k, K3's lower-bound decay gate from the raw gate, sigmoid beta, the gated delta rule on the fp32 state (read
from the state pool by slot), gated RMS output norm. Decode writes state and window back in place; verify leaves the
pools untouched and writes the state and window after every token to SGLang's per-draft scratch (VerifyScratch),
from which SGLang's commit after acceptance copies the accepted step.
Layouts: see decode_common.py. The whole [K, V] state tile of a head lives in registers (K = V = 128 for K3).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from k3_sglang.kernels.kda.decode_common import (
    KDAOptions,
    KDAWeights,
    VerifyScratch,
    check_decode_args,
    check_scratch,
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


@triton.jit
def _store_window(x_ptr, row0, n_tokens, win_ptr, n_keep, dst_ptr, ch, mch, rr, mr, D: tl.constexpr, W: tl.constexpr,
                  valid):
    """dst [W-1, D] <- rows n_keep .. n_keep+W-2 of concat(window, x) on channels ch (the pool window unchanged)."""
    tile = _window_tile(x_ptr, row0, n_tokens, win_ptr, n_keep, ch, mch, rr, mr, D, W, valid, valid)
    tl.store(dst_ptr + rr[:, None] * D + ch[None, :], tile.to(dst_ptr.dtype.element_ty),
             mask=(mr & valid)[:, None] & mch[None, :])


@triton.jit(do_not_specialize=["n_tokens"])
def kda_recurrent_fwd_kernel(
    x_ptr, f_ptr, b_ptr, gate_ptr, conv_w_ptr, a_log_ptr, dt_bias_ptr, norm_w_ptr, conv_pool_ptr, state_pool_ptr,
    slot_ptr, o_ptr, scr_s_ptr, scr_c_ptr, scr_row_ptr, scr_n, n_tokens, scale, lower_bound, norm_eps, l2_eps,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BW: tl.constexpr, WRITE_BACK: tl.constexpr, SCRATCH: tl.constexpr,
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
    scr_row = tl.load(scr_row_ptr + i_b).to(tl.int64)  # (decode: a slot index, unused)
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
        if SCRATCH:  # the state and conv window after token t, at scratch row scr_row, step t
            step = scr_row * scr_n + t
            tl.store(scr_s_ptr + step * H * K * V + i_h * K * V + kk[:, None] * V + vv[None, :], S, mask=m_s & valid)
            c_ptr = scr_c_ptr + step * (W - 1) * D
            _store_window(x_ptr, row0, n_tokens, win_ptr, t + 1, c_ptr, ch_q, mk, rr, mr, D, W, valid)
            _store_window(x_ptr, row0, n_tokens, win_ptr, t + 1, c_ptr, ch_k, mk, rr, mr, D, W, valid)
            _store_window(x_ptr, row0, n_tokens, win_ptr, t + 1, c_ptr, ch_v, mv, rr, mr, D, W, valid)
    if WRITE_BACK:
        tl.store(s_ptrs, S, mask=m_s & valid)
        _shift_window(x_ptr, row0, n_tokens, win_ptr, n_tokens, ch_q, mk, rr, mr, D, W, valid, valid)
        _shift_window(x_ptr, row0, n_tokens, win_ptr, n_tokens, ch_k, mk, rr, mr, D, W, valid, valid)
        _shift_window(x_ptr, row0, n_tokens, win_ptr, n_tokens, ch_v, mv, rr, mr, D, W, valid, valid)


def _launch_recurrent(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts,
                      scratch: VerifyScratch | None):
    dims = check_decode_args("kda_fused_recurrent", mixed_qkv, f, b, g_out, weights, conv_pool, state_pool,
                             state_indices)
    tensors = (mixed_qkv, f, b, g_out, weights.conv_weight, weights.dt_bias, weights.o_norm, conv_pool, state_pool)
    assert all(t.is_contiguous() for t in tensors), "kda_fused_recurrent: inputs and pools must be contiguous"
    if state_pool.dtype != torch.float32:
        raise ValueError(f"kda_fused_recurrent: state_pool {tuple(state_pool.shape)} must be float32, got {state_pool.dtype}")
    B, n, H, K, V, W = dims.B, dims.n, dims.H, dims.K, dims.V, dims.W
    o = torch.empty(B, n, H * V, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    if scratch is not None:
        check_scratch("kda_fused_verify", scratch, dims, conv_pool, state_pool)
        assert scratch.state.is_contiguous() and scratch.conv.is_contiguous(), "kda_fused_verify: contiguous scratch"
        scr = (scratch.state, scratch.conv, scratch.rows, scratch.state.shape[1])
    else:
        scr = (o, o, state_indices, 0)
    kda_recurrent_fwd_kernel[(B, H)](
        mixed_qkv, f, b, g_out, weights.conv_weight, weights.A_log, weights.dt_bias, weights.o_norm, conv_pool,
        state_pool, state_indices, o, *scr, n, resolve_scale(opts, K), opts.lower_bound,
        opts.norm_eps, opts.l2_eps, H=H, K=K, V=V, W=W, BK=triton.next_power_of_2(K), BV=triton.next_power_of_2(V),
        BW=triton.next_power_of_2(W - 1), WRITE_BACK=scratch is None, SCRATCH=scratch is not None,
        num_warps=8 if K * V >= 64 * 64 else 4,
    )
    return o


def kda_fused_decode(mixed_qkv, f, b, g_out, weights: KDAWeights, conv_pool, state_pool, state_indices,
                     opts: KDAOptions = KDAOptions()) -> torch.Tensor:
    """One launch: conv + SiLU, L2 norm, decay gate, sigmoid beta, delta rule, gated RMS norm; pools updated in place.

    mixed_qkv [B, n, 2*H*K + H*V], f [B, n, H*K], b [B, n, H], g_out [B, n, H*V], conv_pool [S, W-1, D],
    state_pool [S, H, K, V] fp32, state_indices [B] (negative = skip). n tokens per request run in order (n = 1 is
    plain decode). Returns o [B, n, H*V] in mixed_qkv.dtype.
    """
    return _launch_recurrent(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts, None)


def kda_fused_verify(mixed_qkv, f, b, g_out, weights: KDAWeights, conv_pool, state_pool, state_indices,
                     scratch: VerifyScratch, opts: KDAOptions = KDAOptions()) -> torch.Tensor:
    """Speculative verify of n draft tokens per request: same inputs as kda_fused_decode, pools untouched; the state
    and conv window after token t of request b go to scratch.state / scratch.conv [scratch.rows[b], t] (contiguous
    [R, N, H, K, V] fp32 / [R, N, W-1, D]). Returns o [B, n, H*V].
    """
    return _launch_recurrent(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts, scratch)
