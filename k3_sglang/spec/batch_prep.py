"""Turn a K3_CSV decode round's ScheduleBatch into the forward it runs: a plain decode or a chain verify.

Both mutate the batch in place (SGLang's scheduler snapshots it around the forward and restores it afterwards) and
are shared by the worker (spec/worker.py: one server, or the last pipeline stage) and by the earlier pipeline
stages, which run the same forward on their own layers (spec/pp_hooks.py). SGLang's speculative decode
preparation has already reserved each request's KV slots past its committed length in req_to_token.
"""
from __future__ import annotations

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode

from k3_sglang.spec.info import K3VerifyInput, VerifyLayout


def to_plain_decode(batch, req_to_token: torch.Tensor, device) -> None:
    """One token per request (its last committed token, req.output_ids[-1]) at its committed position:
    input_ids [B], out_cache_loc [B] = the reserved slot at seq_lens, seq_lens advanced by one."""
    seq, seq_cpu = batch.seq_lens, batch.seq_lens_cpu
    batch.forward_mode = ForwardMode.DECODE
    batch.input_ids = torch.tensor([req.output_ids[-1] for req in batch.reqs], dtype=torch.int64, device=device)
    batch.out_cache_loc = req_to_token[batch.req_pool_indices.long(), seq.long()].to(torch.int64)
    batch.seq_lens = seq + 1
    batch.seq_lens_cpu = seq_cpu + 1
    batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
    batch.spec_info = None


def to_verify(batch, req_to_token: torch.Tensor, lens: list[int], drafts: list[list[int]], width: int,
              device) -> K3VerifyInput:
    """A TARGET_VERIFY forward over the packed chains: request b verifies its root and drafts[b][:lens[b] - 1].

    Sets input_ids [T] (T = sum(lens)), out_cache_loc [T] (the reserved slots at seq_len + j), spec_info (the
    returned K3VerifyInput, where the KDA layers leave their records) and forward_mode; seq_lens stay committed."""
    seq_cpu = [int(n) for n in batch.seq_lens_cpu.tolist()]
    layout = VerifyLayout(tuple(lens), tuple(seq_cpu))
    tokens: list[int] = []
    for req, n, d in zip(batch.reqs, lens, drafts):
        tokens.append(int(req.output_ids[-1]))
        tokens.extend(d[: n - 1])
    spec = K3VerifyInput(layout, width, device)
    rows = batch.req_pool_indices.long()[:, None].expand(-1, layout.l_max).flatten()[spec.packed_index]
    batch.forward_mode = ForwardMode.TARGET_VERIFY
    batch.input_ids = torch.tensor(tokens, dtype=torch.int64, device=device)
    batch.out_cache_loc = req_to_token[rows, spec.positions].to(torch.int64)
    batch.spec_info = spec
    return spec
