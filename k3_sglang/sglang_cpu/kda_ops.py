"""KDA's short convolution and gated delta rule on SGLang's layouts, on CPU (torch, composed from kernels/kda/naive).

SGLang's KDA backend (`layers/attention/linear/kda_backend.py`) keeps its pools as
- conv windows `[slots, W-1, D]` (oldest row first), handed to the conv ops as the transposed view `[slots, D, W-1]`;
- recurrent states `[slots, H, V, K]` float32 (transposed against the references' `[H, K, V]`).
A slot index of -1 (SGLang's PAD_SLOT_ID) is a padding row: output 0, no pool row touched.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from k3_sglang.kernels.kda.naive import chunk_kda, delta_rule_step, kda_gate, l2_normalize

PAD_SLOT_ID = -1
CHUNK = 64  # SGLang's KDA chunk: its per-chunk states (h) and track snapshots sit on 64-token boundaries
L2_EPS = 1e-6


def _conv(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool) -> torch.Tensor:
    """rows [..., T + W - 1, D] (window then inputs) -> [..., T, D] float32 causal depthwise conv."""
    W = weight.shape[1]
    y = (rows.unfold(-2, W, 1) * weight.float()).sum(-1)  # [..., T, D]
    if bias is not None:
        y = y + bias.float()
    return F.silu(y) if silu else y


def causal_conv1d_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_states: torch.Tensor,
                     query_start_loc: torch.Tensor, seq_lens_cpu=None, cache_indices: torch.Tensor | None = None,
                     has_initial_state: torch.Tensor | None = None, activation: str | None = "silu",
                     pad_slot_id: int = PAD_SLOT_ID, **kwargs) -> torch.Tensor:
    """Varlen causal conv of packed sequences (SGLang's `causal_conv1d_fn` contract).

    x [D, T_total] (sequences packed by query_start_loc [B+1]); weight [D, W]; conv_states [slots, D, W-1] (a view
    of the pool), read where has_initial_state [B] is True (zeros otherwise) and overwritten with each sequence's
    last W-1 inputs; cache_indices [B]. Returns y [D, T_total] in x.dtype (silu applied when activation is set).
    """
    if kwargs.get("block_table") is not None:
        raise NotImplementedError("causal_conv1d_fn: block_table (CUDA-graph prefill) has no CPU path")
    D, W = weight.shape
    starts = query_start_loc.tolist()
    slots = cache_indices.tolist() if cache_indices is not None else list(range(len(starts) - 1))
    init = has_initial_state.tolist() if has_initial_state is not None else [False] * len(slots)
    out = torch.zeros_like(x)
    for i, slot in enumerate(slots):
        lo, hi = starts[i], starts[i + 1]
        if slot == pad_slot_id or hi <= lo:
            continue
        window = conv_states[slot].float() if init[i] else x.new_zeros(D, W - 1, dtype=torch.float32)
        rows = torch.cat([window, x[:, lo:hi].float()], 1).t()  # [W-1 + T, D]
        out[:, lo:hi] = _conv(rows, weight, bias, activation is not None).t().to(x.dtype)
        conv_states[slot] = rows[rows.shape[0] - (W - 1):].t().to(conv_states.dtype)
    return out


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None, activation=None, cache_seqlens=None,
                         conv_state_indices: torch.Tensor | None = None, pad_slot_id: int = PAD_SLOT_ID,
                         **kwargs) -> torch.Tensor:
    """One decode token per request (SGLang's `causal_conv1d_update` contract, single-token form).

    x [B, D]; conv_state [slots, D, W-1] (pool view), shifted left by one with x appended; conv_state_indices [B].
    Returns y [B, D] in x.dtype.
    """
    unsupported = [k for k in ("num_accept_tokens", "intermediate_conv_window", "retrieve_parent_token")
                   if kwargs.get(k) is not None]
    if x.dim() != 2 or cache_seqlens is not None or unsupported:
        raise NotImplementedError(f"causal_conv1d_update on CPU: single-token decode only (x {tuple(x.shape)}, "
                                  f"circular buffer={cache_seqlens is not None}, {unsupported})")
    B = x.shape[0]
    idx = conv_state_indices.long() if conv_state_indices is not None else torch.arange(B)
    valid = idx != pad_slot_id
    safe = idx.clamp(min=0)
    rows = torch.cat([conv_state[safe].float(), x.float()[:, :, None]], 2).transpose(1, 2)  # [B, W, D]
    y = _conv(rows, weight, bias, activation is not None)[:, 0]  # [B, D]
    keep = valid.nonzero().flatten()
    conv_state[idx[keep]] = rows[keep, 1:].transpose(1, 2).to(conv_state.dtype)
    return torch.where(valid[:, None], y, torch.zeros_like(y)).to(x.dtype)


def gate_and_beta(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                  lower_bound: float | None, H: int, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw gate a [T, H*K] (or [T, H, K]) and raw beta b [T, H] -> (log-decay g [T, H, K], beta [T, H]) float32.

    K3's safe gate: g = lower_bound * sigmoid(exp(A_log) * (a + dt_bias)); without a lower bound, KDA's
    g = -exp(A_log) * softplus(a + dt_bias)."""
    a = a.float().reshape(-1, H, K)
    if lower_bound is not None:
        g = kda_gate(a, A_log.reshape(-1), dt_bias, float(lower_bound))
    else:
        g = -A_log.reshape(-1)[:H].float().exp()[:, None] * F.softplus(a + dt_bias.float().view(H, K))
    return g, torch.sigmoid(b.float().reshape(-1, H))


def kda_extend(q, k, v, a, b, *, A_log, dt_bias, lower_bound, ssm_states, cache_indices, query_start_loc,
               return_chunk_states: bool = False, track_state=None, track_chunk_idx=None):
    """Chunked KDA prefill of packed sequences from and into the state pool.

    q, k [1, T, H, K] and v [1, T, H, V] after the conv; a raw gate [1, T, H, K]; b raw beta [1, T, H];
    ssm_states [slots, H, V, K] float32 (each sequence starts from its slot's state, which it overwrites);
    cache_indices [B]; query_start_loc [B+1]. track_state [B, H, V, K] float32 gets the state entering chunk
    track_chunk_idx[i] of sequence i (64-token chunks; -1: none).
    Returns o [1, T, H, V] in v.dtype, and with return_chunk_states also h [1, NT, H, V, K] float32: the state
    entering every 64-token chunk of every sequence, sequence after sequence.
    """
    _, T, H, K = k.shape
    V = v.shape[-1]
    scale = K ** -0.5
    o = torch.zeros_like(v)
    states: list[torch.Tensor] = []
    starts = query_start_loc.tolist()
    tracks = track_chunk_idx.tolist() if track_chunk_idx is not None else None
    for i, slot in enumerate(cache_indices.tolist()):
        lo, hi = starts[i], starts[i + 1]
        n_chunks = -(-(hi - lo) // CHUNK)
        if slot == PAD_SLOT_ID or hi <= lo:
            states += [ssm_states.new_zeros(n_chunks, H, V, K, dtype=torch.float32)] if return_chunk_states else []
            continue
        qi = l2_normalize(q[0, lo:hi].float(), L2_EPS)
        ki = l2_normalize(k[0, lo:hi].float(), L2_EPS)
        g, beta = gate_and_beta(a[0, lo:hi], b[0, lo:hi], A_log, dt_bias, lower_bound, H, K)
        S = ssm_states[slot].float().transpose(-1, -2)  # [H, K, V]
        out, S, entering = chunk_kda(qi, ki, v[0, lo:hi].float(), g, beta, scale, S, CHUNK, chunk_states=True)
        o[0, lo:hi] = out.to(o.dtype)
        ssm_states[slot] = S.transpose(-1, -2).to(ssm_states.dtype)
        entering = entering.transpose(-1, -2)  # [n_chunks, H, V, K]
        if return_chunk_states:
            states.append(entering)
        if track_state is not None and tracks is not None and 0 <= tracks[i] < n_chunks:
            track_state[i] = entering[tracks[i]]
    if return_chunk_states:
        h = torch.cat(states, 0) if states else ssm_states.new_zeros(0, H, V, K, dtype=torch.float32)
        return o, h[None]
    return o


def kda_recurrent(q, k, v, a, b, *, A_log, dt_bias, lower_bound, ssm_states, cache_indices, query_start_loc,
                  write_state: bool = True, intermediate_states=None, intermediate_state_indices=None):
    """Token-by-token KDA for requests of equal length n (decode: n = 1; a verify chain: n = draft length).

    q, k [1, B*n, H, K], v [1, B*n, H, V]; a raw gate [B*n, H*K] or [1, B*n, H, K]; b [1, B*n, H];
    ssm_states [slots, H, V, K]; cache_indices [B]; query_start_loc [B+1] (every request n tokens).
    write_state: store the final state in the slot; intermediate_states [rows, n, H, V, K] (with
    intermediate_state_indices [B]) gets the state after every token instead (the slot is left unchanged).
    Returns o [1, B*n, H, V] in v.dtype.
    """
    _, TN, H, K = k.shape
    V = v.shape[-1]
    B = cache_indices.shape[0]
    if B == 0:
        return torch.zeros_like(v)
    n = TN // B
    if n * B != TN or (query_start_loc.numel() == B + 1 and int(query_start_loc[-1]) != TN):
        raise NotImplementedError(f"KDA recurrent path on CPU: {B} requests must share one length (tokens {TN})")
    idx = cache_indices.long()
    valid = idx != PAD_SLOT_ID
    safe = idx.clamp(min=0)
    S = ssm_states[safe].float().transpose(-1, -2)  # [B, H, K, V]
    qs = l2_normalize(q[0].float().view(B, n, H, K), L2_EPS)
    ks = l2_normalize(k[0].float().view(B, n, H, K), L2_EPS)
    vs = v[0].float().view(B, n, H, V)
    g, beta = gate_and_beta(a.reshape(B * n, -1), b.reshape(B * n, H), A_log, dt_bias, lower_bound, H, K)
    g, beta = g.view(B, n, H, K), beta.view(B, n, H)
    outs = []
    for t in range(n):
        o_t, S, _ = delta_rule_step(qs[:, t], ks[:, t], vs[:, t], g[:, t], beta[:, t], K ** -0.5, S)
        outs.append(o_t)
        if intermediate_states is not None:
            rows = intermediate_state_indices.long()[valid]
            intermediate_states[rows, t] = S[valid].transpose(-1, -2).to(intermediate_states.dtype)
    o = torch.stack(outs, 1) * valid[:, None, None, None]  # [B, n, H, V]
    if write_state:
        ssm_states[idx[valid]] = S[valid].transpose(-1, -2).to(ssm_states.dtype)
    return o.reshape(1, B * n, H, V).to(v.dtype)

