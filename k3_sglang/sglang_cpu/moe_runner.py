"""`K3CpuMoeRunnerCore`: SGLang's MoE runner core for its "triton" runner name on CPU.

SGLang's MXFP4 MoE method on a non-CUDA, non-CPU-engine platform upcasts the experts to bf16 at load and runs
them through the "triton" runner (`layers/quantization/mxfp4.py`). `register_moe_runner_core("triton", ...)` is
SGLang's seam for a runner core of that name; this one consumes the standard dispatch output directly
(`DispatchMoeRunnerCore`), so no Triton alignment or fused-MoE kernel runs: tokens are grouped by expert and every
active expert runs one gate/up GEMM, K3's SiTU (or SwiGLU) and one down GEMM, weighted and summed per token.
"""
from __future__ import annotations

import torch
from sglang.srt.layers.moe.moe_runner.base import DispatchMoeRunnerCore, MoeRunnerConfig
from sglang.srt.layers.moe.utils import MoeRunnerBackend

RUNNER_NAME = "triton"
# Below this many multiply-adds for all experts on all tokens, every expert runs densely (one batched GEMM pair,
# off-route weights zero) instead of one GEMM pair per active expert: small models and short batches are bound by
# per-op overhead on CPU, not by the E / k extra work.
DENSE_BUDGET = 1 << 24


def gated_activation(x: torch.Tensor, config: MoeRunnerConfig) -> torch.Tensor:
    """x [N, 2I] = [gate | up] -> [N, I] in x.dtype: SiTU (K3: beta = gemm1_alpha, default 4; up clipped by
    linear_beta = gemm1_clamp_limit) or SiLU, computed in float32 as SGLang's fused MoE does."""
    d = x.shape[-1] // 2
    gate, up = x[:, :d].float(), x[:, d:].float()
    if gate.data_ptr() == x.data_ptr():  # float32 x: .float() returned views of x, which must not be written
        gate, up = gate.clone(), up.clone()
    if config.activation == "situ":  # in place on the float32 copies: the same ops in the same order, no temporaries
        beta = config.gemm1_alpha if config.gemm1_alpha is not None else 4.0
        gate = gate.sigmoid().mul_(gate.div_(beta).tanh_().mul_(beta))  # beta * tanh(gate / beta) * sigmoid(gate)
        if config.gemm1_clamp_limit is not None:
            limit = config.gemm1_clamp_limit
            up = up.div_(limit).tanh_().mul_(limit)
    elif config.activation == "silu" and config.gemm1_alpha is None and config.swiglu_limit is None:
        gate = torch.nn.functional.silu(gate)
    else:
        raise NotImplementedError(f"K3CpuMoeRunnerCore: gated activation {config.activation!r} with "
                                  f"alpha={config.gemm1_alpha}, swiglu_limit={config.swiglu_limit}")
    return (gate * up).to(x.dtype)


def grouped_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                    topk_ids: torch.Tensor, config: MoeRunnerConfig, b13: torch.Tensor | None = None,
                    b2: torch.Tensor | None = None, dense_budget: int = DENSE_BUDGET) -> torch.Tensor:
    """Routed experts of a batch (all experts densely when T * E * 3 * I * D <= dense_budget).

    x [T, D]; w13 [E, 2I, D] ([gate; up] rows); w2 [E, D, I]; topk_weights [T, k]; topk_ids [T, k] (ids outside
    [0, E) are another rank's experts and skipped); optional biases b13 [E, 2I], b2 [E, D]. Returns [T, D] (sum over k; [T, k, D] with no_combine) in
    x.dtype, times routed_scaling_factor when set.
    """
    if config.is_gated is False:
        raise NotImplementedError("K3CpuMoeRunnerCore: non-gated experts")
    T, D = x.shape
    k = topk_ids.shape[1]
    E = w13.shape[0]
    if T * E * 3 * w2.shape[2] * D <= dense_budget and not config.no_combine:
        return _dense_experts(x, w13, w2, topk_weights, topk_ids, config, b13, b2)
    flat_ids = topk_ids.reshape(-1).long()
    flat_w = topk_weights.reshape(-1).float()
    routed = ((flat_ids >= 0) & (flat_ids < E)).nonzero().flatten()
    order = routed[torch.argsort(flat_ids[routed], stable=True)]  # slots (token * k + j), grouped by expert
    expert_of_row = flat_ids[order]
    counts = torch.bincount(expert_of_row, minlength=E).tolist()
    tok, w = order // k, flat_w[order]  # [N] token and router weight of every routed slot, in expert order
    xs = x[tok]  # [N, D]: one gather for all experts
    if config.apply_router_weight_on_input:
        xs = (xs.float() * w[:, None]).to(x.dtype)
    y = _per_expert_mlp(xs, w13, w2, counts, config, b13)  # [N, D]
    if b2 is not None:
        y = (y.float() + b2.float()[expert_of_row]).to(x.dtype)
    weighted = not config.apply_router_weight_on_input and not (config.no_combine and
                                                                  not config.no_combine_keep_router_weight)
    if config.no_combine:
        per_slot = x.new_zeros(T * k, D)
        per_slot[order] = (y.float() * w[:, None]).to(x.dtype) if weighted else y
        return per_slot.view(T, k, D)
    out = torch.zeros(T, D, dtype=torch.float32, device=x.device)
    out.index_add_(0, tok, y.float() * w[:, None] if weighted else y.float())  # sum over each token's k slots
    if config.routed_scaling_factor is not None:
        out = out * config.routed_scaling_factor
    return out.to(x.dtype)


def _per_expert_mlp(rows: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, counts: list[int],
                    config: MoeRunnerConfig, b13: torch.Tensor | None) -> torch.Tensor:
    """rows [N, D] grouped by expert (counts[e] consecutive rows for expert e) -> [N, D] in rows.dtype: each
    expert's gate/up GEMM, activation and down GEMM on its own rows (cache-sized pieces), written into one output."""
    out = rows.new_empty(rows.shape[0], w2.shape[1])
    start = 0
    for e, n in enumerate(counts):
        if not n:
            continue
        h = rows[start:start + n] @ w13[e].to(rows.dtype).t()
        if b13 is not None:
            h = (h.float() + b13[e].float()).to(rows.dtype)
        torch.mm(gated_activation(h, config), w2[e].to(rows.dtype).t(), out=out[start:start + n])
        start += n
    return out


def _dense_experts(x, w13, w2, topk_weights, topk_ids, config, b13, b2) -> torch.Tensor:
    """grouped_experts for a small batch: every expert on every token (one GEMM against all experts' [gate; up] rows,
    one batched down GEMM), combined with a [T, E] weight matrix that is zero off-route (the same per-(token, expert)
    results; ids outside [0, E) get weight 0). Computed in float32 against cached float32 copies of the expert
    weights (fast_ops.float32_copy: at these sizes a bf16 GEMM costs several times a float32 one on CPU), rounded
    to x.dtype once at the end."""
    from k3_sglang.sglang_cpu.fast_ops import float32_copy

    T, E = x.shape[0], w13.shape[0]
    ids = topk_ids.long()
    routed = (ids >= 0) & (ids < E)
    weight = torch.zeros(T, E, dtype=torch.float32, device=x.device)
    weight.scatter_add_(1, ids.clamp(0, E - 1), torch.where(routed, topk_weights.float(), 0.0))
    w13f, w2f, xf = float32_copy(w13), float32_copy(w2), x.float()
    if config.apply_router_weight_on_input:
        xs = xf.unsqueeze(0) * weight.t()[:, :, None]  # [E, T, D]
        h = torch.bmm(xs, w13f.transpose(1, 2)).transpose(0, 1)  # [T, E, 2I]
    else:  # x [T, D] @ [E * 2I, D]^T
        h = (xf @ w13f.reshape(E * w13.shape[1], -1).t()).view(T, E, -1)  # [T, E, 2I]
    if b13 is not None:
        h = h + b13.float()
    act = gated_activation(h.reshape(T * E, -1), config).view(T, E, -1).transpose(0, 1)  # [E, T, I] float32
    y = torch.bmm(act, w2f.transpose(1, 2))  # [E, T, D]
    if b2 is not None:
        y = y + b2.float()[:, None]
    scale = torch.ones_like(weight) * (weight != 0) if config.apply_router_weight_on_input else weight
    out = (y * scale.t()[:, :, None]).sum(0)
    if config.routed_scaling_factor is not None:
        out = out * config.routed_scaling_factor
    return out.to(x.dtype)


class K3CpuMoeRunnerCore(DispatchMoeRunnerCore):
    """Runs the standard dispatch output with the quant info's dense (upcast) expert weights."""

    @property
    def runner_backend(self):
        return MoeRunnerBackend.TRITON

    def run_from_dispatch(self, dispatch_output, quant_info, runner_config, hooks=None):
        from sglang.srt.layers.moe.token_dispatcher.standard import StandardCombineInput

        if hooks is not None:
            raise NotImplementedError("K3CpuMoeRunnerCore: LoRA hooks")
        for flag in ("use_fp8_w8a8", "use_int8_w8a8", "use_int8_w8a16", "use_int4_w4a16", "use_mxfp8"):
            if getattr(quant_info, flag, False):
                raise NotImplementedError(f"K3CpuMoeRunnerCore: {flag} experts (only dense/upcast weights)")
        topk_weights, topk_ids, _ = dispatch_output.topk_output
        out = grouped_experts(dispatch_output.hidden_states, quant_info.w13_weight, quant_info.w2_weight,
                              topk_weights, topk_ids, self.config, quant_info.b13, quant_info.b2)
        return StandardCombineInput(hidden_states=out)


def register() -> None:
    """Make K3CpuMoeRunnerCore the core of SGLang's "triton" runner in this process."""
    from sglang.srt.layers.moe.moe_runner import runner

    if RUNNER_NAME not in runner._CUSTOM_RUNNER_CORE_FACTORIES:
        runner.register_moe_runner_core(RUNNER_NAME, K3CpuMoeRunnerCore)
