"""GPU benchmark cases for `k3 bench kernels` (k3_sglang/tooling/bench/kernels.py): K3-full shapes, a reference check and
a timing per case. Every case returns rows (name, shape, median ms, bytes moved, flops, check)."""
from __future__ import annotations

import torch
import triton

from k3_sglang.tooling.bench.kernels import BANK, HIDDEN, MLA_HEADS, MLA_LAT, MLA_V, H, K, V, W, median_ms, n_sets
from k3_sglang.kernels import dispatch
from k3_sglang.kernels.kda.decode_common import KDAWeights, VerifyScratch
from k3_sglang.kernels.mla.dcp_triton import mla_dcp_attention_triton
from k3_sglang.kernels.mla.decode import default_num_splits

CUDA = "cuda"
BF16 = torch.bfloat16
TOL = 5e-3
TOL_BF16_OUT = 1e-2  # outputs stored in bf16: one bf16 ulp is 2^-8 = 3.9e-3 relative
# sizes beyond the K3 model constants (module globals, so a CPU dry run can shrink them)
MX_SHAPE = (3072, 3584)  # one expert's w1 (gate): [3072 out, 3584 in]
MERGE_SHAPE = (8, 64, MLA_HEADS, MLA_V)  # partials P, batch, heads, value dim
PREFILL_CHECK = [300, 1, 90]
PREFILL_CASES = ([4096], [512] * 8)
ATTN_RES_PREFILL_T = 4096
MLA_CHECK = (2, 1000)
VERIFY_BATCH, VERIFY_DRAFTS = 8, 4


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


def _kda_weights() -> KDAWeights:
    D = 2 * H * K + H * V
    return KDAWeights(torch.randn(D, W, device=CUDA) * 0.5, torch.randn(128, device=CUDA) * 0.5,
                      torch.randn(H * K, device=CUDA), torch.rand(V, device=CUDA) + 0.5)


def _kda_inputs(B: int, n: int):
    D = 2 * H * K + H * V
    return (torch.randn(B, n, D, dtype=BF16, device=CUDA), torch.randn(B, n, H * K, dtype=BF16, device=CUDA),
            torch.randn(B, n, H, dtype=BF16, device=CUDA), torch.randn(B, n, H * V, dtype=BF16, device=CUDA))


def _kda_pools(slots: int):
    D = 2 * H * K + H * V
    return (torch.randn(slots, W - 1, D, dtype=BF16, device=CUDA),
            torch.randn(slots, H, K, V, device=CUDA) * 0.1)


def _kda_bytes(B: int, n: int, state_rw: int) -> float:
    D = 2 * H * K + H * V
    state = state_rw * B * H * K * V * 4
    window = 2 * B * (W - 1) * D * 2
    io = B * n * (D + H * K + H + 2 * H * V) * 2
    return state + window + io


def _check_kda_decode(weights) -> str:
    B = 2
    inputs = _kda_inputs(B, 1)
    conv, state = _kda_pools(4)
    slots = torch.tensor([2, 0], device=CUDA)
    conv_r, state_r = conv.float(), state.double()
    o_ref = dispatch.kda_decode(*(x.float() for x in inputs), weights, conv_r, state_r, slots, backend="torch")
    o = dispatch.kda_decode(*inputs, weights, conv, state, slots, backend="triton")
    window_ok = torch.equal(conv, conv_r.to(conv.dtype))
    return _two(_rel(o_ref, o), _rel(state_r[slots], state[slots])) + ("" if window_ok else " window FAIL")


def bench_kda(args):
    weights = _kda_weights()
    rows = []
    check = _check_kda_decode(weights)
    for B in args.batches:
        sets = n_sets(B * H * K * V * 4)
        conv, state = _kda_pools(B * sets)
        inputs = _kda_inputs(B, 1)
        slot_sets = [torch.arange(s * B, (s + 1) * B, device=CUDA) for s in range(sets)]
        ms = median_ms(lambda i: dispatch.kda_decode(*inputs, weights, conv, state, slot_sets[i % sets],
                                                     backend="triton"), args.iters, args.warmup)
        flops = B * H * (6 * K * V + 40 * (K + V))
        rows.append(("kda_decode", f"B={B} H={H} K=V={K}", ms, _kda_bytes(B, 1, 2), flops, check))
        del conv, state
    return rows


def bench_verify(args):
    weights = _kda_weights()
    rows = []
    n = VERIFY_DRAFTS
    for B in [VERIFY_BATCH]:
        sets = n_sets(B * H * K * V * 4)
        conv, state = _kda_pools(B * sets)
        inputs = _kda_inputs(B, n)
        slot_sets = [torch.arange(s * B, (s + 1) * B, device=CUDA) for s in range(sets)]
        scratch = VerifyScratch(torch.empty(B, n, H, K, V, device=CUDA), torch.empty(B, n, *conv.shape[1:],
                                                                                       dtype=conv.dtype, device=CUDA),
                                torch.arange(B, device=CUDA))
        # exactness: the scratch's step 1 (SGLang's commit of 2 accepted tokens) == two decodes from scratch
        conv_d, state_d = conv[:B].clone(), state[:B].clone()
        dispatch.kda_verify(*inputs, weights, conv[:B], state[:B], slot_sets[0], scratch, backend="triton")
        for t in range(2):
            dispatch.kda_decode(*[x[:, t:t + 1].contiguous() for x in inputs], weights, conv_d, state_d, slot_sets[0],
                                backend="triton")
        err = _rel(state_d, scratch.state[:, 1])
        check = ("ok exact" if torch.equal(state_d, scratch.state[:, 1]) and torch.equal(conv_d, scratch.conv[:, 1])
                 else _check(err, tol=1e-6))
        ms_v = median_ms(lambda i: dispatch.kda_verify(*inputs, weights, conv, state, slot_sets[i % sets], scratch,
                                                       backend="triton"), args.iters, args.warmup)
        scratch_bytes = B * n * (H * K * V * 4 + conv.shape[1] * conv.shape[2] * conv.element_size())
        rows.append(("kda_verify", f"B={B} n={n}", ms_v, _kda_bytes(B, n, 1) + scratch_bytes, 0.0, check))
    return rows


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


def bench_attn_res(args):
    rows = []
    w = torch.randn(HIDDEN, device=CUDA)
    cand = torch.randn(BANK, 8, HIDDEN, dtype=BF16, device=CUDA)
    check = _check(_rel(dispatch.attn_res_read(cand.double(), w.double(), 1e-5, backend="torch"),
                        dispatch.attn_res_read(cand, w, 1e-5, backend="triton")), tol=TOL_BF16_OUT)
    for T in sorted(set(args.batches) | {ATTN_RES_PREFILL_T}):
        sets = n_sets(BANK * T * HIDDEN * 2)
        cands = [torch.randn(BANK, T, HIDDEN, dtype=BF16, device=CUDA) for _ in range(sets)]
        ms = median_ms(lambda i: dispatch.attn_res_read(cands[i % sets], w, 1e-5, backend="triton"), args.iters,
                       args.warmup)
        rows.append(("attn_res_read", f"N={BANK} T={T} D={HIDDEN}", ms, (BANK + 1) * T * HIDDEN * 2, 0.0, check))
        del cands
    return rows


def bench_mxfp4(args):
    N, Kin = MX_SHAPE
    packed = torch.randint(0, 256, (N, Kin // 2), dtype=torch.uint8, device=CUDA)
    scales = torch.randint(110, 140, (N, Kin // 32), dtype=torch.uint8, device=CUDA)
    ref = dispatch.dequant_mxfp4(packed, scales, BF16, backend="torch")
    check = "ok exact" if torch.equal(ref, dispatch.dequant_mxfp4(packed, scales, BF16, backend="triton")) else "FAIL"
    nbytes = packed.numel() + scales.numel() + N * Kin * 2
    sets = n_sets(nbytes)
    experts = [(torch.randint_like(packed, 0, 256), scales.clone()) for _ in range(sets)]
    ms = median_ms(lambda i: dispatch.dequant_mxfp4(*experts[i % sets], BF16, backend="triton"), args.iters, args.warmup)
    return [("dequant_mxfp4", f"expert w1 [{N}, {Kin}] -> bf16", ms, nbytes, 0.0, check)]


def _prefill_inputs(lens, weights):
    T, D = sum(lens), 2 * H * K + H * V
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=CUDA)
    x = torch.randn(T, D, dtype=BF16, device=CUDA)
    f, b = torch.randn(T, H * K, dtype=BF16, device=CUDA), torch.randn(T, H, dtype=BF16, device=CUDA)
    return x, f, b, torch.randn(T, H * V, dtype=BF16, device=CUDA), cu


def bench_prefill(args):
    weights = _kda_weights()
    lens = PREFILL_CHECK
    x, f, b, g_out, cu = _prefill_inputs(lens, weights)
    slots = torch.arange(len(lens), device=CUDA)
    conv, state = _kda_pools(len(lens))
    conv_r, state_r = conv.float(), state.double()
    o_ref = dispatch.kda_prefill(x.float(), f.float(), b.float(), g_out.float(), cu, weights, conv_r, state_r, slots,
                                 backend="torch")
    o = dispatch.kda_prefill(x, f, b, g_out, cu, weights, conv, state, slots, backend="triton")
    check = _two(_rel(o_ref, o), _rel(state_r, state)) + ("" if torch.equal(conv, conv_r.to(conv.dtype)) else " window FAIL")
    rows = []
    for lens in PREFILL_CASES:
        x, f, b, g_out, cu = _prefill_inputs(lens, weights)
        slots = torch.arange(len(lens), device=CUDA)
        conv, state = _kda_pools(len(lens))
        ms = median_ms(lambda i: dispatch.kda_prefill(x, f, b, g_out, cu, weights, conv, state, slots,
                                                      backend="triton"), max(5, args.iters // 5), 2)
        T, D, C = sum(lens), 2 * H * K + H * V, 64
        nbytes = T * (D + H * K + H + 2 * H * V) * 2 + 2 * len(lens) * H * K * V * 4 + T * H * (4 * K + 2 * V) * 4 * 2
        flops = T * H * 2 * (4 * K * V + 2 * C * K + C * V + C * C)
        rows.append(("kda_chunk_prefill", f"seqs={len(lens)}x{lens[0]} H={H}", ms, nbytes, flops, check))
    return rows


MOE_CASE = (16, 8, 4, (3072, 3584))  # experts per call, rows per expert, rotated expert sets, w1 [N, Kin]


def bench_moe(args):
    E, rows_per, sets, (N, Kin) = MOE_CASE
    packed = torch.randint(0, 256, (E * sets, N, Kin // 2), dtype=torch.uint8, device=CUDA)
    scales = torch.randint(118, 130, (E * sets, N, Kin // 32), dtype=torch.uint8, device=CUDA)
    offsets = torch.arange(0, (E + 1) * rows_per, rows_per, dtype=torch.int32, device=CUDA)
    x = torch.randn(E * rows_per, Kin, dtype=BF16, device=CUDA) * 0.1
    ref = dispatch.mxfp4_grouped_matmul(x[:2 * rows_per].double(), offsets[:3], packed[:2], scales[:2], backend="torch")
    out = dispatch.mxfp4_grouped_matmul(x[:2 * rows_per].contiguous(), offsets[:3], packed[:2], scales[:2],
                                        backend="triton")
    check = _check(_rel(ref, out), tol=TOL_BF16_OUT)
    ms = median_ms(lambda i: dispatch.mxfp4_grouped_matmul(x, offsets, packed[(i % sets) * E:(i % sets + 1) * E],
                                                           scales[(i % sets) * E:(i % sets + 1) * E],
                                                           backend="triton"), args.iters, args.warmup)
    nbytes = E * N * (Kin // 2 + Kin // 32) + x.numel() * 2 + E * rows_per * N * 2
    return [("mxfp4_grouped_matmul", f"E={E} rows/e={rows_per} [{N}, {Kin}]", ms, nbytes,
             2 * E * rows_per * N * Kin, check)]
