"""The torch KDA ops behind SGLang's KDA backend on CPU (k3_sglang/sglang_cpu/kda_ops.py), on SGLang's layouts
(conv pool [slots, W-1, D] seen as [slots, D, W-1], states [slots, H, V, K]), against the float64 references of
kernels/kda/naive.py on fresh random inputs. Padding slots (-1) must leave every pool row untouched."""
from __future__ import annotations

import pytest
import torch

from k3_sglang.kernels.kda.naive import kda_gate, l2_normalize, naive_recurrent_kda, short_conv_silu
from k3_sglang.sglang_cpu import kda_ops
from tests.utils.numerics import FP32_VS_FP64, assert_bit_exact, assert_close

H, K, V, W = 2, 12, 8, 4
D = 2 * H * K + H * V
LB = -5.0


def _weights():
    return (torch.randn(D, W), torch.randn(H) * 0.5, torch.randn(H * K))  # conv weight, A_log, dt_bias


def _pools(slots: int):
    conv = torch.randn(slots, W - 1, D)
    state = torch.randn(slots, H, V, K) * 0.3
    return conv, state


def _reference_sequence(x, f, b, conv_w, A_log, dt_bias, window, state):
    """float64 reference of one request: conv+silu from `window` [W-1, D], then the recurrence from `state`
    [H, V, K] (SGLang layout). Returns (o [T, H, V], final window, final state [H, V, K])."""
    y, new_window = short_conv_silu(x.double(), conv_w.double(), window.double())
    q, k, v = y.split([H * K, H * K, H * V], -1)
    q = l2_normalize(q.reshape(-1, H, K), 1e-6)
    k = l2_normalize(k.reshape(-1, H, K), 1e-6)
    g = kda_gate(f.double().reshape(-1, H, K), A_log.double(), dt_bias.double(), LB)
    o, S = naive_recurrent_kda(q, k, v.reshape(-1, H, V), g, torch.sigmoid(b.double()), K ** -0.5,
                               state.double().transpose(-1, -2))
    return o, new_window, S.transpose(-1, -2)


def _conv_prefill(conv_w, lens, slots, n_slots, init):
    """Fresh random rows for `lens` prompts on pools of `n_slots`, run through the CPU conv prefill: the inputs,
    the pools and their copies before the call, the packed offsets and slots, and the conv output split as q, k, v."""
    T = sum(lens)
    x, f, b = torch.randn(T, D), torch.randn(T, H * K), torch.randn(T, H)
    conv, state = _pools(n_slots)
    conv0, state0 = conv.clone(), state.clone()
    qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    idx = torch.tensor(slots, dtype=torch.int32)
    y = kda_ops.causal_conv1d_fn(x.t().contiguous(), conv_w, None, conv.transpose(-1, -2), qsl, lens, idx,
                                 torch.tensor(init), "silu").t()
    return x, f, b, conv, state, conv0, state0, qsl, idx, y.split([H * K, H * K, H * V], -1)


def test_prefill_conv_and_chunked_recurrence_match_the_reference():
    conv_w, A_log, dt_bias = _weights()
    lens, slots, init = [1, 70, 0, 130, 2], [3, 1, 4, -1, 0], [True, False, True, True, True]
    T = sum(lens)
    x, f, b, conv, state, conv0, state0, qsl, idx, (q, k, v) = _conv_prefill(conv_w, lens, slots, 6, init)
    h_track = torch.full((len(lens), H, V, K), float("nan"))
    o, h = kda_ops.kda_extend(q.reshape(1, T, H, K), k.reshape(1, T, H, K), v.reshape(1, T, H, V),
                              f.reshape(1, T, H, K), b.reshape(1, T, H), A_log=A_log.view(1, 1, H, 1),
                              dt_bias=dt_bias, lower_bound=LB, ssm_states=state, cache_indices=idx,
                              query_start_loc=qsl, return_chunk_states=True, track_state=h_track,
                              track_chunk_idx=torch.tensor([0, 1, 0, 1, 0]))
    at, chunk_at = 0, 0
    for i, (n, slot) in enumerate(zip(lens, slots)):
        rows = slice(at, at + n)
        at += n
        n_chunks = -(-n // kda_ops.CHUNK)
        if slot < 0 or n == 0:
            assert not o[0, rows].any(), "a padding request must output zeros"
            chunk_at += n_chunks
            continue
        window = conv0[slot] if init[i] else torch.zeros(W - 1, D)
        want_o, want_window, want_S = _reference_sequence(x[rows], f[rows], b[rows], conv_w, A_log, dt_bias,
                                                          window, state0[slot])
        assert_close(f"o[{i}]", want_o, o[0, rows], FP32_VS_FP64)
        assert_close(f"window[{i}]", want_window, conv[slot], FP32_VS_FP64)
        assert_close(f"state[{i}]", want_S, state[slot], FP32_VS_FP64)
        for c in range(n_chunks):  # the state entering chunk c = the reference after c * 64 tokens
            lo = slice(rows.start, rows.start + c * kda_ops.CHUNK)
            _, _, S_c = _reference_sequence(x[lo], f[lo], b[lo], conv_w, A_log, dt_bias, window, state0[slot])
            assert_close(f"h[{i}, chunk {c}]", S_c, h[0, chunk_at + c], FP32_VS_FP64)
        chunk_at += n_chunks
    assert h.shape[1] == chunk_at
    assert_close("track_state[1] = h entering chunk 1 of request 1", h[0, 2], h_track[1], 0.0)
    for untouched in (2, 5):
        assert_bit_exact(f"conv slot {untouched}", conv0[untouched], conv[untouched])
        assert_bit_exact(f"state slot {untouched}", state0[untouched], state[untouched])


@pytest.mark.parametrize("lens,slots", [([128], [2]), ([64, 64], [0, 3])], ids=["one-prompt", "two-prompts"])
def test_prefill_of_whole_chunks_reads_the_packed_rows_in_place_and_matches_the_reference(lens, slots):
    """Prompts of whole 64-token chunks, none padding: kda_extend chunks the packed rows without a gather (its
    in-place path); outputs, final states and every chunk's entering state against the float64 reference."""
    conv_w, A_log, dt_bias = _weights()
    T = sum(lens)
    x, f, b, conv, state, conv0, state0, qsl, idx, (q, k, v) = _conv_prefill(conv_w, lens, slots, 4,
                                                                              [True] * len(lens))
    o, h = kda_ops.kda_extend(q.reshape(1, T, H, K), k.reshape(1, T, H, K), v.reshape(1, T, H, V),
                              f.reshape(1, T, H, K), b.reshape(1, T, H), A_log=A_log.view(1, 1, H, 1),
                              dt_bias=dt_bias, lower_bound=LB, ssm_states=state, cache_indices=idx,
                              query_start_loc=qsl, return_chunk_states=True)
    assert not o.isnan().any() and h.shape[1] == T // kda_ops.CHUNK
    at = 0
    for i, (n, slot) in enumerate(zip(lens, slots)):
        rows = slice(at, at + n)
        want_o, _, want_S = _reference_sequence(x[rows], f[rows], b[rows], conv_w, A_log, dt_bias, conv0[slot],
                                                state0[slot])
        assert_close(f"o[{i}]", want_o, o[0, rows], FP32_VS_FP64)
        assert_close(f"state[{i}]", want_S, state[slot], FP32_VS_FP64)
        for c in range(n // kda_ops.CHUNK):
            lo = slice(rows.start, rows.start + c * kda_ops.CHUNK)
            _, _, S_c = _reference_sequence(x[lo], f[lo], b[lo], conv_w, A_log, dt_bias, conv0[slot], state0[slot])
            assert_close(f"h[{i}, chunk {c}]", S_c, h[0, at // kda_ops.CHUNK + c], FP32_VS_FP64)
        at += n


def test_decode_step_and_verify_chain_match_the_reference():
    conv_w, A_log, dt_bias = _weights()
    B, n = 4, 3
    slots = torch.tensor([2, -1, 0, 3], dtype=torch.int32)
    conv, state = _pools(5)
    conv0, state0 = conv.clone(), state.clone()
    x, f, b = torch.randn(B, n, D), torch.randn(B, n, H * K), torch.randn(B, n, H)
    # decode: the first token of every request, conv update then one recurrent step written back
    dec_conv, dec_state = conv.clone(), state.clone()
    y = kda_ops.causal_conv1d_update(x[:, 0], dec_conv.transpose(-1, -2), conv_w, None, "silu",
                                     conv_state_indices=slots)
    q, k, v = y.split([H * K, H * K, H * V], -1)
    o = kda_ops.kda_recurrent(q.reshape(1, B, H, K), k.reshape(1, B, H, K), v.reshape(1, B, H, V), f[:, 0],
                              b[:, 0].reshape(1, B, H), A_log=A_log.view(1, 1, H, 1), dt_bias=dt_bias,
                              lower_bound=LB, ssm_states=dec_state, cache_indices=slots,
                              query_start_loc=torch.arange(B + 1, dtype=torch.int32))
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            assert not o[0, i].any() and not y[i].any()
            continue
        want_o, want_window, want_S = _reference_sequence(x[i, :1], f[i, :1], b[i, :1], conv_w, A_log, dt_bias,
                                                          conv0[slot], state0[slot])
        assert_close(f"decode o[{i}]", want_o[0], o[0, i], FP32_VS_FP64)
        assert_close(f"decode window[{i}]", want_window, dec_conv[slot], FP32_VS_FP64)
        assert_close(f"decode state[{i}]", want_S, dec_state[slot], FP32_VS_FP64)
    for untouched in (1, 4):
        assert_bit_exact(f"decode conv slot {untouched}", conv0[untouched], dec_conv[untouched])
        assert_bit_exact(f"decode state slot {untouched}", state0[untouched], dec_state[untouched])
    # verify: n tokens per request from the committed state; per-token states in the scratch, pool untouched
    qkv = torch.stack([short_conv_silu(x[i], conv_w, conv0[max(s, 0)])[0] for i, s in enumerate(slots.tolist())])
    q, k, v = qkv.reshape(B * n, D).split([H * K, H * K, H * V], -1)
    scratch = torch.full((6, n, H, V, K), float("nan"))
    rows = torch.tensor([5, 0, 1, 2], dtype=torch.int32)
    ver_state = state.clone()
    o = kda_ops.kda_recurrent(q.reshape(1, B * n, H, K), k.reshape(1, B * n, H, K), v.reshape(1, B * n, H, V),
                              f.reshape(B * n, H * K), b.reshape(1, B * n, H), A_log=A_log.view(1, 1, H, 1),
                              dt_bias=dt_bias, lower_bound=LB, ssm_states=ver_state, cache_indices=slots,
                              query_start_loc=torch.arange(0, B * n + 1, n, dtype=torch.int32), write_state=False,
                              intermediate_states=scratch, intermediate_state_indices=rows)
    assert_bit_exact("verify leaves the committed states alone", state, ver_state)
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            assert not o[0, i * n:(i + 1) * n].any()
            assert scratch[rows[i]].isnan().all(), "a padding request must not write the scratch"
            continue
        for t in range(n):
            want_o, _, want_S = _reference_sequence(x[i, :t + 1], f[i, :t + 1], b[i, :t + 1], conv_w, A_log,
                                                    dt_bias, conv0[slot], state0[slot])
            assert_close(f"verify o[{i}, {t}]", want_o[t], o[0, i * n + t], FP32_VS_FP64)
            assert_close(f"verify state[{i}, {t}]", want_S, scratch[rows[i], t], FP32_VS_FP64)


def test_a_plain_decode_is_bit_identical_to_the_first_token_of_a_verify_chain():
    _, A_log, dt_bias = _weights()
    B, n = 3, 2
    slots = torch.tensor([1, 0, 2], dtype=torch.int32)
    _, state = _pools(3)
    q, k, f = torch.randn(B, n, H, K), torch.randn(B, n, H, K), torch.randn(B, n, H * K)
    v, b = torch.randn(B, n, H, V), torch.randn(B, n, H)
    kw = dict(A_log=A_log.view(1, 1, H, 1), dt_bias=dt_bias, lower_bound=LB, cache_indices=slots)
    dec_state = state.clone()
    o = kda_ops.kda_recurrent(q[None, :, 0], k[None, :, 0], v[None, :, 0], f[:, 0], b[None, :, 0],
                              ssm_states=dec_state, query_start_loc=torch.arange(B + 1, dtype=torch.int32), **kw)
    scratch = torch.full((B, n, H, V, K), float("nan"))
    o_chain = kda_ops.kda_recurrent(q.reshape(1, B * n, H, K), k.reshape(1, B * n, H, K),
                                    v.reshape(1, B * n, H, V), f.reshape(B * n, H * K), b.reshape(1, B * n, H),
                                    ssm_states=state.clone(), write_state=False, intermediate_states=scratch,
                                    intermediate_state_indices=torch.arange(B),
                                    query_start_loc=torch.arange(0, B * n + 1, n, dtype=torch.int32), **kw)
    assert_bit_exact("decode o = chain o at token 0", o_chain[0, ::n], o[0])
    assert_bit_exact("decode state = chain state after token 0", scratch[:, 0], dec_state[slots.long()])


def test_a_conv_decode_with_no_padding_matches_the_reference_and_a_verify_chain():
    conv_w = _weights()[0]
    B, n = 3, 2
    slots = torch.tensor([2, 0, 3], dtype=torch.int32)
    conv, _ = _pools(4)
    conv0 = conv.clone()
    x = torch.randn(B, D, n)
    y = kda_ops.causal_conv1d_update(x[:, :, 0], conv.transpose(-1, -2), conv_w, None, "silu",
                                     conv_state_indices=slots)
    scratch = torch.full((B, n, D, W - 1), float("nan"))
    y_chain = kda_ops.causal_conv1d_update(x, conv0.clone().transpose(-1, -2), conv_w, None, "silu",
                                           conv_state_indices=slots, intermediate_conv_window=scratch,
                                           intermediate_state_indices=torch.arange(B))
    assert_bit_exact("decode y = chain y at token 0", y_chain[:, :, 0], y)
    for i, slot in enumerate(slots.tolist()):
        want_y, want_window = short_conv_silu(x[i, :, :1].t().double(), conv_w.double(), conv0[slot].double())
        assert_close(f"conv decode y[{i}]", want_y[0], y[i], FP32_VS_FP64)
        assert_close(f"conv decode window[{i}]", want_window, conv[slot], FP32_VS_FP64)
        assert_bit_exact(f"window[{i}] = chain window after token 0", scratch[i, 0], conv[slot].t())
    assert_bit_exact("slot 1 untouched", conv0[1], conv[1])


def test_gate_without_lower_bound_is_kdas_softplus_gate():
    A_log, dt_bias = torch.randn(H), torch.randn(H * K)
    a, b = torch.randn(5, H * K), torch.randn(5, H)
    g, beta = kda_ops.gate_and_beta(a, b, A_log, dt_bias, None, H, K)
    want = -A_log.double().exp()[:, None] * torch.nn.functional.softplus(a.double().view(5, H, K)
                                                                           + dt_bias.double().view(H, K))
    assert_close("softplus gate", want, g, FP32_VS_FP64)
    assert_close("beta", torch.sigmoid(b.double()), beta, FP32_VS_FP64)
