"""Our kernel ops: one name per op, a backend per device.

A server calls `mla_dcp` (the k3_dcp_mla and k3_cpu_mla MLA backends of SGLang's K3: one DCP rank's stripe of the
paged MLA cache; prefill chunks, verify chains and decode). The other ops (KDA decode / verify / prefill, AttnRes
reads, MXFP4) were the retired portable model's; they remain here for their kernel tests and GPU benchmark only.
Backends: "triton" (the kernels beside each naive.py; default on CUDA) and "torch" (the reference-equivalent path,
default elsewhere; batched over requests where the model needs it). Pass backend= to force one; the Triton ones
also run on CPU under TRITON_INTERPRET=1 (tests). Triton modules are imported on first use, so a CPU process never
needs a GPU toolchain. Padding requests (slot or index -1, as SGLang's CUDA-graph decode pads) are skipped by the
KDA ops: output 0, no pool row touched.

    from k3_sglang.kernels import dispatch
    o = dispatch.kda_decode(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, slots)
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
    ("kda_decode", "kda.naive_decode:kda_decode_torch", "kda.fused_recurrent:kda_fused_decode"),
    ("kda_verify", "kda.naive_decode:kda_verify_torch", "kda.fused_recurrent:kda_fused_verify"),
    ("kda_prefill", "kda.naive_decode:kda_prefill_torch", "kda.chunk:kda_chunk_prefill"),
    ("mla_dcp", "mla.dcp_torch:mla_dcp_attention_torch", "mla.dcp_triton:mla_dcp_attention_triton"),
    ("merge_attention_states", "mla.naive:merge_attention_states", "mla.decode:merge_attention_states_triton"),
    ("attn_res_read", "attn_res.naive:attn_res_read", "attn_res.read:attn_res_read_triton"),
    ("dequant_mxfp4", "mxfp4.naive:dequant_mxfp4", "mxfp4.dequant:dequant_mxfp4_triton"),
    ("mxfp4_grouped_matmul", "mxfp4.naive:mxfp4_grouped_matmul", "mxfp4.grouped_matmul:mxfp4_grouped_matmul_triton"),
]:
    REGISTRY.register(_op, "torch", _P + _torch)
    if _triton:
        REGISTRY.register(_op, "triton", _P + _triton)


def resolve(op: str, device: torch.device, backend: str | None = None) -> Callable:
    """The implementation of op for tensors on device: backend if given, else triton on CUDA when it exists."""
    if backend is None:
        backend = "triton" if device.type == "cuda" and "triton" in REGISTRY.backends(op) else "torch"
    return REGISTRY.get(op, backend)


def kda_decode(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, opts=None, *, backend=None):
    """Fused KDA decode of n tokens per request (see kda/decode_common.py). Returns o [B, n, H*V]."""
    fn = resolve("kda_decode", mixed_qkv.device, backend)
    return fn(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, *_opts(opts))


def kda_verify(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, scratch, opts=None, *,
               backend=None):
    """Speculative verify, pools untouched: the state and conv window after every token go to scratch
    (kda/decode_common.py VerifyScratch, SGLang's per-draft scratch). Returns o [B, n, H*V]."""
    fn = resolve("kda_verify", mixed_qkv.device, backend)
    return fn(mixed_qkv, f, b, g_out, weights, conv_pool, state_pool, state_indices, scratch, *_opts(opts))


def kda_prefill(mixed_qkv, f, b, g_out, cu_seqlens, weights, conv_pool, state_pool, state_indices,
                has_initial_state=None, opts=None, *, backend=None):
    """Variable-length chunked KDA prefill from/into the pools. Returns o [T, H*V]."""
    fn = resolve("kda_prefill", mixed_qkv.device, backend)
    return fn(mixed_qkv, f, b, g_out, cu_seqlens, weights, conv_pool, state_pool, state_indices, has_initial_state,
              *_opts(opts))


def mla_dcp(q_lat, kv_cache, block_table, q_indptr, kv_lens, causal_seqs, page_size, cp_world, cp_rank, v_dim, scale,
            *, q_len=None, backend=None):
    """One DCP rank's absorbed MLA over its stripe of a paged cache (kernels/mla/naive.mla_dcp_attention_paged):
    (o_lat [T, Hh, v_dim], lse [T, Hh] fp32 natural log). q_len: every request holds q_len queries (no host sync)."""
    return resolve("mla_dcp", q_lat.device, backend)(q_lat, kv_cache, block_table, q_indptr, kv_lens, causal_seqs,
                                                      page_size, cp_world, cp_rank, v_dim, scale, q_len=q_len)


def merge_attention_states(outs, lses, *, backend=None):
    """Exact merge of partials [P, B, H, D] / [P, B, H]: (o [B, H, D], lse [B, H])."""
    return resolve("merge_attention_states", outs.device, backend)(outs, lses)


def attn_res_read(candidates, weight, eps, *, backend=None):
    """AttnRes read over candidates [N, T, D] with the fused weight [D]: [T, D]."""
    return resolve("attn_res_read", candidates.device, backend)(candidates, weight, eps)


def dequant_mxfp4(packed, scales, dtype=torch.bfloat16, *, backend=None):
    """MXFP4 packed [N, K/2] + E8M0 scales [N, K/32] -> [N, K] in dtype."""
    return resolve("dequant_mxfp4", packed.device, backend)(packed, scales, dtype)


def mxfp4_grouped_matmul(x, expert_offsets, packed, scales, *, backend=None):
    """y [M, N] = per-expert x_e @ dequant(W_e)^T for rows grouped by expert (MXFP4 weights [E, N, Kin/2])."""
    return resolve("mxfp4_grouped_matmul", x.device, backend)(x, expert_offsets, packed, scales)


def _opts(opts):
    return () if opts is None else (opts,)
