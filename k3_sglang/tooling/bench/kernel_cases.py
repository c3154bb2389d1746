"""GPU benchmark cases for `k3 bench kernels` (k3_sglang/tooling/bench/kernels.py): K3-full shapes, a reference check and
a timing per case. Every case returns rows (name, shape, median ms, bytes moved, flops, check)."""
from __future__ import annotations

import torch
import triton

from k3_sglang.tooling.bench.kernels import MLA_HEADS, MLA_LAT, MLA_V, median_ms, n_sets
from k3_sglang.kernels import dispatch
from k3_sglang.kernels.mla.dcp_triton import mla_dcp_attention_triton
from k3_sglang.kernels.mla.decode import default_num_splits

CUDA = "cuda"
BF16 = torch.bfloat16
TOL = 5e-3
TOL_BF16_OUT = 1e-2  # outputs stored in bf16: one bf16 ulp is 2^-8 = 3.9e-3 relative
# sizes beyond the K3 model constants (module globals, so a CPU dry run can shrink them)
MERGE_SHAPE = (8, 64, MLA_HEADS, MLA_V)  # partials P, batch, heads, value dim
MLA_CHECK = (2, 1000)


def _rel(ref: torch.Tensor, out: torch.Tensor) -> float:
    ref, out = ref.double(), out.double()
    if not bool(torch.isfinite(out).all()):
        return float("nan")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _check(*errs: float, tol: float = TOL) -> str:
    worst = max(errs)
    return f"ok {worst:.1e}" if worst <= tol else f"FAIL {worst:.1e}"


def _two(out_err: float, fp32_err: float) -> str:
    """A bf16 output (TOL_BF16_OUT) and an fp32 quantity such as a state or an LSE (TOL)."""
    ok = out_err <= TOL_BF16_OUT and fp32_err <= TOL
    return f"{'ok' if ok else 'FAIL'} {out_err:.1e}/{fp32_err:.1e}"


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy rate, counting read + write bytes."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=CUDA).uniform_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda i: dst.copy_(src), 20, 5)
    return 2 * nbytes / (ms * 1e-3)


def matmul_tflops(n: int = 8192) -> float:
    a, b = torch.randn(n, n, dtype=BF16, device=CUDA), torch.randn(n, n, dtype=BF16, device=CUDA)
    ms = median_ms(lambda i: a @ b, 20, 5)
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def _mla_case(B: int, ctx: int, sets: int, page: int = 64):
    """A decode batch of B requests of ctx keys each in a paged bf16 pool (random pages), one table per set."""
    pages = (ctx + page - 1) // page
    pool = torch.randn(B * pages * page * sets, MLA_LAT, dtype=BF16, device=CUDA)
    q = torch.randn(B, MLA_HEADS, MLA_LAT, dtype=BF16, device=CUDA)
    tables = [(torch.randperm(B * pages, device=CUDA) + s * B * pages).view(B, pages).to(torch.int32)
              for s in range(sets)]
    lens = torch.full((B,), ctx, dtype=torch.int32, device=CUDA)
    return pool, q, tables, lens, page


def bench_mla(args):
    """The k3_dcp_mla kernel at decode (one rank, c = 1: every key of the request), checked against the torch path."""
    rows = []
    scale = 192 ** -0.5
    pool, q, tables, lens, page = _mla_case(*MLA_CHECK, 1)
    q_ptr = torch.arange(MLA_CHECK[0] + 1, dtype=torch.int32, device=CUDA)
    o_ref, lse_ref = dispatch.mla_dcp(q.double(), pool.double(), tables[0], q_ptr, lens, lens, page, 1, 0, MLA_V,
                                      scale, backend="torch")
    o, lse = dispatch.mla_dcp(q, pool, tables[0], q_ptr, lens, lens, page, 1, 0, MLA_V, scale, q_len=1,
                              backend="triton")
    check = _two(_rel(o_ref, o), _rel(lse_ref, lse))
    for B in [b for b in args.batches if b <= 32]:
        ctx = args.context
        sets = n_sets(B * ctx * MLA_LAT * 2)
        pool, q, tables, lens, page = _mla_case(B, ctx, sets)
        q_ptr = torch.arange(B + 1, dtype=torch.int32, device=CUDA)
        splits = default_num_splits(B, triton.cdiv(MLA_HEADS, 32), ctx, torch.device(CUDA))
        ms = median_ms(lambda i: mla_dcp_attention_triton(q, pool, tables[i % sets], q_ptr, lens, lens, page, 1, 0,
                                                          MLA_V, scale, q_len=1, num_splits=splits),
                       args.iters, args.warmup)
        nbytes = B * ctx * (MLA_LAT * 2) + B * MLA_HEADS * (MLA_LAT + MLA_V) * 2
        flops = 2 * B * MLA_HEADS * ctx * (MLA_LAT + MLA_V)
        rows.append(("mla_decode", f"B={B} ctx={ctx} Hh={MLA_HEADS} P={splits}", ms, nbytes, flops, check))
        del pool
    return rows


def bench_merge(args):
    P, B, Hh, D = MERGE_SHAPE
    outs = torch.randn(P, B, Hh, D, device=CUDA)
    lses = torch.randn(P, B, Hh, device=CUDA)
    lses[1] = float("-inf")
    o_ref, lse_ref = dispatch.merge_attention_states(outs.double(), lses.double(), backend="torch")
    o, lse = dispatch.merge_attention_states(outs, lses, backend="triton")
    check = _check(_rel(o_ref, o), _rel(lse_ref, lse))
    sets = n_sets(outs.numel() * 4)
    pairs = [(torch.randn_like(outs), lses.clone()) for _ in range(sets)]
    ms = median_ms(lambda i: dispatch.merge_attention_states(*pairs[i % sets], backend="triton"), args.iters, args.warmup)
    return [("merge_attention_states", f"P={P} B={B} H={Hh} D={D}", ms, (P + 1) * B * Hh * (D + 1) * 4, 0.0, check)]
