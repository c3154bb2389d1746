"""The k3_dcp_mla Triton kernel (`mla_dcp_attention_triton`) against the float64 reference
(`naive.mla_dcp_attention_paged`) on every DCP rank, at K3's MLA shapes, needing only torch and triton (and this
checkout installed): bench/gpu_check.sh runs it on a lent CUDA device (sm90 included).

Each case scatters random keys over one rank's paged pool in SGLang's DCP layout (position p on rank p mod c,
rank-local key i in row block_table[b, i // P] * P + i % P), every other pool row NaN and every block-table entry
past a request's pages pointing at a NaN page; torch.empty / empty_like return NaN while the kernel runs, so a row
read by mistake or an output left unwritten fails. Decode (one query per request), target verify (4 queries) and
prefill chunks (ragged), c in {1, 2, 8}, fp32 and bf16 (the reference runs on the bf16-rounded inputs, so only the
kernel's own accumulation and output rounding count). Error: relative by norm, ||o - ref|| / ||ref||, NaN fails.

    python bench/dcp_kernel_check.py                      # CUDA, K3 shapes (exit 1 on any failure)
    TRITON_INTERPRET=1 python bench/dcp_kernel_check.py --device cpu --quick    # the same checks, tiny, on CPU
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time

import torch

RATIO = {torch.float32: 5e-3, torch.bfloat16: 1e-2}  # fp32 as tests/utils/numerics.FP32_VS_FP64; bf16: output rounding


@contextlib.contextmanager
def nan_poisoned_empty():
    """torch.empty / empty_like fill floating tensors with NaN while active."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.empty = lambda *a, **k: poison(empty(*a, **k))
    torch.empty_like = lambda *a, **k: poison(empty_like(*a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like


def rank_batch(keys, c, r, page, gen, device):
    """keys: per request [S_b, L] float64 rows -> (pool [N, L], block_table [B, M] int32, kv_lens [B], causal [B])."""
    from k3_sglang.kernels.mla.dcp_layout import local_key_counts

    lens = torch.tensor([k.shape[0] for k in keys])
    kv_lens = local_key_counts(lens, c, r)
    pages_per = [(int(n) + page - 1) // page for n in kv_lens]
    total = sum(pages_per) + 2
    pool = torch.full((total * page, keys[0].shape[1]), float("nan"), dtype=torch.float64)
    order = torch.randperm(total, generator=gen)
    block_table = torch.full((len(keys), max(pages_per + [1]) + 1), int(order[-1]), dtype=torch.int32)
    used = 0
    for b, k in enumerate(keys):
        mine = k[r::c]
        for j in range(pages_per[b]):
            phys = int(order[used])
            used += 1
            block_table[b, j] = phys
            rows = mine[j * page: (j + 1) * page]
            pool[phys * page: phys * page + rows.shape[0]] = rows
    return [t.to(device) for t in (pool, block_table, kv_lens, lens)]


def relative_error(ref: torch.Tensor, out: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(out), finite) or not torch.equal(out[~finite], ref[~finite]):
        return float("inf")  # NaN, or a non-finite value (an empty rank's lse = -inf) where the reference has none
    return float((out[finite] - ref[finite]).norm() / ref[finite].norm().clamp_min(1e-30))


def cases(quick: bool):
    """name -> (key lengths per request, queries per request)."""
    if quick:
        return {"decode": ([1, 9, 40], [1, 1, 1]), "verify": ([9, 30], [4, 4]), "chunks": ([70, 5], [21, 5])}
    return {"decode": ([1, 257, 4100, 1500], [1, 1, 1, 1]), "verify": ([33, 2048, 700], [4, 4, 4]),
            "chunks": ([4096, 300, 64], [512, 300, 1])}


def run(args) -> int:
    from k3_sglang.kernels.mla.dcp_triton import mla_dcp_attention_triton
    from k3_sglang.kernels.mla.naive import mla_dcp_attention_paged

    device = torch.device(args.device)
    width, v_dim, heads, page = (24, 16, 3, 4) if args.quick else (576, 512, 16, 64)
    scale = width ** -0.5
    failures = 0
    print(f"device {device}, L={width} v_dim={v_dim} heads={heads} page={page}")
    for name, (lens, q_lens) in cases(args.quick).items():
        for c in (1, 2, 8):
            gen = torch.Generator().manual_seed(1000 * c + len(name))
            keys = [torch.randn(n, width, generator=gen, dtype=torch.float64) for n in lens]
            q = torch.randn(sum(q_lens), heads, width, generator=gen, dtype=torch.float64)
            q_indptr = torch.tensor([0] + q_lens).cumsum(0)
            q_len = q_lens[0] if len(set(q_lens)) == 1 else None
            for dtype in (torch.float32, torch.bfloat16):
                worst, start = 0.0, time.perf_counter()
                for r in range(c):
                    pool, bt, kv_lens, causal = rank_batch(keys, c, r, page, gen, device)
                    q_in, pool_in = q.to(device, dtype), pool.to(dtype)
                    o_ref, lse_ref = mla_dcp_attention_paged(
                        q_in.double(), pool_in.double(), bt, q_indptr.tolist(), kv_lens.tolist(), causal.tolist(),
                        page, c, r, v_dim, scale)
                    with nan_poisoned_empty():
                        o, lse = mla_dcp_attention_triton(q_in, pool_in, bt, q_indptr.to(device), kv_lens, causal,
                                                          page, c, r, v_dim, scale, q_len=q_len)
                    worst = max(worst, relative_error(o_ref, o), relative_error(lse_ref, lse))
                ok = worst <= RATIO[dtype]
                failures += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name:<6} c={c} {str(dtype)[6:]:<8} max rel. error {worst:.2e} "
                      f"(limit {RATIO[dtype]:.0e}), {c} ranks in {time.perf_counter() - start:.1f} s", flush=True)
    print("every case within its limit" if not failures else f"{failures} case(s) failed")
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu under TRITON_INTERPRET=1")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (for the interpreter)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("NOT RUN: no CUDA device visible")
        return 3
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
