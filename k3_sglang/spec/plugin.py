"""SGLang general plugin (`sglang.srt.plugins` entry point `k3_spec`): registers the K3_CSV speculative algorithm.

Registration runs in every SGLang process (SGLang calls `load_plugins()` in the launcher, each scheduler and the
detokenizer), so `--speculative-algorithm K3_CSV` resolves everywhere through SGLang's own registry
(`SpeculativeAlgorithm.register`); no SGLang file is edited. On our CPU platform (either K3 model) two more hooks
carry SGLang's speculative path, which is Triton-only outside SGLang's Xeon engine: the req_to_token writer every
speculative decode step calls (`mem_cache.allocation.assign_req_to_token_pool_func`, replaced by the same
gather/scatter in torch) and the scatter of SGLang's commit after verification (spec/contract.py). On every platform
where K3 is in play (`deployment.current()`: `k3 serve` or the k3_cpu platform; never plain SGLang) the plain
path's hook (spec/plain_path.py), registered once per process, lets a step K3_CSV runs as plain decode take
SGLang's non-speculative path. The pipeline hooks of spec/pp_hooks.py (K3_CSV inside one `--pp-size N` server) are installed there too; every hook is inert
for every other algorithm or device.
"""
from __future__ import annotations

import torch

from k3_sglang.sglang_guard import sglang_plugin
from k3_sglang.spec.settings import ALGORITHM

ASSIGN_TARGET = "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func"


LOOP_MAX_BATCH = 4  # up to this many requests a slice per request is cheaper than the batched scatter


def assign_req_to_token_pool_torch(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                   start_offset: torch.Tensor, end_offset: torch.Tensor,
                                   out_cache_loc: torch.Tensor, batch_size: int) -> None:
    """req_to_token[req_pool_indices[b], start[b]:end[b]] = the b-th run of out_cache_loc (runs packed in order).

    req_pool_indices [B], start/end_offset [B] int, out_cache_loc [>= sum(end - start)]; req_to_token [R, ctx].
    Every speculative decode step writes one run per request: a slice each for a few requests, one scatter for more
    (a fixed handful of tensor ops instead of one per request; docs/spec.md, "What a K3_CSV server costs when it
    decides plain decode", has what this writer still costs per step)."""
    if batch_size <= LOOP_MAX_BATCH:
        _assign_per_request(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, batch_size)
        return
    start = start_offset[:batch_size].to(torch.int64)
    lens = (end_offset[:batch_size].to(torch.int64) - start).clamp_min(0)
    total = int(lens.sum())
    if total == 0:
        return
    rows = torch.repeat_interleave(req_pool_indices[:batch_size].to(torch.int64), lens, output_size=total)
    # column of packed element i of run b = start[b] + (i - first packed index of run b)
    shift = torch.repeat_interleave(start - (torch.cumsum(lens, 0) - lens), lens, output_size=total)
    cols = torch.arange(total, device=shift.device) + shift
    req_to_token[rows, cols] = out_cache_loc[:total].to(req_to_token.dtype)


def _assign_per_request(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                        batch_size: int) -> None:
    starts, ends = start_offset[:batch_size].tolist(), end_offset[:batch_size].tolist()
    rows = req_pool_indices[:batch_size].tolist()
    at = 0
    for row, lo, hi in zip(rows, starts, ends):
        n = hi - lo
        if n > 0:
            req_to_token[row, lo:hi] = out_cache_loc[at: at + n].to(req_to_token.dtype)
            at += n


def _factory(server_args):
    from k3_sglang.spec.worker import K3SpecWorker

    return K3SpecWorker


def installed_hooks():
    """(target, hook, hook type name) of every hook `register` installs on the k3_cpu platform."""
    from k3_sglang.spec import contract, pp_hooks

    return [(ASSIGN_TARGET, assign_req_to_token_pool_torch, "REPLACE"),
            (contract.SCATTER_TARGET, contract.scatter_after_verify, "AROUND"),
            *pp_hooks.installed_hooks()]


_plain_path_registered = False  # once per process: SGLang would wrap the target again on a second registration


@sglang_plugin
def register() -> None:
    """Entry point: register K3_CSV once per process (a second call is a no-op) and, on our CPU platform (either K3
    model), the hooks of `installed_hooks`."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from k3_sglang.spec.algo import K3SpecAlgo, validate_server_args

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from k3_sglang.deployment import current
    from k3_sglang.spec import plain_path

    if get_spec(ALGORITHM) is None:
        SpeculativeAlgorithm.register(ALGORITHM, supports_overlap=False, validate_server_args=validate_server_args,
                                      spec_class=K3SpecAlgo)(_factory)
    global _plain_path_registered
    if not _plain_path_registered and current() is not None:  # K3 in play, any platform; inert until a K3_CSV
        _plain_path_registered = True                           # worker owns it (never in plain SGLang)
        for target, hook, kind in plain_path.installed_hooks():
            HookRegistry.register(target, hook, HookType[kind])
    from k3_sglang.platform_hooks import on_k3_cpu

    if on_k3_cpu():
        for target, hook, kind in installed_hooks():
            HookRegistry.register(target, hook, HookType[kind])
