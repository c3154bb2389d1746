"""KDA's short convolution and gated delta rule on SGLang's layouts, on CPU (torch, composed from kernels/kda/naive).

SGLang's KDA backend (`layers/attention/linear/kda_backend.py`) keeps its pools as
- conv windows `[slots, W-1, D]` (oldest row first), handed to the conv ops as the transposed view `[slots, D, W-1]`;
- recurrent states `[slots, H, V, K]` float32 (transposed against the references' `[H, K, V]`).
A slot index of -1 (SGLang's PAD_SLOT_ID) is a padding row: output 0, no pool row touched.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from k3_sglang.kernels.kda.chains import chain_layout
from k3_sglang.kernels.kda.naive import _chunk_group_size, _intra_chunk, kda_gate, l2_normalize

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
                         intermediate_conv_window: torch.Tensor | None = None,
                         intermediate_state_indices: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """SGLang's `causal_conv1d_update` contract: decode (one token) and chain verify (n tokens per request).

    x [B, D] (decode) or [B, D, n] (a verify chain, token t of request b at x[b, :, t]); conv_state [slots, D, W-1]
    (pool view); conv_state_indices [B] (-1: padding, output 0, nothing written).
    Decode (no intermediate window): the slot's window is shifted by the n tokens (n = 1 in SGLang's decode).
    Verify (intermediate_conv_window [rows, n_max, D, W-1] with intermediate_state_indices [B]): the window after
    token t (its last W-1 inputs, oldest first) goes to intermediate_conv_window[intermediate_state_indices[b], t];
    the pool is left as it was (SGLang's commit after acceptance copies the accepted step's window into it).
    Returns y [B, D] or [B, D, n] in x.dtype (silu applied when activation is set).
    """
    unsupported = [k for k in ("num_accept_tokens", "retrieve_parent_token", "retrieve_next_token")
                   if kwargs.get(k) is not None]
    if x.dim() not in (2, 3) or cache_seqlens is not None or unsupported:
        raise NotImplementedError(f"causal_conv1d_update on CPU: decode or chain verify only (x {tuple(x.shape)}, "
                                  f"circular buffer={cache_seqlens is not None}, {unsupported})")
    if intermediate_conv_window is not None and intermediate_state_indices is None:
        raise ValueError("causal_conv1d_update: intermediate_conv_window needs intermediate_state_indices")
    single = x.dim() == 2
    xs = x[:, :, None] if single else x  # [B, D, n]
    B, _, n = xs.shape
    W = weight.shape[1]
    idx = conv_state_indices.long() if conv_state_indices is not None else torch.arange(B)
    valid = idx != pad_slot_id
    all_valid = bool(valid.all())
    rows = torch.cat([conv_state[idx if all_valid else idx.clamp(min=0)].float(), xs.float()], 2).transpose(1, 2)
    y = _conv(rows, weight, bias, activation is not None)  # [B, n, D] from rows [B, W-1 + n, D]
    if all_valid and intermediate_conv_window is None:  # a plain decode: no padding rows to mask or skip
        conv_state[idx] = rows[:, n:].transpose(1, 2).to(conv_state.dtype)
        y = y.transpose(1, 2).to(x.dtype)
        return y[:, :, 0] if single else y
    keep = valid.nonzero().flatten()
    if intermediate_conv_window is None:
        conv_state[idx[keep]] = rows[keep, n:].transpose(1, 2).to(conv_state.dtype)
    else:
        windows = rows.unfold(1, W - 1, 1)[:, 1:]  # [B, n, D, W-1]: the window after each token
        inter = intermediate_state_indices[:B].long()[keep]
        intermediate_conv_window[inter, :n] = windows[keep].to(intermediate_conv_window.dtype)
    y = torch.where(valid[:, None, None], y, torch.zeros_like(y)).transpose(1, 2).to(x.dtype)  # [B, D, n]
    return y[:, :, 0] if single else y


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


def _chunk_rows(starts: list[int], live: list[int], T: int) -> tuple[torch.Tensor, list[int]]:
    """Packed row of every token of every live sequence's CHUNK-token chunks, sequence after sequence ([N_c * CHUNK]
    int64; T marks a tail padding position), and each live sequence's chunk count."""
    rows, counts = [], []
    for i in live:
        lo, hi = starts[i], starts[i + 1]
        n = -(-(hi - lo) // CHUNK)
        rows.append(torch.arange(lo, hi))
        if n * CHUNK > hi - lo:
            rows.append(torch.full((n * CHUNK - (hi - lo),), T))
        counts.append(n)
    return (torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)), counts


def kda_extend(q, k, v, a, b, *, A_log, dt_bias, lower_bound, ssm_states, cache_indices, query_start_loc,
               return_chunk_states: bool = False, track_state=None, track_chunk_idx=None):
    """Chunked KDA prefill of packed sequences from and into the state pool.

    q, k [1, T, H, K] and v [1, T, H, V] after the conv; a raw gate [1, T, H, K]; b raw beta [1, T, H];
    ssm_states [slots, H, V, K] float32 (each sequence starts from its slot's state, which it overwrites);
    cache_indices [B]; query_start_loc [B+1]. track_state [B, H, V, K] float32 gets the state entering chunk
    track_chunk_idx[i] of sequence i (64-token chunks; -1: none).
    Returns o [1, T, H, V] in v.dtype, and with return_chunk_states also h [1, NT, H, V, K] float32: the state
    entering every 64-token chunk of every sequence, sequence after sequence.

    The chunk math is chunk_kda's (kernels/kda/naive.py, WY form, tails padded with no-op tokens), with the work that
    does not depend on the entering state (normalisation, gates, every chunk's intra-chunk matrices) done once for
    all chunks of all sequences, so a batch of many short prompts costs a few large ops instead of a pass per prompt;
    only the chunk-to-chunk state recurrence runs per chunk.
    """
    _, T, H, K = k.shape
    V = v.shape[-1]
    o = torch.zeros_like(v)
    starts, slots = query_start_loc.tolist(), cache_indices.tolist()
    tracks = track_chunk_idx.tolist() if track_chunk_idx is not None else None
    live = [i for i, slot in enumerate(slots) if slot != PAD_SLOT_ID and starts[i + 1] > starts[i]]
    rows, counts = _chunk_rows(starts, live, T)
    entering: dict[int, list[torch.Tensor]] = {}  # each live sequence's states entering its chunks [H, K, V]
    if live:
        g, beta = gate_and_beta(a[0], b[0], A_log, dt_bias, lower_bound, H, K)  # [T, H, K], [T, H]

        in_place = rows.numel() == T and bool((rows == torch.arange(T)).all())  # no padding, no reordering

        def chunks(x: torch.Tensor) -> torch.Tensor:  # packed [T, H, *] -> [H, N_c, CHUNK, *], padding rows 0
            if not in_place:
                x = torch.cat([x, x.new_zeros(1, *x.shape[1:])])[rows]
            return x.view(-1, CHUNK, *x.shape[1:]).movedim(2, 0).contiguous()

        qc = chunks(l2_normalize(q[0].float(), L2_EPS) * K ** -0.5)
        kc, vc, gc = chunks(l2_normalize(k[0].float(), L2_EPS)), chunks(v[0].float()), chunks(g)
        bc = chunks(beta[..., None])[..., 0]
        oc = torch.empty(H, rows.shape[0] // CHUNK, CHUNK, V)
        owner = [(i, c) for i, n in zip(live, counts) for c in range(n)]  # (sequence, its chunk) per global chunk
        step = _chunk_group_size(H, CHUNK, K)
        S = None
        for n0 in range(0, len(owner), step):
            grp = slice(n0, min(len(owner), n0 + step))
            W_, U, A_qk, Q_g, K_d, decay = _intra_chunk(qc[:, grp], kc[:, grp], vc[:, grp], gc[:, grp], bc[:, grp])
            for j in range(W_.shape[1]):
                i, c = owner[n0 + j]
                if c == 0:
                    S = ssm_states[slots[i]].float().transpose(-1, -2).clone()  # [H, K, V], not a view of the pool
                entering.setdefault(i, []).append(S)
                v_new = U[:, j] - W_[:, j] @ S
                oc[:, n0 + j] = Q_g[:, j] @ S + A_qk[:, j] @ v_new
                S = decay[:, j, :, None] * S + K_d[:, j].transpose(-1, -2) @ v_new
                if c == counts[live.index(i)] - 1:
                    ssm_states[slots[i]] = S.transpose(-1, -2).to(ssm_states.dtype)
        if in_place:
            o[0] = oc.movedim(0, 2).reshape(-1, H, V).to(o.dtype)
        else:
            keep = rows < T
            o[0, rows[keep]] = oc.movedim(0, 2).reshape(-1, H, V)[keep].to(o.dtype)
    states: list[torch.Tensor] = []
    for i, slot in enumerate(slots):
        n_chunks = -(-(starts[i + 1] - starts[i]) // CHUNK)
        if i not in entering:
            states += [ssm_states.new_zeros(n_chunks, H, V, K, dtype=torch.float32)] if return_chunk_states else []
            continue
        h_i = torch.stack(entering[i]).transpose(-1, -2)  # [n_chunks, H, V, K]
        states.append(h_i)
        if track_state is not None and tracks is not None and 0 <= tracks[i] < n_chunks:
            track_state[i] = h_i[tracks[i]]
    if return_chunk_states:
        h = torch.cat(states, 0) if states else ssm_states.new_zeros(0, H, V, K, dtype=torch.float32)
        return o, h[None]
    return o


def _token_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                S: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One gated delta-rule token of B requests in the pool's layout, float32.

    q, k [B, H, K] (L2-normalised), v [B, H, V], g [B, H, K] log-decay, beta [B, H], S [B, H, V, K].
    S <- S * exp(g); S <- S + (beta * (v - S k)) k^T; o = S (scale * q). Returns (o [B, H, V], new S [B, H, V, K]).
    Plain matmuls on [B, ...] tensors (no einsum parsing, no transposes): the same bits for the same B whether
    the caller decodes one token or walks a verify chain."""
    S = S * g.exp()[:, :, None, :]
    delta = beta[..., None] * (v - (S @ k[..., None])[..., 0])
    S = S + delta[..., :, None] * k[:, :, None, :]
    return (S @ (q * scale)[..., None])[..., 0], S


def kda_recurrent(q, k, v, a, b, *, A_log, dt_bias, lower_bound, ssm_states, cache_indices, query_start_loc,
                  write_state: bool = True, intermediate_states=None, intermediate_state_indices=None):
    """Token-by-token KDA of short sequences (decode: one token each; a verify: each request's chain).

    q, k [1, T, H, K], v [1, T, H, V]; a raw gate [T, H*K] or [1, T, H, K]; b [1, T, H]; request b owns packed
    rows query_start_loc[b]:query_start_loc[b+1] (equal or ragged lengths); ssm_states [slots, H, V, K];
    cache_indices [B]. write_state: store each request's final state in its slot; intermediate_states
    [rows, n_max, H, V, K] (with intermediate_state_indices [B]) gets the state after every token t of request b
    at [intermediate_state_indices[b], t] instead (the slot is left unchanged; steps past a chain's end hold its
    final state). All requests advance one token per step together, every op on [B, ...] tensors (_token_step),
    so a chain's state after token t is bit-identical to decoding tokens 0..t in a batch of the same size.
    A plain decode (one token per request, T == B) reads its [B, ...] rows in place, with no chain gathers.
    Returns o [1, T, H, V] in v.dtype.
    """
    _, T, H, K = k.shape
    V = v.shape[-1]
    B = cache_indices.shape[0]
    if B == 0:
        return torch.zeros_like(v)
    if query_start_loc.numel() != B + 1:
        raise ValueError(f"KDA recurrent path: query_start_loc {tuple(query_start_loc.shape)} for {B} requests")
    idx = cache_indices.long()
    valid = idx != PAD_SLOT_ID
    all_valid = bool(valid.all())
    safe = idx if all_valid else idx.clamp(min=0)
    S = ssm_states[safe].float()  # [B, H, V, K]
    scale = K ** -0.5
    if T == B and intermediate_states is None and query_start_loc.tolist() == list(range(B + 1)):
        g, beta = gate_and_beta(a.reshape(B, H * K), b.reshape(B, H), A_log, dt_bias, lower_bound, H, K)
        o, S = _token_step(l2_normalize(q[0].float(), L2_EPS), l2_normalize(k[0].float(), L2_EPS), v[0].float(),
                           g, beta, S, scale)
        if not all_valid:
            o = torch.where(valid[:, None, None], o, 0.0)
        if write_state:
            ssm_states[idx if all_valid else idx[valid]] = (S if all_valid else S[valid]).to(ssm_states.dtype)
        return o[None].to(v.dtype)
    rows, _ = chain_layout(query_start_loc.cpu(), T)  # [B, n]: packed row of token t of request b (T = padding)
    n = rows.shape[1]

    def dense(x: torch.Tensor, *shape) -> torch.Tensor:  # packed [T, ...] -> [B, n, ...], zero padding rows
        x = x.float().reshape(T, *shape)
        return torch.cat([x, x.new_zeros(1, *shape)])[rows]

    qs, ks, vs = dense(q, H, K), dense(k, H, K), dense(v, H, V)
    a_s, b_s = dense(a, H * K), dense(b, H)
    inter_rows = intermediate_state_indices[:B].long()[valid] if intermediate_states is not None else None
    o = torch.zeros(T + 1, H, V, dtype=torch.float32)
    for t in range(n):
        # token t of every request, contiguous, every op on [B, ...]: the same shapes (and bits) whatever n is
        def step(x: torch.Tensor) -> torch.Tensor:
            return x[:, t].contiguous()

        g, beta = gate_and_beta(step(a_s), step(b_s), A_log, dt_bias, lower_bound, H, K)
        o_t, S_t = _token_step(l2_normalize(step(qs), L2_EPS), l2_normalize(step(ks), L2_EPS), step(vs), g, beta,
                               S, scale)
        S = torch.where((rows[:, t] < T).view(B, 1, 1, 1), S_t, S)  # a finished chain keeps its state
        o[rows[:, t]] = o_t
        if inter_rows is not None:
            intermediate_states[inter_rows, t] = S[valid].to(intermediate_states.dtype)
    o[:T][~valid.repeat_interleave(rows.lt(T).sum(1))] = 0  # padding requests output 0
    if write_state:
        ssm_states[idx[valid]] = S[valid].to(ssm_states.dtype)
    return o[:T][None].to(v.dtype)
