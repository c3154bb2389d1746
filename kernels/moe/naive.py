"""Pure-PyTorch references for K3's latent MoE (design doc §2.3) and the SiTU activation (§2.4).

Compute is float32 (float64 for float64 inputs); outputs are in x's dtype unless stated.
"""
from __future__ import annotations

import torch

from k3_sglang.kernels.norm.naive import compute_dtype, rms_norm


def situ(gate: torch.Tensor, up: torch.Tensor, beta: float, linear_beta: float) -> torch.Tensor:
    """SiTU(g, u) = [beta * tanh(g / beta) * sigmoid(g)] * [linear_beta * tanh(u / linear_beta)].

    gate, up [..., I] (same shape). Returns [..., I] in gate.dtype.
    """
    if gate.shape != up.shape:
        raise ValueError(f"situ: gate {tuple(gate.shape)} and up {tuple(up.shape)} must have the same shape")
    dt = compute_dtype(gate, up)
    g, u = gate.to(dt), up.to(dt)
    out = beta * torch.tanh(g / beta) * torch.sigmoid(g) * (linear_beta * torch.tanh(u / linear_beta))
    return out.to(gate.dtype)


def situ_mlp(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, beta: float, linear_beta: float
) -> torch.Tensor:
    """SiTU-GLU MLP: w_down @ situ(w_gate @ x, w_up @ x).

    x [T, D], w_gate / w_up [I, D], w_down [D, I]. Returns [T, D] in x.dtype.
    """
    if w_gate.shape != w_up.shape or w_gate.shape[1] != x.shape[-1] or tuple(w_down.shape) != tuple(w_gate.shape[::-1]):
        raise ValueError(
            f"situ_mlp: x {tuple(x.shape)}, w_gate {tuple(w_gate.shape)}, w_up {tuple(w_up.shape)} [I, D], "
            f"w_down {tuple(w_down.shape)} [D, I] do not match"
        )
    dt = compute_dtype(x, w_gate)
    xf = x.to(dt)
    h = situ(xf @ w_gate.to(dt).T, xf @ w_up.to(dt).T, beta, linear_beta)
    return (h @ w_down.to(dt).T).to(x.dtype)


def noaux_tc_route(
    router_logits: torch.Tensor, correction_bias: torch.Tensor, top_k: int, renormalize: bool,
    routed_scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bias-corrected sigmoid top-k routing (noaux_tc, one group).

    router_logits [T, E], correction_bias [E] (selection only). Returns (weights [T, top_k] float32,
    ids [T, top_k] int64); weights = sigmoid(logits) at ids, renormalised by sum + 1e-20 if asked, times the factor.
    """
    if router_logits.dim() != 2 or tuple(correction_bias.shape) != (router_logits.shape[1],):
        raise ValueError(
            f"noaux_tc_route: router_logits {tuple(router_logits.shape)} must be [T, E], "
            f"correction_bias {tuple(correction_bias.shape)} [E]"
        )
    if not 0 < top_k <= router_logits.shape[1]:
        raise ValueError(f"noaux_tc_route: top_k={top_k} must be in (0, E={router_logits.shape[1]}]")
    s = torch.sigmoid(router_logits.float())
    ids = torch.topk(s + correction_bias.float(), top_k, dim=-1).indices
    w = s.gather(1, ids)
    if renormalize:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return w * routed_scaling_factor, ids.long()


def latent_moe(
    x: torch.Tensor, router_w: torch.Tensor, correction_bias: torch.Tensor, down_w: torch.Tensor, up_w: torch.Tensor,
    norm_w: torch.Tensor, norm_eps: float, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor, top_k: int,
    renormalize: bool, routed_scaling_factor: float, beta: float, linear_beta: float,
) -> torch.Tensor:
    """Routed part of K3's latent MoE (the caller adds the shared experts).

    x [T, D]; router_w [E, D] (router reads the full x, fp32); down_w [Dl, D]; up_w [D, Dl]; norm_w [Dl];
    w1, w3 [E, I, Dl] (gate, up); w2 [E, Dl, I]. z = x @ down_w^T; r = sum over the selected experts of
    weight * situ_mlp(z, w1[e], w3[e], w2[e]); r = rms_norm(r, norm_w, norm_eps); returns r @ up_w^T [T, D] in x.dtype.
    Loops over the experts that received tokens, not over tokens.
    """
    T, D = x.shape
    E, I, Dl = w1.shape
    if tuple(router_w.shape) != (E, D) or tuple(down_w.shape) != (Dl, D) or tuple(up_w.shape) != (D, Dl):
        raise ValueError(
            f"latent_moe: router_w {tuple(router_w.shape)} [E, D], down_w {tuple(down_w.shape)} [Dl, D], "
            f"up_w {tuple(up_w.shape)} [D, Dl] do not match x {tuple(x.shape)} and w1 {tuple(w1.shape)} [E, I, Dl]"
        )
    if w3.shape != w1.shape or tuple(w2.shape) != (E, Dl, I) or tuple(norm_w.shape) != (Dl,):
        raise ValueError(f"latent_moe: w3 {tuple(w3.shape)}, w2 {tuple(w2.shape)} [E, Dl, I], norm_w {tuple(norm_w.shape)} do not match w1")
    dt = compute_dtype(x, w1)
    weights, ids = noaux_tc_route(x.float() @ router_w.float().T, correction_bias, top_k, renormalize,
                                  routed_scaling_factor)
    z = x.to(dt) @ down_w.to(dt).T
    r = torch.zeros(T, Dl, dtype=dt, device=x.device)
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        y = situ_mlp(z[tok], w1[e], w3[e], w2[e], beta, linear_beta)
        r.index_add_(0, tok, weights[tok, slot].to(dt)[:, None] * y)
    r = rms_norm(r, norm_w, norm_eps)
    return (r @ up_w.to(dt).T).to(x.dtype)
