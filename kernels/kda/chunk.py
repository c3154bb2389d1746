"""Triton: variable-length chunked KDA prefill (chunk 64) from and into the slot pools, three launches.

1. prep (token, head): short conv + SiLU (window from the pool, or zeros), L2 norm of q, k, decay gate, sigmoid beta.
2. chunk (sequence, head, V block): loop over the sequence's chunks with the state tile in registers; inside a
   chunk the WY form of §2.1: A_kk / A_qk built column by column with every exponent G_i - G_j <= 0 (exact, no
   overflow whatever g is), (I + L)^-1 by forward substitution, then dots. Writes the final state and (V block 0)
   the conv window back to the sequence's slot.
3. norm (token, head): gated RMS output norm.
Same contract as naive_decode.kda_prefill_torch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from k3_sglang.kernels.kda.decode_common import KDAOptions, KDAWeights, check_decode_args, resolve_scale
from k3_sglang.kernels.kda.fused_recurrent import _conv_silu, _shift_window

CHUNK = 64


@triton.jit
def kda_prefill_prep_kernel(
    x_ptr, f_ptr, b_ptr, conv_w_ptr, a_log_ptr, dt_bias_ptr, conv_pool_ptr, seq_ptr, cu_ptr, slot_ptr, init_ptr,
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, lower_bound, l2_eps,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BW: tl.constexpr,
):
    i_t, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    D: tl.constexpr = 2 * H * K + H * V
    seq = tl.load(seq_ptr + i_t)
    row0 = tl.load(cu_ptr + seq).to(tl.int64)
    slot = tl.load(slot_ptr + seq).to(tl.int64)
    win_valid = (slot >= 0) & (tl.load(init_ptr + seq) != 0)
    win_ptr = conv_pool_ptr + tl.maximum(slot, 0) * (W - 1) * D
    kk, vv, rr = tl.arange(0, BK), tl.arange(0, BV), tl.arange(0, BW)
    mk, mv, mr = kk < K, vv < V, rr < W - 1
    pos = i_t - row0
    ok = pos >= 0
    q = _conv_silu(x_ptr, row0, 0, win_ptr, pos, conv_w_ptr, i_h * K + kk, mk, rr, mr, D, W, ok, win_valid)
    k = _conv_silu(x_ptr, row0, 0, win_ptr, pos, conv_w_ptr, H * K + i_h * K + kk, mk, rr, mr, D, W, ok, win_valid)
    v = _conv_silu(x_ptr, row0, 0, win_ptr, pos, conv_w_ptr, 2 * H * K + i_h * V + vv, mv, rr, mr, D, W, ok,
                   win_valid)
    q = q * tl.rsqrt(tl.sum(q * q, 0) + l2_eps)
    k = k * tl.rsqrt(tl.sum(k * k, 0) + l2_eps)
    f = tl.load(f_ptr + i_t * H * K + i_h * K + kk, mask=mk, other=0.0).to(tl.float32)
    dt_b = tl.load(dt_bias_ptr + i_h * K + kk, mask=mk, other=0.0).to(tl.float32)
    g = lower_bound * tl.sigmoid(tl.exp(tl.load(a_log_ptr + i_h).to(tl.float32)) * (f + dt_b))
    base = (i_t * H + i_h)
    tl.store(q_ptr + base * K + kk, q, mask=mk)
    tl.store(k_ptr + base * K + kk, k, mask=mk)
    tl.store(g_ptr + base * K + kk, g, mask=mk)
    tl.store(v_ptr + base * V + vv, v, mask=mv)
    tl.store(beta_ptr + base, tl.sigmoid(tl.load(b_ptr + base).to(tl.float32)))


@triton.jit
def _intra_chunk(q, k, G, rows, c0, k_ptr, G_ptr, i_h, n_valid, H: tl.constexpr, K: tl.constexpr,
                 C: tl.constexpr, BK: tl.constexpr):
    """A_kk (strictly lower) and A_qk (lower incl. diagonal) [C, C], one column per step, exponents <= 0."""
    kk = tl.arange(0, BK)
    cols = tl.arange(0, C)
    A_kk = tl.zeros([C, C], tl.float32)
    A_qk = tl.zeros([C, C], tl.float32)
    for j in range(0, n_valid):
        off = ((c0 + j) * H + i_h) * K + kk
        k_j = tl.load(k_ptr + off, mask=kk < K, other=0.0)
        G_j = tl.load(G_ptr + off, mask=kk < K, other=0.0)
        below = rows[:, None] >= j
        e = tl.exp(tl.where(below, G - G_j[None, :], float("-inf"))) * k_j[None, :]
        a_kk = tl.where(rows > j, tl.sum(k * e, 1), 0.0)
        a_qk = tl.sum(q * e, 1)
        A_kk = tl.where(cols[None, :] == j, a_kk[:, None], A_kk)
        A_qk = tl.where(cols[None, :] == j, a_qk[:, None], A_qk)
    return A_kk, A_qk


@triton.jit
def _unit_lower_inverse(L, C: tl.constexpr):
    """(I + L)^-1 for strictly lower L [C, C], by forward substitution: T_i = e_i - L_i T."""
    rows = tl.arange(0, C)
    T = tl.zeros([C, C], tl.float32)
    for i in range(0, C):
        l_i = tl.sum(tl.where(rows[:, None] == i, L, 0.0), 0)  # row i of L, [C]
        t_i = tl.where(rows == i, 1.0, 0.0) - tl.sum(l_i[:, None] * T, 0)
        T = tl.where(rows[:, None] == i, t_i[None, :], T)
    return T


@triton.jit
def kda_chunk_fwd_kernel(
    x_ptr, cu_ptr, slot_ptr, init_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, G_ptr, o_ptr, conv_pool_ptr,
    state_pool_ptr, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, BVF: tl.constexpr, BW: tl.constexpr,
):
    i_n, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    D: tl.constexpr = 2 * H * K + H * V
    lo = tl.load(cu_ptr + i_n).to(tl.int64)
    hi = tl.load(cu_ptr + i_n + 1).to(tl.int64)
    slot = tl.load(slot_ptr + i_n).to(tl.int64)
    valid = (slot >= 0) & (hi > lo)
    init = valid & (tl.load(init_ptr + i_n) != 0)
    slot = tl.maximum(slot, 0)
    kk, vv, rows = tl.arange(0, BK), i_v * BV + tl.arange(0, BV), tl.arange(0, C)
    mk, mv = kk < K, vv < V
    s_ptrs = state_pool_ptr + slot * H * K * V + i_h * K * V + kk[:, None] * V + vv[None, :]
    S = tl.load(s_ptrs, mask=mk[:, None] & mv[None, :] & init, other=0.0)
    for c0 in range(lo, hi, C):
        n_valid = tl.minimum(hi - c0, C)
        mrow = rows < n_valid
        tok = (c0 + rows) * H + i_h
        m_k = mrow[:, None] & mk[None, :]
        q = tl.load(q_ptr + tok[:, None] * K + kk[None, :], mask=m_k, other=0.0) * scale
        k = tl.load(k_ptr + tok[:, None] * K + kk[None, :], mask=m_k, other=0.0)
        G = tl.cumsum(tl.load(g_ptr + tok[:, None] * K + kk[None, :], mask=m_k, other=0.0), 0)
        v = tl.load(v_ptr + tok[:, None] * V + vv[None, :], mask=mrow[:, None] & mv[None, :], other=0.0)
        beta = tl.load(beta_ptr + tok, mask=mrow, other=0.0)
        tl.store(G_ptr + tok[:, None] * K + kk[None, :], G, mask=m_k)  # every V block writes the same values
        tl.debug_barrier()
        A_kk, A_qk = _intra_chunk(q, k, G, rows, c0, k_ptr, G_ptr, i_h, n_valid, H, K, C, BK)
        T = _unit_lower_inverse(beta[:, None] * A_kk, C) * beta[None, :]
        G_last = tl.sum(tl.where(rows[:, None] == n_valid - 1, G, 0.0), 0)
        Wm = tl.dot(T, k * tl.exp(G), input_precision="ieee")
        U = tl.dot(T, v, input_precision="ieee")
        v_new = U - tl.dot(Wm, S, input_precision="ieee")
        o = tl.dot(q * tl.exp(G), S, input_precision="ieee") + tl.dot(A_qk, v_new, input_precision="ieee")
        tl.store(o_ptr + tok[:, None] * V + vv[None, :], o, mask=mrow[:, None] & mv[None, :])
        k_d = tl.where(m_k, k * tl.exp(G_last[None, :] - G), 0.0)
        S = S * tl.exp(G_last)[:, None] + tl.dot(tl.trans(k_d), v_new, input_precision="ieee")
    tl.store(s_ptrs, S, mask=mk[:, None] & mv[None, :] & valid)
    if i_v == 0:
        win_ptr = conv_pool_ptr + slot * (W - 1) * D
        rr = tl.arange(0, BW)
        mr = rr < W - 1
        n = hi - lo
        _shift_window(x_ptr, lo, 0, win_ptr, n, i_h * K + kk, mk, rr, mr, D, W, valid, init)
        _shift_window(x_ptr, lo, 0, win_ptr, n, H * K + i_h * K + kk, mk, rr, mr, D, W, valid, init)
        vf = tl.arange(0, BVF)
        _shift_window(x_ptr, lo, 0, win_ptr, n, 2 * H * K + i_h * V + vf, vf < V, rr, mr, D, W, valid, init)


@triton.jit
def gated_rms_norm_kernel(o_ptr, gate_ptr, w_ptr, out_ptr, eps, H: tl.constexpr, V: tl.constexpr,
                          BV: tl.constexpr):
    i_t, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    vv = tl.arange(0, BV)
    mv = vv < V
    base = (i_t * H + i_h) * V
    o = tl.load(o_ptr + base + vv, mask=mv, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + base + vv, mask=mv, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + vv, mask=mv, other=0.0).to(tl.float32)
    y = o * tl.rsqrt(tl.sum(o * o, 0) / V + eps) * w * tl.sigmoid(gate)
    tl.store(out_ptr + base + vv, y.to(out_ptr.dtype.element_ty), mask=mv)


def _check_prefill(mixed_qkv, f, b, g_out, cu_seqlens, weights, conv_pool, state_pool, state_indices,
                   has_initial_state):
    N = cu_seqlens.shape[0] - 1
    if cu_seqlens.dim() != 1 or N < 1 or tuple(state_indices.shape) != (N,):
        raise ValueError(f"kda_chunk_prefill: cu_seqlens {tuple(cu_seqlens.shape)} must be [N+1], state_indices {tuple(state_indices.shape)} [N]")
    if mixed_qkv.dim() != 2:
        raise ValueError(f"kda_chunk_prefill: mixed_qkv {tuple(mixed_qkv.shape)} must be [T, D]")
    dims = check_decode_args("kda_chunk_prefill", mixed_qkv[None], f[None], b[None], g_out[None], weights, conv_pool,
                             state_pool, state_indices[:1])
    if has_initial_state is not None and tuple(has_initial_state.shape) != (N,):
        raise ValueError(f"kda_chunk_prefill: has_initial_state {tuple(has_initial_state.shape)} must be [N] = [{N}]")
    if state_pool.dtype != torch.float32:
        raise ValueError(f"kda_chunk_prefill: state_pool {tuple(state_pool.shape)} must be float32, got {state_pool.dtype}")
    tensors = (mixed_qkv, f, b, g_out, weights.conv_weight, weights.dt_bias, weights.o_norm, conv_pool, state_pool)
    assert all(t.is_contiguous() for t in tensors), "kda_chunk_prefill: inputs and pools must be contiguous"
    return N, dims


def kda_chunk_prefill(mixed_qkv, f, b, g_out, cu_seqlens, weights: KDAWeights, conv_pool, state_pool, state_indices,
                      has_initial_state=None, opts: KDAOptions = KDAOptions(), chunk_size: int = CHUNK) -> torch.Tensor:
    """Variable-length chunked KDA prefill (Triton), pools read and written in place.

    mixed_qkv [T, 2*H*K + H*V], f [T, H*K], b [T, H], g_out [T, H*V] for all sequences packed; cu_seqlens [N+1]
    int; weights as for decode; conv_pool [S, W-1, D]; state_pool [S, H, K, V] fp32; state_indices [N] (negative =
    skip); has_initial_state [N] bool (None = all True; False = zero state and window). chunk_size must be 64.
    Returns o [T, H*V] in mixed_qkv.dtype.
    """
    if chunk_size != CHUNK:
        raise ValueError(f"kda_chunk_prefill: chunk_size={chunk_size}; the Triton kernel uses {CHUNK}")
    N, dims = _check_prefill(mixed_qkv, f, b, g_out, cu_seqlens, weights, conv_pool, state_pool, state_indices,
                             has_initial_state)
    T, (H, K, V, W) = mixed_qkv.shape[0], (dims.H, dims.K, dims.V, dims.W)
    dev = mixed_qkv.device
    init = (torch.ones(N, dtype=torch.int32, device=dev) if has_initial_state is None
            else has_initial_state.to(device=dev, dtype=torch.int32))
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    seq_of = torch.repeat_interleave(torch.arange(N, device=dev), lens.long(), output_size=T)
    q, k, g, G = (torch.empty(T, H, K, dtype=torch.float32, device=dev) for _ in range(4))
    v, o_raw = (torch.empty(T, H, V, dtype=torch.float32, device=dev) for _ in range(2))
    beta = torch.empty(T, H, dtype=torch.float32, device=dev)
    BK, BVF, BW = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V)), triton.next_power_of_2(W - 1)
    if T:
        kda_prefill_prep_kernel[(T, H)](
            mixed_qkv, f, b, weights.conv_weight, weights.A_log, weights.dt_bias, conv_pool, seq_of, cu_seqlens,
            state_indices, init, q, k, v, g, beta, opts.lower_bound, opts.l2_eps, H=H, K=K, V=V, W=W, BK=BK, BV=BVF,
            BW=BW)
    BV = min(BVF, 64)
    kda_chunk_fwd_kernel[(N, H, triton.cdiv(V, BV))](
        mixed_qkv, cu_seqlens, state_indices, init, q, k, v, g, beta, G, o_raw, conv_pool, state_pool,
        resolve_scale(opts, K), H=H, K=K, V=V, W=W, C=CHUNK, BK=BK, BV=BV, BVF=BVF, BW=BW, num_warps=8)
    out = torch.empty(T, H * V, dtype=mixed_qkv.dtype, device=dev)
    if T:
        gated_rms_norm_kernel[(T, H)](o_raw, g_out, weights.o_norm, out, opts.norm_eps, H=H, V=V, BV=BVF)
    return out
