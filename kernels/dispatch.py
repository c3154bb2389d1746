"""Our kernel ops: one name per op, a backend per device.

A server calls `mla_dcp` (the k3_dcp_mla and k3_cpu_mla MLA backends of SGLang's K3: one DCP rank's stripe of the
paged MLA cache; prefill chunks, verify chains and decode) and `merge_attention_states` (the exact LSE merge of the
ranks' partials). Every other kernel of ours retired with the portable model: SGLang's K3 runs its own KDA, AttnRes
and MXFP4 kernels on a GPU, and our CPU ops in its seams elsewhere (k3_sglang/sglang_cpu/).
Backends: "triton" (the kernels beside mla/naive.py; default on CUDA) and "torch" (the reference-equivalent path,
default elsewhere). Pass backend= to force one; the Triton ones also run on CPU under TRITON_INTERPRET=1 (tests).
Triton modules are imported on first use, so a CPU process never needs a GPU toolchain.

    from k3_sglang.kernels import dispatch
    o_lat, lse = dispatch.mla_dcp(q_lat, kv_cache, block_table, q_indptr, kv_lens, causal_seqs, page_size, cp_world,
                                  cp_rank, v_dim, scale)
"""
from __future__ import annotations

import importlib
from typing import Callable

import torch

BACKENDS = ("torch", "triton")


class Registry:
    """op name -> backend -> "module:function", resolved lazily; errors list what is supported."""

    def __init__(self) -> None:
        self._ops: dict[str, dict[str, str]] = {}
        self._cache: dict[tuple[str, str], Callable] = {}

    def register(self, op: str, backend: str, target: str) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown kernel backend {backend!r}; supported: {', '.join(BACKENDS)}")
        self._ops.setdefault(op, {})[backend] = target

    def ops(self) -> tuple[str, ...]:
        return tuple(sorted(self._ops))

    def backends(self, op: str) -> tuple[str, ...]:
        if op not in self._ops:
            raise ValueError(f"unknown kernel op {op!r}; supported: {', '.join(self.ops())}")
        return tuple(b for b in BACKENDS if b in self._ops[op])

    def get(self, op: str, backend: str) -> Callable:
        supported = self.backends(op)
        if backend not in supported:
            raise ValueError(f"kernel op {op!r} has no backend {backend!r}; supported: {', '.join(supported)}")
        key = (op, backend)
        if key not in self._cache:
            module, name = self._ops[op][backend].split(":")
            self._cache[key] = getattr(importlib.import_module(module), name)
        return self._cache[key]


REGISTRY = Registry()
_P = "k3_sglang.kernels."
for _op, _torch, _triton in [
    ("mla_dcp", "mla.dcp_torch:mla_dcp_attention_torch", "mla.dcp_triton:mla_dcp_attention_triton"),
    ("merge_attention_states", "mla.naive:merge_attention_states", "mla.decode:merge_attention_states_triton"),
]:
    REGISTRY.register(_op, "torch", _P + _torch)
    REGISTRY.register(_op, "triton", _P + _triton)


def resolve(op: str, device: torch.device, backend: str | None = None) -> Callable:
    """The implementation of op for tensors on device: backend if given, else triton on CUDA when it exists."""
    if backend is None:
        backend = "triton" if device.type == "cuda" and "triton" in REGISTRY.backends(op) else "torch"
    return REGISTRY.get(op, backend)


def mla_dcp(q_lat, kv_cache, block_table, q_indptr, kv_lens, causal_seqs, page_size, cp_world, cp_rank, v_dim, scale,
            *, q_len=None, backend=None):
    """One DCP rank's absorbed MLA over its stripe of a paged cache (kernels/mla/naive.mla_dcp_attention_paged):
    (o_lat [T, Hh, v_dim], lse [T, Hh] fp32 natural log). q_len: every request holds q_len queries (no host sync)."""
    return resolve("mla_dcp", q_lat.device, backend)(q_lat, kv_cache, block_table, q_indptr, kv_lens, causal_seqs,
                                                      page_size, cp_world, cp_rank, v_dim, scale, q_len=q_len)


def merge_attention_states(outs, lses, *, backend=None):
    """Exact merge of partials [P, B, H, D] / [P, B, H]: (o [B, H, D], lse [B, H])."""
    return resolve("merge_attention_states", outs.device, backend)(outs, lses)
