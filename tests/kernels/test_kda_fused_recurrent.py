"""Triton fused KDA decode / verify (per-draft scratch) against the torch path (float64), on a poisoned slot pool."""
import pytest
import torch

from k3_sglang.kernels.kda.decode_common import VerifyScratch
from k3_sglang.kernels.kda.fused_recurrent import kda_fused_decode, kda_fused_verify
from k3_sglang.kernels.kda.naive_decode import kda_decode_torch, kda_verify_torch
from tests.kernels.kda_cases import POISON, as64, make_pools, make_step_inputs, make_weights
from tests.utils.numerics import FP32_VS_FP64, assert_bit_exact, assert_close

pytestmark = pytest.mark.triton


def _untouched(slots_total, used):
    return [s for s in range(slots_total) if s not in set(used)]


@pytest.mark.parametrize("B,n,H,K,V", [(3, 1, 2, 16, 24), (2, 3, 3, 8, 8)], ids=lambda x: str(x))
def test_kda_fused_decode(B, n, H, K, V):
    weights = make_weights(H, K, V)
    inputs = make_step_inputs(B, n, H, K, V)
    slots = torch.randperm(3 * B)[:B]
    slots[1] = -1  # a padded request
    conv, state = make_pools(3 * B, slots.tolist(), H, K, V)
    conv64, state64 = conv.double(), state.double()
    o_ref = kda_decode_torch(*(t.double() for t in inputs), as64(weights), conv64, state64, slots)
    conv_t, state_t = conv.clone(), state.clone()
    kda_decode_torch(*inputs, weights, conv_t, state_t, slots)
    # out-of-bounds probe: each input is the head of a buffer whose tail holds POISON
    probed = []
    for x in inputs:
        buf = torch.full((2 * B, *x.shape[1:]), POISON, dtype=x.dtype)
        buf[:B] = x
        probed.append(buf[:B])
    o = kda_fused_decode(*probed, weights, conv, state, slots)
    assert_close("o", o_ref, o, FP32_VS_FP64)
    assert bool((o[1] == 0).all())
    live = slots[slots >= 0]
    assert_close("state", state64[live], state[live], FP32_VS_FP64)
    assert_bit_exact("conv window", conv_t, conv)  # pure data movement
    rest = _untouched(3 * B, live.tolist())
    assert_bit_exact("untouched state slots", state_t[rest], state[rest])


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_kda_verify_scratch_then_commit_equals_decode(impl):
    """Verify leaves the pools alone and puts the state and window after every token in SGLang's per-draft scratch
    (rows chosen by the caller, other rows untouched); copying step accepted - 1 into the pools (what SGLang's
    commit after acceptance does) equals, bit for bit, decoding the accepted tokens from the pre-verify pools."""
    verify, decode = (kda_fused_verify, kda_fused_decode) if impl == "triton" else (kda_verify_torch, kda_decode_torch)
    B, n, H, K, V = 3, 4, 2, 8, 12
    weights = make_weights(H, K, V)
    inputs = make_step_inputs(B, n, H, K, V)
    slots = torch.tensor([4, 0, 7])
    accepted = torch.tensor([2, 1, 4])
    conv, state = make_pools(9, slots.tolist(), H, K, V)
    rows = torch.tensor([5, 1, 2])  # scratch rows (SGLang: the request's index, or its req-pool row under PP)
    scratch = VerifyScratch(torch.full((7, n + 1, H, K, V), POISON), torch.full((7, n + 1, *conv.shape[1:]), POISON),
                            rows)
    conv_v, state_v = conv.clone(), state.clone()
    o_verify = verify(*inputs, weights, conv_v, state_v, slots, scratch)
    assert_bit_exact("verify leaves the state pool", state, state_v)
    assert_bit_exact("verify leaves the conv pool", conv, conv_v)
    others = [r for r in range(7) if r not in rows.tolist()]
    assert bool((scratch.state[others] == POISON).all()) and bool((scratch.conv[others] == POISON).all())
    assert bool((scratch.state[rows, n] == POISON).all()), "a step past the chain was written"
    live = slots >= 0
    state_v[slots[live]] = scratch.state[rows[live], accepted[live] - 1]  # SGLang's commit of the accepted step
    conv_v[slots[live]] = scratch.conv[rows[live], accepted[live] - 1]
    conv_d, state_d = conv.clone(), state.clone()  # from scratch: one-token decodes of the accepted prefix
    for t in range(n):
        alive = (accepted > t).nonzero().flatten()
        if len(alive) == 0:
            continue
        step = [x[:, t:t + 1].contiguous() for x in inputs]  # the whole batch, rejected requests as padding slots
        o_t = decode(*step, weights, conv_d, state_d, torch.where(accepted > t, slots, -1))
        assert_bit_exact(f"verify output token {t}", o_t[alive], o_verify[alive, t:t + 1])
        assert bool((o_t[accepted <= t] == 0).all()), "padding requests output 0"
    assert_bit_exact("committed state", state_d, state_v)
    assert_bit_exact("committed conv window", conv_d, conv_v)


def test_kda_verify_padding_request_writes_no_scratch():
    B, n, H, K, V = 2, 3, 2, 8, 8
    weights = make_weights(H, K, V)
    inputs = make_step_inputs(B, n, H, K, V)
    slots = torch.tensor([-1, 2])
    conv, state = make_pools(4, [2], H, K, V)
    scratch = VerifyScratch(torch.full((3, n, H, K, V), POISON), torch.full((3, n, *conv.shape[1:]), POISON),
                            torch.tensor([0, 1]))
    o = kda_verify_torch(*inputs, weights, conv, state, slots, scratch)
    assert bool((o[0] == 0).all()) and bool((scratch.state[0] == POISON).all())
    assert bool((scratch.conv[0] == POISON).all()) and not bool((scratch.state[1] == POISON).any())
    with pytest.raises(ValueError, match="scratch state"):
        kda_verify_torch(*inputs, weights, conv, state, slots, VerifyScratch(scratch.state[:, :2], scratch.conv,
                                                                             scratch.rows))


def test_kda_fused_recurrent_invalid_args():
    weights = make_weights(2, 8, 8)
    x, f, b, g = make_step_inputs(2, 1, 2, 8, 8)
    conv, state = make_pools(4, [0, 1], 2, 8, 8)
    with pytest.raises(ValueError, match=r"g_out \(2, 1, 8\)"):
        kda_fused_decode(x, f, b, g[..., :8], weights, conv, state, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"state_indices \(3,\)"):
        kda_fused_decode(x, f, b, g, weights, conv, state, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"conv_pool \(4, 2, 48\)"):
        kda_fused_decode(x, f, b, g, weights, conv[:, :2], state, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"state_pool \(4, 2, 8, 8\) must be float32"):
        kda_fused_decode(x, f, b, g, weights, conv, state.double(), torch.tensor([0, 1]))


@pytest.mark.gpu
def test_kda_fused_decode_cuda_graph():
    """Capture one decode step in a CUDA graph and replay it: same result as the eager launch."""
    B, H, K, V = 4, 4, 128, 128
    weights = make_weights(H, K, V)
    weights = type(weights)(*(t.cuda() for t in (weights.conv_weight, weights.A_log, weights.dt_bias, weights.o_norm)))
    inputs = [t.cuda() for t in make_step_inputs(B, 1, H, K, V)]
    slots = torch.tensor([3, 0, 5, 1], device="cuda")
    conv, state = (t.cuda() for t in make_pools(8, slots.tolist(), H, K, V))
    conv_e, state_e = conv.clone(), state.clone()
    o_eager = kda_fused_decode(*inputs, weights, conv_e, state_e, slots)
    kda_fused_decode(*inputs, weights, conv.clone(), state.clone(), slots)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    conv_g, state_g = conv.clone(), state.clone()
    with torch.cuda.graph(graph):
        o_graph = kda_fused_decode(*inputs, weights, conv_g, state_g, slots)
    conv_g.copy_(conv)
    state_g.copy_(state)
    graph.replay()
    torch.cuda.synchronize()
    assert_bit_exact("graph output", o_eager, o_graph)
    assert_bit_exact("graph state", state_e, state_g)
    assert_bit_exact("graph window", conv_e, conv_g)
