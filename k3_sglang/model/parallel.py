"""The portable model's view of SGLang's parallel layout: shards, collectives, sharded linears.

`ModelParallel.current()` reads SGLang's parallel context (`get_parallel()`) in a worker process; outside one
(unit tests, the meta-device manifest check) everything is one rank. Tests of a rank's shard set it with
`use_model_parallel(ModelParallel(...))`. The layout itself (which dimension of which tensor) lives in
`k3_sglang.parallel.tp`.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from k3_sglang.parallel.tp import Shard


@dataclass(frozen=True)
class ModelParallel:
    """Sizes and ranks the layers shard by: attention TP (MLA/KDA heads), MoE TP (expert intermediate), MoE EP
    (whole experts), the whole TP group (dense and shared MLPs), and DCP (MLA KV stripes within attention TP)."""

    attn_tp: Shard = Shard()
    tp: Shard = Shard()
    moe_tp: Shard = Shard()
    moe_ep: Shard = Shard()
    dcp: Shard = Shard()
    dcp_merge: str = "ag_rs"  # SGLang's --dcp-comm-backend: ag_rs, or a2a (fi_a2a maps to a2a here)

    @classmethod
    def current(cls) -> "ModelParallel":
        override = _OVERRIDE.get()
        if override is not None:
            return override
        try:
            from sglang.srt.runtime_context import get_parallel

            p = get_parallel()
            return cls(attn_tp=Shard(p.attn_tp_size, p.attn_tp_rank), tp=Shard(p.tp_size, p.tp_rank),
                       moe_tp=Shard(p.moe_tp_size, p.moe_tp_rank), moe_ep=Shard(p.moe_ep_size, p.moe_ep_rank),
                       dcp=Shard(p.attn_dcp_size, p.attn_dcp_rank if p.attn_dcp_size > 1 else 0),
                       dcp_merge=_merge_backend(p))
        except (ImportError, RuntimeError, ValueError, AttributeError):  # no SGLang worker context: one rank
            return cls()

    @property
    def single(self) -> bool:
        return self.tp.size == 1 and self.dcp.size == 1


def _merge_backend(p) -> str:
    try:
        backend = str(p.dcp_comm_backend or "ag_rs")
    except (RuntimeError, ValueError, AttributeError):
        return "ag_rs"
    return "a2a" if backend in ("a2a", "fi_a2a") else "ag_rs"


_OVERRIDE: contextvars.ContextVar[ModelParallel | None] = contextvars.ContextVar("k3_model_parallel", default=None)


@contextlib.contextmanager
def use_model_parallel(mp: ModelParallel):
    """Build layers as rank `mp` would (tests; no process group needed until a collective runs)."""
    token = _OVERRIDE.set(mp)
    try:
        yield mp
    finally:
        _OVERRIDE.reset(token)


def _group(name: str):
    from sglang.srt.runtime_context import get_parallel

    return getattr(get_parallel(), name)


def all_reduce(x: torch.Tensor, shard: Shard, group: str = "tp_group") -> torch.Tensor:
    """Sum x over the ranks of `shard` (SGLang's GroupCoordinator: gloo on CPU, NCCL on CUDA); x itself at one rank."""
    if shard.size == 1:
        return x
    return _group(group).all_reduce(x.contiguous())


def mark_sharded(param: nn.Parameter, dim: int, shard: Shard) -> nn.Parameter:
    """Tell the loader that `param` holds block shard.rank of shard.size along `dim` of the checkpoint tensor."""
    param.k3_shard = (dim, shard)
    return param


class ShardedLinear(nn.Linear):
    """y = x W^T with W one rank's block: `dim=0` column-parallel (output features sharded; each rank computes its
    own outputs), `dim=1` row-parallel (input features sharded; the output is a partial sum that the caller
    reduces). x [T, in_local] -> [T, out_local]. With shard.size 1 it is a plain nn.Linear."""

    def __init__(self, in_features: int, out_features: int, dim: int, shard: Shard, what: str):
        local_in = shard.part(in_features, what) if dim == 1 else in_features
        local_out = shard.part(out_features, what) if dim == 0 else out_features
        super().__init__(local_in, local_out, bias=False)
        if shard.size > 1:
            mark_sharded(self.weight, dim, shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


def column(in_features: int, out_features: int, shard: Shard, what: str) -> ShardedLinear:
    return ShardedLinear(in_features, out_features, 0, shard, what)


def row(in_features: int, out_features: int, shard: Shard, what: str) -> ShardedLinear:
    return ShardedLinear(in_features, out_features, 1, shard, what)
