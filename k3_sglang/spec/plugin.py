"""SGLang general plugin (`sglang.srt.plugins` entry point `k3_spec`): registers the K3_CSV speculative algorithm.

Registration runs in every SGLang process (SGLang calls `load_plugins()` in the launcher, each scheduler and the
detokenizer), so `--speculative-algorithm K3_CSV` resolves everywhere through SGLang's own registry
(`SpeculativeAlgorithm.register`); no SGLang file is edited. On our CPU platform one more hook is installed:
`mem_cache.allocation.assign_req_to_token_pool_func`, which every speculative decode step calls to write the
reserved KV slots into req_to_token, launches a Triton kernel unless SGLang's own Xeon engine is on; the
replacement is the same gather/scatter in torch. The pipeline hooks of spec/pp_hooks.py (K3_CSV inside one
`--pp-size N` server) are installed there too; they are inert for every other algorithm.
"""
from __future__ import annotations

import torch

from k3_sglang.spec.settings import ALGORITHM

ASSIGN_TARGET = "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func"


def assign_req_to_token_pool_torch(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                   start_offset: torch.Tensor, end_offset: torch.Tensor,
                                   out_cache_loc: torch.Tensor, batch_size: int) -> None:
    """req_to_token[req_pool_indices[b], start[b]:end[b]] = the b-th run of out_cache_loc (runs packed in order).

    req_pool_indices [B], start/end_offset [B] int, out_cache_loc [sum(end - start)]; req_to_token [R, ctx]."""
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


def register() -> None:
    """Entry point: register K3_CSV once per process (a second call is a no-op) and, on our CPU platform with the
    portable model, the torch req_to_token writer and the pipeline hooks."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from k3_sglang.spec.algo import K3SpecAlgo, validate_server_args

    if get_spec(ALGORITHM) is None:
        SpeculativeAlgorithm.register(ALGORITHM, supports_overlap=False, validate_server_args=validate_server_args,
                                      spec_class=K3SpecAlgo)(_factory)
    from k3_sglang.platform_hooks import active

    if active():
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        from k3_sglang.spec import pp_hooks

        HookRegistry.register(ASSIGN_TARGET, assign_req_to_token_pool_torch, HookType.REPLACE)
        for target, hook, kind in pp_hooks.installed_hooks():
            HookRegistry.register(target, hook, HookType[kind])
