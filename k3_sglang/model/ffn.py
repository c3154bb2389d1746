"""K3 feed-forward blocks: the SiTU-GLU MLP (dense layer 0, shared experts) and the latent MoE.

Routed experts are held stacked and dequantised ([E, I, Dl] / [E, Dl, I]); the loader
dequantises MXFP4 checkpoints into them (`experts.{e}.w{1,2,3}` -> slice e).
"""

from __future__ import annotations

import torch
from torch import nn

from k3_sglang.config import K3Config
from k3_sglang.kernels.moe.naive import latent_moe, noaux_tc_route, situ, situ_mlp
from k3_sglang.kernels.norm.naive import rms_norm
from k3_sglang.model.common import RMSNorm

# While evaluating every expert on every token stays under this many multiply-adds, the routed
# experts run densely (all experts, off-route weights zero: a handful of large ops instead of a
# pass per expert, the CPU decode path of small models); above it, one grouped pass per expert.
DENSE_MOE_MAX_MACS = 64 << 20


class SiTUMLP(nn.Module):
    """SiTU-GLU MLP: down(SiTU(gate(x), up(x))). x [T, D] -> [T, D]."""

    def __init__(self, hidden: int, intermediate: int, beta: float, linear_beta: float):
        super().__init__()
        self.beta, self.linear_beta = beta, linear_beta
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return situ_mlp(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight, self.beta, self.linear_beta)


class MoEGate(nn.Module):
    """Router: `weight` [E, D] and the selection-only `e_score_correction_bias` [E] (fp32)."""

    def __init__(self, num_experts: int, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden), requires_grad=False)
        self.e_score_correction_bias = nn.Parameter(torch.zeros(num_experts, dtype=torch.float32), requires_grad=False)


class RoutedExperts(nn.Module):
    """Stacked routed experts in the latent width: w1/w3 [E, I, Dl] (gate/up), w2 [E, Dl, I] (down)."""

    def __init__(self, num_experts: int, latent: int, intermediate: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.zeros(num_experts, intermediate, latent), requires_grad=False)
        self.w3 = nn.Parameter(torch.zeros(num_experts, intermediate, latent), requires_grad=False)
        self.w2 = nn.Parameter(torch.zeros(num_experts, latent, intermediate), requires_grad=False)


class LatentMoE(nn.Module):
    """Sigmoid noaux_tc routing on the full hidden; experts in the latent; shared experts on x."""

    def __init__(self, cfg: K3Config):
        super().__init__()
        moe, hidden = cfg.moe, cfg.hidden_size
        self.moe, self.situ = moe, cfg.situ
        latent = moe.routed_expert_hidden_size
        self.gate = MoEGate(moe.num_experts, hidden)
        self.routed_expert_down_proj = nn.Linear(hidden, latent, bias=False)
        self.routed_expert_up_proj = nn.Linear(latent, hidden, bias=False)
        self.routed_expert_norm = RMSNorm(latent, cfg.rms_norm_eps)
        self.experts = RoutedExperts(moe.num_experts, latent, moe.moe_intermediate_size)
        self.shared_experts = (
            SiTUMLP(hidden, moe.shared_intermediate_size, cfg.situ.beta, cfg.situ.linear_beta)
            if moe.num_shared_experts > 0 else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] * 3 * self.experts.w1.numel() <= DENSE_MOE_MAX_MACS:
            routed = self._routed_dense(x)
        else:
            routed = self._routed_grouped(x)
        if self.shared_experts is not None:
            routed = routed + self.shared_experts(x)
        return routed

    def _routed_dense(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, D] -> routed output [T, D], every expert on every token, combined by [T, E] routing weights."""
        moe = self.moe
        weights, ids = noaux_tc_route(x.float() @ self.gate.weight.float().T, self.gate.e_score_correction_bias,
                                      moe.num_experts_per_token, moe.renormalize, moe.routed_scaling_factor)
        combine = torch.zeros(x.shape[0], moe.num_experts, dtype=x.dtype, device=x.device)
        combine.scatter_(1, ids, weights.to(x.dtype))  # [T, E], zero off-route
        w1, w3, w2 = self.experts.w1, self.experts.w3, self.experts.w2  # [E, I, Dl], [E, I, Dl], [E, Dl, I]
        e, i, dl = w1.shape
        z = x @ self.routed_expert_down_proj.weight.T  # [T, Dl]
        gate = (z @ w1.reshape(e * i, dl).T).view(-1, e, i)
        up = (z @ w3.reshape(e * i, dl).T).view(-1, e, i)
        h = situ(gate, up, self.situ.beta, self.situ.linear_beta) * combine.unsqueeze(-1)  # [T, E, I]
        r = torch.bmm(h.transpose(0, 1), w2.transpose(1, 2)).sum(dim=0)  # [T, Dl]
        r = rms_norm(r, self.routed_expert_norm.weight, self.routed_expert_norm.eps)
        return r @ self.routed_expert_up_proj.weight.T

    def _routed_grouped(self, x: torch.Tensor) -> torch.Tensor:
        return latent_moe(
            x, self.gate.weight, self.gate.e_score_correction_bias,
            self.routed_expert_down_proj.weight, self.routed_expert_up_proj.weight,
            self.routed_expert_norm.weight, self.routed_expert_norm.eps,
            self.experts.w1, self.experts.w3, self.experts.w2,
            self.moe.num_experts_per_token, self.moe.renormalize, self.moe.routed_scaling_factor,
            self.situ.beta, self.situ.linear_beta,
        )
