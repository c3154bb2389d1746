"""The k3_dcp_mla Triton kernel's bf16 branch (`DOT_FP32=False`, the code a Hopper or Blackwell user runs) executed
on CPU: Triton's own interpreter runs the kernel source, with one change, its `tl.dot` on 16-bit floats. The
interpreter keeps bf16 as raw uint16 bits and would multiply those as integers, so the CPU tests used to take the
fp32 branch. Here a dot of bf16 operands widens them to fp32 (exact: a product of two bf16 values fits fp32's
mantissa) and accumulates in fp32, as tensor cores do; everything else is the kernel's bf16 branch as written: bf16
loads, bf16 q x k^T dots, the fp32 softmax, `p.to(bf16)` before the p x V dot (the interpreter truncates where a GPU
rounds to nearest, the harsher of the two), bf16 output or fp32 partials and the merge.

Against the float64 reference on the bf16-rounded inputs (so only the kernel's own rounding counts), on every DCP
rank, decode / verify / ragged chunks, split and unsplit, with the NaN-poisoned pools and outputs of
test_mla_dcp.py. The test also counts the bf16 dots it widened, so a kernel that quietly took the fp32 branch fails.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from k3_sglang.kernels.mla import dcp_triton
from k3_sglang.kernels.mla.naive import mla_dcp_attention_paged
from tests.kernels.test_mla_dcp import CASES, SCALE, C, make_case, rank_batch
from tests.utils.numerics import assert_close

BF16_OUT = 1e-2  # bf16 output and bf16 p: a few bf16 ulps (2^-8 = 3.9e-3) relative by norm; measured <= 3.9e-3
LSE = 1e-5  # fp32 scores of exact bf16 products: measured <= 5e-8


@pytest.fixture
def bf16_dots(monkeypatch):
    """Route bf16 inputs to the kernel's bf16 branch and let the interpreter dot bf16; yields the count of dots."""
    import triton.language as tl
    from triton.runtime import interpreter

    widened = {"dots": 0}
    original = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            assert a.dtype.scalar == b.dtype.scalar == tl.bfloat16, "mixed-precision dot in the bf16 branch"
            widened["dots"] += 1
            wa = interpreter._convert_float(a.data, tl.bfloat16, tl.float32, None).view(np.float32)
            wb = interpreter._convert_float(b.data, tl.bfloat16, tl.float32, None).view(np.float32)
            return interpreter.TensorHandle(np.matmul(wa, wb, dtype=np.float32) + d.data, d.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
    monkeypatch.setattr(dcp_triton, "use_fp32_dots", lambda dtype: dtype == torch.float32)
    yield widened


@pytest.mark.triton
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("c,page,splits", [(1, 1, 1), (2, 2, 2), (3, 4, None)])
def test_bf16_branch_matches_reference_on_every_rank(bf16_dots, name, c, page, splits):
    keys, q, q_indptr, gen = make_case(name, c, seed=3)
    q16 = q.bfloat16()
    q_len = CASES[name][1][0] if len(set(CASES[name][1])) == 1 else None
    for r in range(c):
        pool, bt, kv_lens, causal = rank_batch(keys, c, r, page, gen)
        pool16 = pool.bfloat16()
        o_ref, lse_ref = mla_dcp_attention_paged(q16.double(), pool16.double(), bt, q_indptr.tolist(),
                                                 kv_lens.tolist(), causal.tolist(), page, c, r, C, SCALE)
        before = bf16_dots["dots"]
        o, lse = dcp_triton.mla_dcp_attention_triton(q16, pool16, bt, q_indptr, kv_lens, causal, page, c, r, C,
                                                     SCALE, q_len=q_len, num_splits=splits)
        assert bf16_dots["dots"] > before, "the kernel did not take its bf16 branch"
        assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32
        assert_close(f"o rank {r}", o_ref, o, BF16_OUT)
        assert_close(f"lse rank {r}", lse_ref, lse, LSE)


@pytest.mark.triton
def test_unpatched_interpreter_cannot_run_the_bf16_branch(monkeypatch):
    """Why the fixture exists: without it the interpreter multiplies bf16 bit patterns as integers (or refuses)."""
    monkeypatch.setattr(dcp_triton, "use_fp32_dots", lambda dtype: dtype == torch.float32)
    keys, q, q_indptr, gen = make_case("decode", 1, seed=4)
    pool, bt, kv_lens, causal = rank_batch(keys, 1, 0, 1, gen)
    o_ref, _ = mla_dcp_attention_paged(q.bfloat16().double(), pool.bfloat16().double(), bt, q_indptr.tolist(),
                                       kv_lens.tolist(), causal.tolist(), 1, 1, 0, C, SCALE)
    try:
        o, _ = dcp_triton.mla_dcp_attention_triton(q.bfloat16(), pool.bfloat16(), bt, q_indptr, kv_lens, causal, 1,
                                                   1, 0, C, SCALE, q_len=1, num_splits=1)
    except Exception:  # noqa: BLE001 - refusing is also "cannot run"
        return
    err = ((o.double() - o_ref).norm() / o_ref.norm()).item()
    assert not err <= BF16_OUT, f"the plain interpreter matched the reference ({err:.1e}): drop the fixture"
