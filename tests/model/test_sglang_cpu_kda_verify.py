"""SGLang's verify contract on CPU for SGLang's own K3 (k3_sglang/sglang_cpu): our short-conv update and KDA kernel
against SGLang's own Triton kernels (run by the interpreter) on ragged chains, and a verified step committed the way
SGLang's commit does equal to decoding the accepted tokens."""
import pytest
import torch

from k3_sglang.sglang_cpu import kda_ops
from k3_sglang.sglang_cpu.kda_kernel import K3CpuKDAKernel
from tests.utils.numerics import assert_bit_exact, assert_close

pytestmark = pytest.mark.triton
H, K, V, W, SLOTS = 2, 8, 8, 4, 6
D = 2 * H * K + H * V
LENS = [3, 1, 4]  # a ragged verify: request b verifies LENS[b] tokens
QSL = torch.tensor([0, 3, 4, 8], dtype=torch.int32)


def _kda_inputs(T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, T, H, K, generator=g), torch.randn(1, T, H, K, generator=g)
    v = torch.randn(1, T, H, V, generator=g)
    a, b = torch.randn(T, H * K, generator=g), torch.randn(T, H, generator=g)
    return q, k, v, a, b, torch.randn(1, 1, H, 1, generator=g) * 0.5, torch.randn(H * K, generator=g)


def test_conv_update_verify_matches_sglangs_triton_kernel():
    """Multi-token chain verify: same outputs and per-draft windows as SGLang's kernel; the pool is left for the
    commit (SGLang's kernel advances it by every token, then the commit overwrites it with the accepted step)."""
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update as sglang_update

    g = torch.Generator().manual_seed(1)
    B, n = 3, 4
    x, w, bias = torch.randn(B, D, n, generator=g), torch.randn(D, W, generator=g), torch.randn(D, generator=g)
    pool = torch.randn(SLOTS, W - 1, D, generator=g)  # KDA's layout; the ops take the [slots, D, W-1] view
    slots, rows = torch.tensor([4, -1, 1], dtype=torch.int32), torch.tensor([2, 0, 5], dtype=torch.int32)
    got = {}
    for name, fn in (("sglang", sglang_update), ("ours", kda_ops.causal_conv1d_update)):
        p, inter = pool.clone(), torch.full((SLOTS + 1, n, W - 1, D), 7.0)
        y = fn(x.clone(), p.transpose(-1, -2), w, bias, activation="silu", conv_state_indices=slots,
               intermediate_conv_window=inter.transpose(-1, -2), intermediate_state_indices=rows)
        got[name] = (y, p, inter)
    (y_s, _, inter_s), (y_o, pool_o, inter_o) = got["sglang"], got["ours"]
    live = torch.tensor([0, 2])
    assert_close("conv output", y_s[live], y_o[live], 1e-6)
    assert bool((y_o[1] == 0).all()), "a padding request outputs 0"
    assert_bit_exact("per-draft windows", inter_s, inter_o)  # pure data movement, rows chosen by the caller
    assert_bit_exact("pool untouched by verify", pool, pool_o)


def test_kda_target_verify_matches_sglangs_triton_kernel_on_ragged_chains():
    from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel

    q, k, v, a, b, A_log, dt_bias = _kda_inputs(sum(LENS))
    ssm = torch.randn(SLOTS, H, V, K, generator=torch.Generator().manual_seed(2)) * 0.3
    slots, rows = torch.tensor([3, 0, 2], dtype=torch.int32), torch.tensor([1, 4, 0], dtype=torch.int32)
    got = {}
    for name, kernel in (("sglang", TritonKDAKernel()), ("ours", K3CpuKDAKernel())):
        pool, inter = ssm.clone(), torch.zeros(SLOTS + 1, max(LENS), H, V, K)
        o = kernel.target_verify(A_log, dt_bias, q, k, v, a, b, ssm_states=pool, cache_indices=slots,
                                 query_start_loc=QSL, intermediate_states_buffer=inter,
                                 intermediate_state_indices=rows, cache_steps=max(LENS), retrieve_parent_token=None,
                                 lower_bound=-5.0)
        assert_bit_exact(f"{name}: the committed pool is not written", ssm, pool)
        got[name] = (o, inter)
    assert_close("verify output", got["sglang"][0], got["ours"][0], 1e-5)
    for r, n in zip(rows.tolist(), LENS):
        assert_close(f"states of scratch row {r}", got["sglang"][1][r, :n], got["ours"][1][r, :n], 1e-5)


def test_a_committed_verify_step_equals_decoding_the_accepted_tokens():
    """The state after token t of a ragged verify (what SGLang's commit copies for accept length t + 1) equals,
    bit for bit, t + 1 decode steps of the same batch; decode of a padding slot touches nothing."""
    q, k, v, a, b, A_log, dt_bias = _kda_inputs(sum(LENS), seed=3)
    ssm = torch.randn(SLOTS, H, V, K, generator=torch.Generator().manual_seed(4)) * 0.3
    slots, rows = torch.tensor([3, 0, 2]), torch.tensor([0, 1, 2])
    kernel = K3CpuKDAKernel()
    inter = torch.zeros(3, max(LENS), H, V, K)
    kernel.target_verify(A_log, dt_bias, q, k, v, a, b, ssm_states=ssm.clone(), cache_indices=slots,
                         query_start_loc=QSL, intermediate_states_buffer=inter, intermediate_state_indices=rows,
                         cache_steps=max(LENS), retrieve_parent_token=None, lower_bound=-5.0)
    pool = ssm.clone()
    starts = QSL.tolist()
    for t in range(max(LENS)):
        alive = torch.tensor([t < n for n in LENS])
        token = [starts[i] + min(t, n - 1) for i, n in enumerate(LENS)]  # a finished chain runs as padding
        kernel.decode(q[:, token], k[:, token], v[:, token], a[token], b[None, token], A_log=A_log, dt_bias=dt_bias,
                      ssm_states=pool, cache_indices=torch.where(alive, slots, -1),
                      query_start_loc=torch.arange(4, dtype=torch.int32), lower_bound=-5.0)
        for i in alive.nonzero().flatten().tolist():
            assert_bit_exact(f"request {i} after token {t}", inter[rows[i], t], pool[slots[i]])
    untouched = [s for s in range(SLOTS) if s not in slots.tolist()]
    assert_bit_exact("other slots", ssm[untouched], pool[untouched])
