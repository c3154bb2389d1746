"""Worker of test_dcp_gloo.py: one rank of a c-rank gloo group, on the k3_cpu platform as a server rank is. It
attends its stripe of a random batch through the k3_dcp_mla kernel (`dispatch.mla_dcp` over a paged pool in SGLang's
DCP layout) and merges the ranks' partials through SGLang's own merges (`cp_lse_ag_out_rs_mla`, `dcp_a2a_lse_reduce`)
over a real SGLang GroupCoordinator, with our CPU hooks installed as the plugins install them; the merged heads must
equal the float64 full attention. Spawned by torch.multiprocessing (a module importable by the child)."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

HEADS_PER_RANK, WIDTH, V_DIM, SCALE, PAGE = 2, 24, 16, 0.3, 2


def _coordinator(c: int, rank: int):
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    return GroupCoordinator([list(range(c))], rank, "gloo", use_pynccl=False, use_mscclpp=False,
                            use_custom_allreduce=False, use_torch_symm_mem_all_reduce=False,
                            use_hpu_communicator=False, use_xpu_communicator=False, group_name="dcp_test")


def _install_cpu_hooks() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from k3_sglang.dcp_mla import cpu_kernels

    for target, hook, kind in cpu_kernels.COLLECTIVE_HOOKS + cpu_kernels.MERGE_HOOKS:  # as sglang_cpu/hooks.py does
        HookRegistry.register(target, hook, HookType[kind])
    HookRegistry.apply_hooks()


def _case(seed: int, c: int, prefix: list[int], new: list[int]):
    """Shared random inputs (same on every rank): q [T, c H_l, L] and, per request, its rows [len, L]."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(new), c * HEADS_PER_RANK, WIDTH, generator=gen, dtype=torch.float64)
    rows = [torch.randn(p + n, WIDTH, generator=gen, dtype=torch.float64) for p, n in zip(prefix, new)]
    return q, rows


def _rank_pool(rows: list[torch.Tensor], c: int, r: int):
    """This rank's paged pool in SGLang's layout (rank-local key i of a request in page i // PAGE of its own pages,
    after a NaN page nobody may read), its block table [B, M] and key counts."""
    from k3_sglang.kernels.mla.dcp_layout import local_key_counts

    lens = torch.tensor([x.shape[0] for x in rows])
    kv_lens = local_key_counts(lens, c, r)
    pages = [(int(n) + PAGE - 1) // PAGE for n in kv_lens]
    pool = torch.full(((1 + sum(pages)) * PAGE, WIDTH), float("nan"), dtype=torch.float64)
    table = torch.zeros(len(rows), max(pages + [1]), dtype=torch.int32)  # unused entries: the NaN page 0
    nxt = 1
    for b, x in enumerate(rows):
        mine = x[r::c]
        for j in range(pages[b]):
            table[b, j] = nxt
            chunk = mine[j * PAGE:(j + 1) * PAGE]
            pool[nxt * PAGE: nxt * PAGE + chunk.shape[0]] = chunk
            nxt += 1
    return pool, table, kv_lens


def _check(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert not torch.isnan(got).any(), f"{what}: NaN"
    err = (got.double() - want).norm() / want.norm()
    assert err < 1e-5, f"{what}: relative error {err:.2e}"


def _attend_and_merge(group, c: int, rank: int, q, rows, q_lens: list[int], what: str) -> None:
    from sglang.srt.layers.dcp import cp_lse_ag_out_rs_mla, dcp_a2a_lse_reduce

    from k3_sglang.kernels import dispatch
    from k3_sglang.kernels.mla.naive import mla_extend_absorbed

    mine = slice(rank * HEADS_PER_RANK, (rank + 1) * HEADS_PER_RANK)
    full = torch.cat(rows)
    full_ptr = [0, *torch.tensor([x.shape[0] for x in rows]).cumsum(0).tolist()]
    q_ptr = [0, *torch.tensor(q_lens).cumsum(0).tolist()]
    q_start = [x.shape[0] - n for x, n in zip(rows, q_lens)]
    want, _ = mla_extend_absorbed(q, full, torch.arange(full.shape[0]), q_ptr, full_ptr, q_start, V_DIM, SCALE)
    pool, table, kv_lens = _rank_pool(rows, c, rank)
    causal = torch.tensor([x.shape[0] for x in rows], dtype=torch.int32)
    o, lse = dispatch.mla_dcp(q.float(), pool.float(), table, torch.tensor(q_ptr, dtype=torch.int32), kv_lens,
                              causal, PAGE, c, rank, V_DIM, SCALE)
    merged = cp_lse_ag_out_rs_mla(o, lse, group, is_lse_base_on_e=True).transpose(0, 1)
    _check(merged, want[:, mine], f"{what} c={c} rank {rank} ag_rs")
    merged = dcp_a2a_lse_reduce(o.contiguous(), lse.contiguous(), group, is_lse_base_on_e=True)
    _check(merged, want[:, mine], f"{what} c={c} rank {rank} a2a")
    log2_lse = lse / torch.log(torch.tensor(2.0))  # the base-2 LSE k3_dcp_mla hands SGLang's forward_mla
    merged = cp_lse_ag_out_rs_mla(o, log2_lse, group, is_lse_base_on_e=False).transpose(0, 1)
    _check(merged, want[:, mine], f"{what} c={c} rank {rank} ag_rs base 2")


def run(rank: int, c: int, port: int, seed: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SGLANG_PLATFORM="k3_cpu")
    dist.init_process_group("gloo", rank=rank, world_size=c)
    try:
        _install_cpu_hooks()
        group = _coordinator(c, rank)
        # decode: one query per request over all its keys; lengths below c leave some ranks without a key
        lens = [1, c - 1 if c > 1 else 1, 37, 5 * c + 3]
        q, rows = _case(seed, c, [n - 1 for n in lens], [1] * len(lens))
        _attend_and_merge(group, c, rank, q, rows, [1] * len(lens), "decode")
        # verify / extend: several queries per request over a cached prefix (causal, lower-right)
        prefix, new = [0, 0, 9, 0, 2 * c + 1], [1, 5, 7, c - 1 if c > 1 else 1, 3 * c]
        q, rows = _case(seed + 1, c, prefix, new)
        _attend_and_merge(group, c, rank, q, rows, new, "extend")
    finally:
        dist.destroy_process_group()
