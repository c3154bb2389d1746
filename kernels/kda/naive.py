"""Pure-PyTorch references for KDA (Kimi Delta Attention), design doc §2.1.

Every op computes in float32 (float64 when the inputs are float64) and returns the input dtype unless stated.
Recurrent states are float32 (float64 for float64 inputs). Nothing is modified in place.

Shapes: T tokens of one sequence, B requests, H heads, K key dim, V value dim, D channels, W conv width.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from k3_sglang.kernels.norm.naive import compute_dtype

_LOG2E = 1.4426950408889634

def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x [..., K] -> x * rsqrt(sum(x^2) + eps) over the last dim, in x.dtype."""
    xf = x.to(compute_dtype(x))
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


def kda_gate(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float) -> torch.Tensor:
    """K3 lower-bound decay gate.

    f [..., H, K] raw low-rank gate output; A_log [>=H] (the first H entries are used); dt_bias [H*K].
    Returns log-decay g [..., H, K] = lower_bound * sigmoid(exp(A_log[:H])[:, None] * (f + dt_bias.view(H, K))),
    float32 (float64 for float64 f).
    """
    if f.dim() < 2:
        raise ValueError(f"kda_gate: f {tuple(f.shape)} must be [..., H, K]")
    H, K = f.shape[-2:]
    if A_log.dim() != 1 or A_log.shape[0] < H:
        raise ValueError(f"kda_gate: A_log {tuple(A_log.shape)} must be 1-D with at least H={H} entries")
    if dt_bias.numel() != H * K:
        raise ValueError(f"kda_gate: dt_bias {tuple(dt_bias.shape)} must hold H*K={H * K} entries")
    dt = compute_dtype(f)
    a = A_log.narrow(0, 0, H).to(dt).exp()[:, None]
    return lower_bound * torch.sigmoid(a * (f.to(dt) + dt_bias.to(dt).view(H, K)))


def short_conv_silu(
    x: torch.Tensor, weight: torch.Tensor, window: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + SiLU over one sequence.

    x [T, D] pre-conv rows; weight [D, W] (weight[:, W-1] multiplies the current row); window [W-1, D] the
    previous W-1 pre-conv rows, oldest first (zeros if None).
    Returns (y [T, D] in x.dtype, new_window [W-1, D] = last W-1 rows of concat(window, x), in the window's dtype
    (x.dtype if None)). Works for any T >= 0, including T < W-1.
    """
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[0] != x.shape[1]:
        raise ValueError(f"short_conv_silu: x {tuple(x.shape)} must be [T, D], weight {tuple(weight.shape)} [D, W]")
    T, D = x.shape
    W = weight.shape[1]
    if window is None:
        window = x.new_zeros(W - 1, D)
    if tuple(window.shape) != (W - 1, D):
        raise ValueError(f"short_conv_silu: window {tuple(window.shape)} must be [W-1, D] = [{W - 1}, {D}]")
    dt = compute_dtype(x, weight)
    full = torch.cat([window.to(dt), x.to(dt)], 0)  # [T + W - 1, D]
    if T == 0:
        y = full.new_zeros(0, D)
    else:
        y = (full.unfold(0, W, 1) * weight.to(dt)).sum(-1)  # unfold -> [T, D, W]
    new_window = full[full.shape[0] - (W - 1):].to(window.dtype)
    return F.silu(y).to(x.dtype), new_window


def kda_recurrent_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One gated delta-rule token for a batch.

    q, k [B, H, K] (L2-normalised), v [B, H, V], g [B, H, K] log-decay, beta [B, H] (post-sigmoid),
    state [B, H, K, V]. S <- exp(g) * S; S <- S + beta * k (v - S^T k)^T; o = S^T (scale * q).
    Returns (o [B, H, V] in v.dtype, new_state [B, H, K, V] float32, float64 for float64 inputs).
    """
    B, H, K = k.shape
    V = v.shape[-1]
    if q.shape != k.shape or g.shape != k.shape or tuple(beta.shape) != (B, H) or tuple(v.shape[:2]) != (B, H):
        raise ValueError(
            f"kda_recurrent_step: q {tuple(q.shape)}, k {tuple(k.shape)}, g {tuple(g.shape)} must be [B, H, K], "
            f"v {tuple(v.shape)} [B, H, V], beta {tuple(beta.shape)} [B, H]"
        )
    if tuple(state.shape) != (B, H, K, V):
        raise ValueError(f"kda_recurrent_step: state {tuple(state.shape)} must be [B, H, K, V] = {(B, H, K, V)}")
    dt = compute_dtype(q, k, v, g, state)
    o, S, _ = delta_rule_step(q.to(dt), k.to(dt), v.to(dt), g.to(dt), beta.to(dt), scale, state.to(dt))
    return o.to(v.dtype), S


def decay_state(S: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """S [..., K, V] * exp(g)[..., None] for g [..., K]."""
    return S * g.exp()[..., None]


def add_rank_one(S: torch.Tensor, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """S [..., K, V] + k [..., K] outer delta [..., V]."""
    return S + k[..., :, None] * delta[..., None, :]


def delta_rule_step(q, k, v, g, beta, scale, S):
    """The gated delta rule on same-dtype tensors ([..., K] / [..., V] / [...] / [..., K, V]).

    Returns (o [..., V], new S, delta [..., V] = beta * (v - S'^T k)) so that replaying decay_state then
    add_rank_one with the recorded (g, k, delta) reproduces the new S bit for bit.
    """
    S = decay_state(S, g)
    delta = beta[..., None] * (v - torch.einsum("...k,...kv->...v", k, S))
    S = add_rank_one(S, k, delta)
    return torch.einsum("...k,...kv->...v", q * scale, S), S, delta


def _check_sequence(name: str, q, k, v, g, beta, initial_state) -> None:
    T, H, K = k.shape
    if q.shape != k.shape or g.shape != k.shape or v.dim() != 3 or tuple(v.shape[:2]) != (T, H):
        raise ValueError(
            f"{name}: q {tuple(q.shape)}, k {tuple(k.shape)}, g {tuple(g.shape)} must be [T, H, K] and "
            f"v {tuple(v.shape)} [T, H, V]"
        )
    if tuple(beta.shape) != (T, H):
        raise ValueError(f"{name}: beta {tuple(beta.shape)} must be [T, H] = {(T, H)}")
    if initial_state is not None and tuple(initial_state.shape) != (H, K, v.shape[-1]):
        raise ValueError(f"{name}: initial_state {tuple(initial_state.shape)} must be [H, K, V] = {(H, K, v.shape[-1])}")


def _zero_state(q, k, v, g, initial_state):
    dt = compute_dtype(q, k, v, g, *([initial_state] if initial_state is not None else []))
    if initial_state is None:
        return torch.zeros(k.shape[1], k.shape[2], v.shape[2], dtype=dt, device=k.device)
    return initial_state.to(dt)


def naive_recurrent_kda(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token KDA over one sequence (the ground truth).

    q, k [T, H, K] (L2-normalised), v [T, H, V], g [T, H, K] log-decay, beta [T, H], initial_state [H, K, V].
    Returns (o [T, H, V] in v.dtype, final_state [H, K, V] float32, float64 for float64 inputs).
    """
    _check_sequence("naive_recurrent_kda", q, k, v, g, beta, initial_state)
    S = _zero_state(q, k, v, g, initial_state)[None]
    outs = []
    for t in range(k.shape[0]):
        o, S = kda_recurrent_step(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], scale, S)
        outs.append(o)
    o = torch.cat(outs, 0) if outs else v.new_zeros(v.shape)
    return o, S[0]


def _decay_exact(xs, k, G):
    """out[..., i, j] = sum_c x_ic k_jc 2^(G_ic - G_jc) for j <= i (else 0), one [..., C, C] per x in xs.

    G is the in-chunk cumulative log-decay in base 2 (exp2 is several times faster than exp on CPU).

    Walks the C lower diagonals (offset d = i - j), so every exponent is <= 0 (no overflow whatever g is).
    """
    C = k.shape[-2]
    outs = [k.new_zeros(*k.shape[:-2], C, C) for _ in xs]
    for d in range(C):
        ek = torch.exp2(G[..., d:, :] - G[..., :C - d, :]) * k[..., :C - d, :]
        for out, x in zip(outs, xs):
            out.diagonal(-d, -2, -1).copy_((x[..., d:, :] * ek).sum(-1))
    return outs


def _decay_matrices(xs, k, G):
    """Same result as _decay_exact, by 4-ary blocking: the strictly-lower blocks are matmuls and the diagonal
    blocks recurse, down to blocks of <= 4 rows done exactly.

    For row block b, r = G at the last row before it, so 2^(G_i - r) <= 1 and 2^(r - G_j) <= 1 and their
    product is 2^(G_i - G_j) exactly. xs, k, G [..., C, K]; returns one [..., C, C] per x.
    """
    C, K = k.shape[-2:]
    if C <= 4 or C % 4:
        return _decay_exact(xs, k, G)
    s = C // 4
    lead = k.shape[:-2]
    blocks = [t.reshape(*lead, 4, s, K) for t in (*xs, k, G)]
    diag = _decay_matrices(blocks[:-2], blocks[-2], blocks[-1])  # each [..., 4, s, s]
    outs = [k.new_zeros(*lead, C, C) for _ in xs]
    for b in range(4):
        rows = slice(b * s, (b + 1) * s)
        for out, d in zip(outs, diag):
            out[..., rows, rows] = d[..., b, :, :]
        if b == 0:
            continue
        r = G[..., b * s - 1:b * s, :]
        up = torch.exp2(G[..., rows, :] - r)
        cols = (k[..., :b * s, :] * torch.exp2(r - G[..., :b * s, :])).transpose(-1, -2)
        for out, x in zip(outs, xs):
            out[..., rows, :b * s] = (x[..., rows, :] * up) @ cols
    return outs


def _intra_chunk(q, k, v, g, beta):
    """Everything inside a chunk that does not depend on the entering state.

    q (already scaled), k, g [..., C, K], v [..., C, V], beta [..., C]. Returns (W, U, A_qk, Q_g, K_d, decay_last)
    in the notation of §2.1: Vnew = U - W S, O = Q_g S + A_qk Vnew, S' = decay_last * S + K_d^T Vnew.
    """
    C, K = k.shape[-2:]
    G = (g * _LOG2E).cumsum(-2)  # base-2 log decay: exp(x) == exp2(x * log2(e))
    A_kk, A_qk = _decay_matrices((k, q), k, G)
    eye = torch.eye(C, dtype=k.dtype, device=k.device)
    lower = eye + beta[..., :, None] * A_kk.tril(-1)
    decay = torch.exp2(G)
    rhs = beta[..., None] * torch.cat([k * decay, v], -1)
    WU = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
    W, U = WU[..., :K], WU[..., K:]
    G_last = G[..., -1:, :]
    return W, U, A_qk, q * decay, k * torch.exp2(G_last - G), torch.exp2(G_last.squeeze(-2))


def _chunk_group_size(H: int, C: int, K: int, budget: int = 1 << 24) -> int:
    """How many chunks to prepare at once so the per-group temporaries (a few [H, n, C, C] and [H, n, C, K])
    stay within ~budget elements."""
    return max(1, budget // max(1, 4 * H * C * (C + K)))


def chunk_kda(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float,
    initial_state: torch.Tensor | None = None, chunk_size: int = 64, chunk_states: bool = False,
):
    """Chunkwise KDA (WY representation) over one sequence: same contract as naive_recurrent_kda.

    q, k [T, H, K] (L2-normalised), v [T, H, V], g [T, H, K] log-decay, beta [T, H], initial_state [H, K, V].
    T need not be a multiple of chunk_size (the tail is padded with no-op tokens: k = v = beta = g = 0).
    Returns (o [T, H, V] in v.dtype, final_state [H, K, V] float32, float64 for float64 inputs), and with
    chunk_states also the state entering each chunk, [ceil(T / chunk_size), H, K, V].
    """
    _check_sequence("chunk_kda", q, k, v, g, beta, initial_state)
    if chunk_size <= 0:
        raise ValueError(f"chunk_kda: chunk_size={chunk_size} must be positive")
    S = _zero_state(q, k, v, g, initial_state)
    dt = S.dtype
    T, H, K = k.shape
    V = v.shape[-1]
    C = chunk_size
    N = -(-T // C)
    pad = N * C - T

    def to_chunks(x: torch.Tensor, mult: float = 1.0) -> torch.Tensor:  # [T, H, *] -> [H, N, C, *]
        x = F.pad(x.to(dt) * mult, (0, 0) * (x.dim() - 2) + (0, 0, 0, pad))
        return x.reshape(N, C, H, *x.shape[2:]).movedim(2, 0).contiguous()

    qc, kc, vc, gc = to_chunks(q, scale), to_chunks(k), to_chunks(v), to_chunks(g)
    bc = to_chunks(beta[..., None])[..., 0]
    o = torch.empty(H, N, C, V, dtype=dt, device=k.device)
    step = _chunk_group_size(H, C, K)
    entering = []
    for n0 in range(0, N, step):
        grp = slice(n0, min(N, n0 + step))
        W, U, A_qk, Q_g, K_d, decay = _intra_chunk(qc[:, grp], kc[:, grp], vc[:, grp], gc[:, grp], bc[:, grp])
        for i in range(W.shape[1]):
            if chunk_states:
                entering.append(S)
            v_new = U[:, i] - W[:, i] @ S
            o[:, n0 + i] = Q_g[:, i] @ S + A_qk[:, i] @ v_new
            S = decay[:, i, :, None] * S + K_d[:, i].transpose(-1, -2) @ v_new
    o = o.movedim(0, 2).reshape(N * C, H, V)[:T]
    if chunk_states:
        return o.to(v.dtype), S, (torch.stack(entering) if entering else S.new_zeros(0, *S.shape))
    return o.to(v.dtype), S


def gated_rms_norm(o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """KDA output norm: RMSNorm over V (fp32) * weight * sigmoid(gate).

    o, gate [T, H, V] (any leading dims), weight [V]. Returns o's shape in o.dtype.
    """
    if gate.shape != o.shape or weight.dim() != 1 or weight.shape[0] != o.shape[-1]:
        raise ValueError(
            f"gated_rms_norm: o {tuple(o.shape)} and gate {tuple(gate.shape)} must match, weight {tuple(weight.shape)} "
            "must be [V]"
        )
    dt = compute_dtype(o, gate)
    of = o.to(dt)
    y = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps) * weight.to(dt) * torch.sigmoid(gate.to(dt))
    return y.to(o.dtype)
