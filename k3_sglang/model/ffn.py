"""K3 feed-forward blocks: the SiTU-GLU MLP (dense layer 0, shared experts) and the latent MoE.

Routed experts are held stacked and dequantised ([E, I, Dl] / [E, Dl, I]); the loader
dequantises MXFP4 checkpoints into them (`experts.{e}.w{1,2,3}` -> slice e).
"""

from __future__ import annotations

import torch
from torch import nn

from k3_sglang.config import K3Config
from k3_sglang.kernels.moe.naive import noaux_tc_route, situ, situ_mlp
from k3_sglang.kernels.norm.naive import rms_norm
from k3_sglang.model.common import RMSNorm
from k3_sglang.model.parallel import ModelParallel, all_reduce, column, mark_sharded, row
from k3_sglang.parallel.tp import Shard

# While evaluating every expert on every token stays under this many multiply-adds, the routed
# experts run densely (all experts, off-route weights zero: a handful of large ops instead of a
# pass per expert, the CPU decode path of small models); above it, one grouped pass per expert.
DENSE_MOE_MAX_MACS = 64 << 20


class SiTUMLP(nn.Module):
    """SiTU-GLU MLP: down(SiTU(gate(x), up(x))). x [T, D] -> [T, D].

    Under TP each rank holds intermediate/tp of gate/up (rows) and down (columns); `forward` all-reduces the
    partial sums unless reduce=False (the caller then reduces, e.g. once for shared experts and routed output)."""

    def __init__(self, hidden: int, intermediate: int, beta: float, linear_beta: float, shard: Shard | None = None):
        super().__init__()
        self.beta, self.linear_beta = beta, linear_beta
        self.shard = shard = ModelParallel.current().tp if shard is None else shard
        what = "the MLP intermediate size"
        self.gate_proj = column(hidden, intermediate, shard, what)
        self.up_proj = column(hidden, intermediate, shard, what)
        self.down_proj = row(intermediate, hidden, shard, what)

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        y = situ_mlp(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight, self.beta, self.linear_beta)
        return all_reduce(y, self.shard) if reduce else y


class MoEGate(nn.Module):
    """Router: `weight` [E, D] and the selection-only `e_score_correction_bias` [E] (fp32)."""

    def __init__(self, num_experts: int, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden), requires_grad=False)
        self.e_score_correction_bias = nn.Parameter(torch.zeros(num_experts, dtype=torch.float32), requires_grad=False)


class RoutedExperts(nn.Module):
    """Stacked routed experts in the latent width: w1/w3 [E_l, I_l, Dl] (gate/up), w2 [E_l, Dl, I_l] (down).

    This rank's experts [first, first + E_l) (EP: E / ep of them) and intermediate block (MoE TP: I / tp)."""

    def __init__(self, num_experts: int, latent: int, intermediate: int, ep: Shard = Shard(), tp: Shard = Shard()):
        super().__init__()
        local, inter = ep.part(num_experts, "the routed expert count"), tp.part(intermediate, "the expert intermediate")
        self.first = ep.rank * local
        self.num_total = num_experts
        self.w1 = nn.Parameter(torch.zeros(local, inter, latent), requires_grad=False)
        self.w3 = nn.Parameter(torch.zeros(local, inter, latent), requires_grad=False)
        self.w2 = nn.Parameter(torch.zeros(local, latent, inter), requires_grad=False)
        if tp.size > 1:
            mark_sharded(self.w1, 1, tp)
            mark_sharded(self.w3, 1, tp)
            mark_sharded(self.w2, 2, tp)


class LatentMoE(nn.Module):
    """Sigmoid noaux_tc routing on the full hidden; experts in the latent; shared experts on x.

    Under TP/EP every rank routes all tokens (the router is replicated), runs its experts (its intermediate block
    or its whole experts) on the latent, and the partial latents are summed over the TP group before the
    latent RMSNorm; the shared experts' partial output is reduced with them."""

    def __init__(self, cfg: K3Config):
        super().__init__()
        moe, hidden = cfg.moe, cfg.hidden_size
        self.moe, self.situ = moe, cfg.situ
        self.mp = ModelParallel.current()
        latent = moe.routed_expert_hidden_size
        self.gate = MoEGate(moe.num_experts, hidden)
        self.routed_expert_down_proj = nn.Linear(hidden, latent, bias=False)
        self.routed_expert_up_proj = nn.Linear(latent, hidden, bias=False)
        self.routed_expert_norm = RMSNorm(latent, cfg.rms_norm_eps)
        self.experts = RoutedExperts(moe.num_experts, latent, moe.moe_intermediate_size, self.mp.moe_ep,
                                     self.mp.moe_tp)
        self.shared_experts = (
            SiTUMLP(hidden, moe.shared_intermediate_size, cfg.situ.beta, cfg.situ.linear_beta, self.mp.tp)
            if moe.num_shared_experts > 0 else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        moe = self.moe
        weights, ids = noaux_tc_route(x.float() @ self.gate.weight.float().T, self.gate.e_score_correction_bias,
                                      moe.num_experts_per_token, moe.renormalize, moe.routed_scaling_factor)
        z = x @ self.routed_expert_down_proj.weight.T  # [T, Dl]
        if x.shape[0] * 3 * self.experts.w1.numel() <= DENSE_MOE_MAX_MACS:
            partial = self._latent_dense(z, weights, ids)
        else:
            partial = self._latent_grouped(z, weights, ids)
        r = all_reduce(partial, self.mp.tp)  # [T, Dl], summed over the experts / intermediate blocks of all ranks
        r = rms_norm(r, self.routed_expert_norm.weight, self.routed_expert_norm.eps)
        routed = r @ self.routed_expert_up_proj.weight.T
        if self.shared_experts is not None:
            routed = routed + self.shared_experts(x)
        return routed

    def _combine(self, weights: torch.Tensor, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[T, E_l] routing weights of this rank's experts, zero off-route."""
        combine = torch.zeros(ids.shape[0], self.experts.num_total, dtype=dtype, device=ids.device)
        combine.scatter_(1, ids, weights.to(dtype))
        return combine[:, self.experts.first: self.experts.first + self.experts.w1.shape[0]]

    def _latent_dense(self, z: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Every local expert on every token, combined by [T, E_l] weights: z [T, Dl] -> partial latent [T, Dl]."""
        combine = self._combine(weights, ids, z.dtype)
        w1, w3, w2 = self.experts.w1, self.experts.w3, self.experts.w2  # [E, I, Dl], [E, I, Dl], [E, Dl, I]
        e, i, dl = w1.shape
        gate = (z @ w1.reshape(e * i, dl).T).view(-1, e, i)
        up = (z @ w3.reshape(e * i, dl).T).view(-1, e, i)
        h = situ(gate, up, self.situ.beta, self.situ.linear_beta) * combine.unsqueeze(-1)  # [T, E, I]
        return torch.bmm(h.transpose(0, 1), w2.transpose(1, 2)).sum(dim=0)  # [T, Dl]

    def _latent_grouped(self, z: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """One pass per local expert that received tokens: z [T, Dl] -> partial latent [T, Dl] (fp32 accumulate)."""
        first, local = self.experts.first, self.experts.w1.shape[0]
        dt = torch.float64 if z.dtype == torch.float64 else torch.float32
        r = torch.zeros(z.shape[0], z.shape[1], dtype=dt, device=z.device)
        for e in torch.unique(ids).tolist():
            if not first <= e < first + local:
                continue
            tok, slot = (ids == e).nonzero(as_tuple=True)
            k = e - first
            y = situ_mlp(z[tok], self.experts.w1[k], self.experts.w3[k], self.experts.w2[k], self.situ.beta,
                         self.situ.linear_beta)
            r.index_add_(0, tok, weights[tok, slot].to(dt)[:, None] * y.to(dt))
        return r.to(z.dtype)
