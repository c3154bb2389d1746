"""Per-GPU memory of one PP stage: weights, the activation reserve, and SGLang's state/KV pool split.

SGLang 0.5.23 sizes the pools from what is left after weights (mem_cache/kv_cache_configurator.py):
    rest        = mem_fraction_static * GPU memory - CUDA context - weights
    state pool  = rest * r / (1 + r)          r = --mamba-full-memory-ratio (default 0.9)
    KV pool     = rest / (1 + r)
    state slots = state pool // bytes per slot - 1 (padding slot)
The balanced ratio r* = (S + D) * token_equiv * dcp / L (token_equiv = slot bytes / KV bytes per token)
makes the KDA state pool and the MLA KV pool run out at the same number of sessions of length L.
"""

from __future__ import annotations

from dataclasses import dataclass

from k3_sglang.config import K3Config
from k3_sglang.plan.errors import PlanError
from k3_sglang.plan.precision import CONV_STATE_BYTES, Precision
from k3_sglang.plan.system import System
from k3_sglang.plan.topology import Group
from k3_sglang.plan.units import GIB, to_gib
from k3_sglang.plan.weights import (LayerWeights, embedding_bytes, final_norm_bytes, layer_weights, lm_head_bytes,
                                    mla_q_projection_bytes)
from k3_sglang.plan.workload import Serving

CUDA_CONTEXT_RESERVE_GIB = 1.0  # CUDA context + NCCL communicators, taken before SGLang measures free memory
MIN_MAMBA_RATIO = 0.001         # floor of the solved ratio (SGLang needs a non-empty state pool)
RATIO_DECIMALS = 3              # the solved ratio is rounded so the launch flag and the plan agree


@dataclass(frozen=True)
class StageMemory:
    """One GPU of one PP stage of a group: where its bytes go and what its pools hold."""

    stage: int
    first_layer: int
    last_layer: int
    weights_bytes: int
    replicated_q_bytes: int
    reserve_bytes: int
    rest_bytes: int
    mamba_ratio: float
    state_pool_bytes: int
    kv_pool_bytes: int
    state_bytes_per_slot: int
    kv_bytes_per_token: int
    kv_tokens: int | None
    state_slots: int | None

    @property
    def num_layers(self) -> int:
        """Layers held by this stage."""
        return self.last_layer - self.first_layer + 1


def stage_weight_bytes(model: K3Config, layers: range, group: Group, mxfp4: bool, last_stage: bool) -> int:
    """Weight bytes on one GPU of a stage, by the placement classes in weights.py."""
    total = LayerWeights()
    for layer_id in layers:
        total = total + layer_weights(model, layer_id, mxfp4)
    per_gpu = total.attention / group.attn_tp + (total.mlp + total.routed) / group.tp + total.replicated
    if layers.start == 0:
        per_gpu += embedding_bytes(model) / group.tp
    if last_stage:
        per_gpu += lm_head_bytes(model) / group.tp + final_norm_bytes(model)
    return int(per_gpu)


def replicated_q_bytes(model: K3Config, layers: range, group: Group, serving: Serving) -> int:
    """Extra bytes per GPU of --dcp-replicate-q-proj: the DCP group's q_b_proj and W_UK on every rank."""
    if group.dcp == 1 or not serving.replicate_q_proj:
        return 0
    mla_layers = sum(1 for i in layers if not model.is_kda_layer(i))
    return mla_layers * mla_q_projection_bytes(model) * (group.dcp - 1) // group.attn_tp


def state_bytes_per_slot(model: K3Config, layers: range, group: Group, precision: Precision) -> int:
    """One KDA state slot on one rank: recurrent + conv state of the stage's KDA layers, heads / attention-TP."""
    kda_layers = sum(1 for i in layers if model.is_kda_layer(i))
    per_layer = model.kda.recurrent_state_bytes(precision.ssm_bytes) + model.kda.conv_state_bytes(CONV_STATE_BYTES)
    return kda_layers * per_layer // group.attn_tp


def kv_bytes_per_token(model: K3Config, layers: range, precision: Precision) -> int:
    """MLA latent bytes per token on one rank (the latent is not head-sharded: TP replicates it)."""
    mla_layers = sum(1 for i in layers if not model.is_kda_layer(i))
    return mla_layers * model.mla.kv_bytes_per_token_per_layer(precision.kv_bytes)


def balanced_ratio(slot_bytes: int, token_bytes: int, slots_per_request: int, draft_tokens: int,
                   dcp: int, session_tokens: int) -> float:
    """r* = (S + D) * token_equiv * dcp / L: the state/KV ratio at which both pools bind together."""
    token_equiv = slot_bytes / token_bytes
    return (slots_per_request + draft_tokens) * token_equiv * dcp / session_tokens


def solved_ratio(exact: float) -> float:
    """The balanced ratio as it goes on the command line."""
    return max(MIN_MAMBA_RATIO, round(exact, RATIO_DECIMALS))


def pool_tokens(kv_pool_bytes: int, token_bytes: int, page_size: int) -> int:
    """Whole pages of tokens a KV pool holds (308,608 tokens in 7.95 GiB at 27,648 B/token, pages of 64)."""
    return kv_pool_bytes // token_bytes // page_size * page_size


def reserve_bytes(system: System, serving: Serving) -> int:
    """Activation/workspace reserve per GPU: (1 - mem_fraction_static) of memory, plus the CUDA context."""
    return int((1 - serving.mem_fraction_static) * system.gpu_memory_gib * GIB + CUDA_CONTEXT_RESERVE_GIB * GIB)


def _rest_or_raise(system: System, group: Group, stage: int, weights: int, rep_q: int, reserve: int,
                   mxfp4: bool) -> int:
    gpu = int(system.gpu_memory_gib * GIB)
    rest = gpu - reserve - weights - rep_q
    if rest <= 0:
        raise PlanError("weights-fit", f"{group.label()} stage {stage}: {to_gib(weights):.1f} GiB of weights"
                        + (f" + {to_gib(rep_q):.1f} GiB replicated Q" if rep_q else "")
                        + f" + {to_gib(reserve):.1f} GiB reserve = {to_gib(weights + rep_q + reserve):.1f} GiB per "
                        f"GPU, {system.gpu_name} has {system.gpu_memory_gib:.1f} GiB: short by {to_gib(-rest):.1f} GiB "
                        "(use more GPUs per group: larger TP or PP" + ("" if mxfp4 else "; or keep the experts in MXFP4") + ")")
    return rest


def stage_memory(model: K3Config, system: System, group: Group, precision: Precision, serving: Serving,
                 stage: int, layers: range, last_stage: bool, ratio: float) -> StageMemory:
    """Size one stage's pools under state/KV ratio `ratio`."""
    weights = stage_weight_bytes(model, layers, group, precision.experts_mxfp4, last_stage)
    rep_q = replicated_q_bytes(model, layers, group, serving)
    reserve = reserve_bytes(system, serving)
    rest = _rest_or_raise(system, group, stage, weights, rep_q, reserve, precision.experts_mxfp4)
    state_pool = int(rest * ratio / (1 + ratio))
    kv_pool = rest - state_pool
    slot = state_bytes_per_slot(model, layers, group, precision)
    token = kv_bytes_per_token(model, layers, precision)
    kv_tokens = pool_tokens(kv_pool, token, serving.page_size) if token else None
    slots = max(0, state_pool // slot - 1) if slot else None
    return StageMemory(stage, layers.start, layers.stop - 1, weights, rep_q, reserve, rest, ratio, state_pool,
                       kv_pool, slot, token, kv_tokens, slots)
