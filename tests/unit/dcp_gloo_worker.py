"""Worker of test_dcp_gloo.py: one rank of a c-rank gloo group runs the DCP attention of a random batch over its
stripe of the keys through `kernels.dispatch`, merges with both backends, and compares with the float64 full
attention. Spawned by torch.multiprocessing (a module importable by the child)."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from k3_sglang.kernels import dispatch
from k3_sglang.kernels.mla.extend_layout import ExtendLayout
from k3_sglang.kernels.mla.naive import mla_decode_absorbed, mla_extend_absorbed
from k3_sglang.parallel.dcp import local_key_count, merge
from k3_sglang.parallel.groups import TorchGroup

HEADS_PER_RANK, WIDTH, V_DIM, SCALE = 2, 24, 16, 0.3


def _case(seed: int, c: int, prefix: list[int], new: list[int]):
    """Shared random inputs (same on every rank): q [T, c H_l, L] and, per request, its rows [len, L] in position
    order."""
    gen = torch.Generator().manual_seed(seed)
    t = sum(new)
    q = torch.randn(t, c * HEADS_PER_RANK, WIDTH, generator=gen, dtype=torch.float64)
    rows = [torch.randn(p + n, WIDTH, generator=gen, dtype=torch.float64) for p, n in zip(prefix, new)]
    return q, rows


def _stripe(rows: list[torch.Tensor], c: int, r: int, poison: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """This rank's pool (its positions r, r + c, ... of every request, after `poison` NaN rows nobody may read),
    their row ids and kv_indptr."""
    mine = [x[r::c] for x in rows]
    assert [m.shape[0] for m in mine] == [local_key_count(x.shape[0], c, r) for x in rows]
    cache = torch.cat([torch.full((poison, WIDTH), float("nan"), dtype=torch.float64), *mine])
    indptr = [0]
    for m in mine:
        indptr.append(indptr[-1] + m.shape[0])
    return cache, torch.arange(poison, cache.shape[0]), indptr


def _check(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert not torch.isnan(got).any(), f"{what}: NaN"
    err = (got.double() - want).norm() / want.norm()
    assert err < 1e-5, f"{what}: relative error {err:.2e}"


def run(rank: int, c: int, port: int, seed: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=c)
    try:
        group = TorchGroup()
        mine = slice(rank * HEADS_PER_RANK, (rank + 1) * HEADS_PER_RANK)
        # decode: one query per request over all its keys; seq lens below c leave some ranks empty
        lens = [1, c - 1 if c > 1 else 1, 37, 5 * c + 3]
        q, rows = _case(seed, c, [n - 1 for n in lens], [1] * len(lens))
        cache, idx, indptr = _stripe(rows, c, rank, poison=3)
        full = torch.cat(rows)
        full_ptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
        want, _ = mla_decode_absorbed(q, full, torch.arange(full.shape[0]), full_ptr, V_DIM, SCALE)
        o, lse = dispatch.mla_decode(q.float(), cache.float(), idx, torch.tensor(indptr), V_DIM, SCALE)
        for backend in ("ag_rs", "a2a"):
            _check(merge(o, lse, group, backend), want[:, mine], f"decode c={c} rank {rank} {backend}")
        # extend: chunks over cached prefixes (causal, lower-right) with strided keys
        # (a one-token prompt and a short one leave the higher ranks without keys for some requests)
        prefix, new = [0, 0, 9, 0, 2 * c + 1], [1, 5, 7, c - 1 if c > 1 else 1, 3 * c]
        for prefix, new in (([0], [1]), (prefix, new)):  # alone, a one-token prompt has no key above rank 0
            _extend(seed, c, rank, group, mine, prefix, new)
    finally:
        dist.destroy_process_group()


def _extend(seed: int, c: int, rank: int, group: TorchGroup, mine: slice, prefix: list[int], new: list[int]) -> None:
    """Chunked extend of `new` tokens over cached `prefix` tokens per request: merged == float64 full."""
    q, rows = _case(seed + 1, c, prefix, new)
    cache, idx, indptr = _stripe(rows, c, rank, poison=2)
    q_ptr = [0, *torch.tensor(new).cumsum(0).tolist()]
    full = torch.cat(rows)
    full_ptr = [0, *torch.tensor([p + n for p, n in zip(prefix, new)]).cumsum(0).tolist()]
    want, _ = mla_extend_absorbed(q, full, torch.arange(full.shape[0]), q_ptr, full_ptr, prefix, V_DIM, SCALE)
    layout = ExtendLayout(tuple(q_ptr), tuple(indptr), tuple(prefix), kv_offset=rank, kv_stride=c)
    o, lse = dispatch.mla_extend(q.float(), cache.float(), idx, layout, V_DIM, SCALE)
    for backend in ("ag_rs", "a2a"):
        _check(merge(o, lse, group, backend), want[:, mine], f"extend c={c} rank {rank} {backend} {new}")
