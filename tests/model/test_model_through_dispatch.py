"""The portable model's KDA and MLA layers through `kernels.dispatch`, on CPU, against float64 references built from
the naive ops: padding slots (-1, SGLang's CUDA-graph decode padding) leave every pool row untouched, and the MLA
decode (through the k3_dcp_mla kernel, `dispatch.mla_dcp`) is sized from the real seq_lens even when seq_lens_cpu
holds a capture-time fill value."""
from __future__ import annotations

import copy
import functools
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers import radix_attention  # noqa: F401 - the MLA layer builds SGLang's RadixAttention

from k3_sglang.config import preset
from k3_sglang.kernels import dispatch
from k3_sglang.kernels.kda.naive import chunk_kda, gated_rms_norm, kda_gate, kda_recurrent_step, l2_normalize, short_conv_silu
from k3_sglang.kernels.mla.decode_torch import mla_decode_absorbed_padded
from k3_sglang.kernels.mla.naive import mla_decode_absorbed
from k3_sglang.model.kda_layer import KDAMixer, KDAStateView
from tests.utils.numerics import FP32_VS_FP64, assert_bit_exact, assert_close

POISON = 1e30
CFG = preset("k3-tiny")
KDA_LAYER = CFG.kda.layer_ids[0]
# (backend, device): torch and interpreted Triton on CPU; compiled Triton on a GPU (K3_KERNEL_TESTS_ON_GPU=1)
BACKENDS = [("torch", "cpu"), pytest.param("triton", "cpu", marks=pytest.mark.triton),
            pytest.param("triton", "cuda", marks=pytest.mark.gpu)]


def _force(monkeypatch, op: str, backend: str) -> None:
    """Make the model's dispatch call of `op` use `backend` (the model itself passes none: device default)."""
    monkeypatch.setattr(dispatch, op, functools.partial(getattr(dispatch, op), backend=backend))


def _kda_mixer() -> KDAMixer:
    mixer = KDAMixer(CFG, KDA_LAYER)
    with torch.no_grad():
        for p in mixer.parameters():
            p.normal_(0, 0.2)
        mixer.A_log.uniform_(-1.0, 1.0)
        mixer.o_norm.weight.uniform_(0.5, 1.5)
    return mixer


def _kda_pools(num_slots: int, live: list[int]):
    H, K, P, W = CFG.kda.num_heads, CFG.kda.head_dim, CFG.kda.proj_dim, CFG.kda.conv_kernel_size
    conv = torch.full((num_slots, W - 1, 3 * P), POISON)
    state = torch.full((num_slots, H, K, K), POISON)
    for s in live:
        conv[s], state[s] = torch.randn(W - 1, 3 * P), torch.randn(H, K, K) * 0.3
    return conv, state


def _reference_token(mixer: KDAMixer, x: torch.Tensor, window: torch.Tensor | None, state: torch.Tensor | None):
    """float64, independent of naive_decode: x [T, hidden] of one request -> (out [T, hidden], window, state)."""
    m = copy.deepcopy(mixer).double()
    H, K = m.num_heads, m.head_dim
    pre, f, b, og = m.project(x.double())
    y, window = short_conv_silu(pre, m.kernel_args()[0].conv_weight, None if window is None else window.double())
    q, k, v = y.split(m.proj_dim, -1)
    q, k = l2_normalize(q.reshape(-1, H, K)), l2_normalize(k.reshape(-1, H, K))
    g = kda_gate(f.view(-1, H, K), m.A_log, m.dt_bias, m.lower_bound)
    o, S = chunk_kda(q, k, v.reshape(-1, H, K), g, torch.sigmoid(b), m.scale,
                     None if state is None else state.double(), 64)
    o = gated_rms_norm(o, og.view(-1, H, K), m.o_norm.weight, m.eps)
    return m.o_proj(o.reshape(o.shape[0], -1)), window, S


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_kda_decode_padding_slot_touches_no_live_slot(monkeypatch, backend, device):
    """slots [1, -1] on a 5-row pool: -1 must not wrap onto row 4 (a live request's state), nor touch any row."""
    _force(monkeypatch, "kda_decode", backend)
    mixer = _kda_mixer()
    conv0, state0 = _kda_pools(5, live=[1, 4])
    conv, state = conv0.to(device, copy=True), state0.to(device, copy=True)
    x = torch.randn(2, CFG.hidden_size)
    view = KDAStateView(conv=conv, temporal=state, slots=torch.tensor([1, -1], device=device),
                        query_start_loc=torch.tensor([0, 1, 2], device=device))
    with torch.no_grad():
        out = copy.deepcopy(mixer).to(device).forward_decode(x.to(device), view).cpu()
        ref, window, S = _reference_token(mixer, x[:1], conv0[1], state0[1])
    conv, state = conv.cpu(), state.cpu()
    assert_close("live request's output", ref, out[:1], FP32_VS_FP64)
    assert_close("live request's state", S, state[1], FP32_VS_FP64)
    assert_bit_exact("live request's window shift", conv0[1][1:], conv[1][:-1])
    assert_close("live request's new window row", window[-1], conv[1][-1], FP32_VS_FP64)
    assert bool((out[1] == 0).all()), "a padding request outputs 0"
    for row in (0, 2, 3, 4):  # row 4 is where a wrapped -1 would land
        assert_bit_exact(f"state row {row}", state0[row], state[row])
        assert_bit_exact(f"conv row {row}", conv0[row], conv[row])


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_kda_extend_through_dispatch(monkeypatch, backend, device):
    """A fresh prompt and a continued one (cached prefix) in one batch, plus a padding request."""
    _force(monkeypatch, "kda_prefill", backend)
    mixer = _kda_mixer()
    conv0, state0 = _kda_pools(6, live=[2])
    conv, state = conv0.to(device, copy=True), state0.to(device, copy=True)
    lens = [7, 70, 3]  # request 0 fresh into slot 5, request 1 continues slot 2, request 2 is padding
    x = torch.randn(sum(lens), CFG.hidden_size)
    view = KDAStateView(conv=conv, temporal=state, slots=torch.tensor([5, 2, -1], device=device),
                        query_start_loc=torch.tensor([0, 7, 77, 80], device=device))
    with torch.no_grad():
        out = copy.deepcopy(mixer).to(device).forward_extend(x.to(device), view, [0, 12, 0]).cpu()
        ref0, win0, S0 = _reference_token(mixer, x[:7], None, None)
        ref1, win1, S1 = _reference_token(mixer, x[7:77], conv0[2], state0[2])
    conv, state = conv.cpu(), state.cpu()
    assert_close("fresh request", ref0, out[:7], FP32_VS_FP64)
    assert_close("continued request", ref1, out[7:77], FP32_VS_FP64)
    assert_close("fresh state", S0, state[5], FP32_VS_FP64)
    assert_close("continued state", S1, state[2], FP32_VS_FP64)
    assert_close("fresh window", win0, conv[5], FP32_VS_FP64)  # the last W-1 projected rows
    assert_close("continued window", win1, conv[2], FP32_VS_FP64)
    for row in (0, 1, 3, 4):
        assert_bit_exact(f"state row {row}", state0[row], state[row])


class _FakeMLAPool:
    """SGLang's MLA token pool surface the layer uses: set_mla_kv_buffer / get_key_buffer on one [N, 1, L] buffer."""

    def __init__(self, rows: torch.Tensor):
        self.buffer = rows[:, None].clone()

    def set_mla_kv_buffer(self, layer, loc, k_nope, k_rope):
        self.buffer[loc] = torch.cat([k_nope, k_rope], -1)

    def get_key_buffer(self, layer_id):
        return self.buffer


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_mla_decode_sized_from_live_seq_lens_not_capture_fill(monkeypatch, backend, device):
    """seq_lens_cpu holds 1 (what SGLang's graph capture fills in) while the real lengths are 5 and 9: every
    request must still attend all of its rows."""
    from k3_sglang.model.mla_attention import mla_attention
    from k3_sglang.model.mla_layer import MLAMixer
    from k3_sglang.parallel.tp import Shard

    _force(monkeypatch, "mla_dcp", backend)
    mla = CFG.mla
    mixer = MLAMixer(CFG, CFG.mla.layer_ids[0])
    L, C = mla.latent_dim, mla.kv_lora_rank
    N, B = 40, 2
    pool = _FakeMLAPool(torch.randn(N, L, device=device))
    req_to_token = torch.full((4, 16), N - 1, dtype=torch.int32)  # unused entries point at a row never attended
    seq_lens = torch.tensor([5, 9])
    req_to_token[3, :5] = torch.tensor([0, 7, 3, 12, 20])  # the last one is this step's row (out_cache_loc)
    req_to_token[1, :9] = torch.tensor([1, 2, 30, 31, 8, 9, 10, 11, 21])
    backend_obj = SimpleNamespace(token_to_kv_pool=pool,
                                  req_to_token_pool=SimpleNamespace(req_to_token=req_to_token.to(device)))
    monkeypatch.setattr("sglang.srt.model_executor.forward_context.get_attn_backend", lambda: backend_obj)
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: True),
                            out_cache_loc=torch.tensor([20, 21], device=device),
                            req_pool_indices=torch.tensor([3, 1], device=device), seq_lens=seq_lens.to(device),
                            seq_lens_cpu=torch.ones(B, dtype=torch.int64))
    q_lat, rows = torch.randn(B, mla.num_heads, L), torch.randn(B, L)
    with torch.no_grad():
        o = mla_attention(mixer.attn, q_lat.to(device), rows.to(device), batch, C, Shard())
        o = o.view(B, mla.num_heads, C).cpu()
    keys = pool.buffer[:, 0].cpu()
    assert_bit_exact("this step's rows written", rows, keys[[20, 21]])
    indices = torch.cat([req_to_token[3, :5], req_to_token[1, :9]]).long()
    o_ref, _ = mla_decode_absorbed(q_lat.double(), keys.double(), indices, torch.tensor([0, 5, 14]), C, mixer.attn.scaling)
    assert_close("o_lat", o_ref, o, FP32_VS_FP64)
    short, _ = mla_decode_absorbed(q_lat.double(), keys.double(), indices[[0, 5]], torch.tensor([0, 1, 2]), C,
                                   mixer.attn.scaling)
    assert (short - o_ref).norm() > 0.1 * o_ref.norm(), "the test must tell a fill-sized gather from the real one"


def test_padded_torch_mla_decode_matches_reference():
    B, Hh, C, R, N = 4, 3, 16, 8, 64
    lens = [5, 0, 37, 1]
    pool = torch.randn(N, C + R)
    used = torch.randperm(N)[: sum(lens)]
    pool[[i for i in range(N) if i not in set(used.tolist())]] = float("nan")  # rows nobody reads
    indptr = torch.tensor([0, 5, 5, 42, 43])
    q_lat = torch.randn(B, Hh, C + R)
    o_ref, lse_ref = mla_decode_absorbed(q_lat.double(), pool.double(), used, indptr, C, 0.2)
    o, lse = mla_decode_absorbed_padded(q_lat, pool, used, indptr, C, 0.2)
    assert o.dtype == torch.float32 and lse.dtype == torch.float32
    assert_close("o", o_ref, o, FP32_VS_FP64)
    assert_close("lse", lse_ref, lse, FP32_VS_FP64)  # -inf for the empty request matches exactly
    assert bool((o[1] == 0).all())



@pytest.mark.gpu
def test_mla_block_table_refuses_cuda_graph_capture():
    """A table sized inside a capture would be frozen at replay: capture is an explicit error, not a wrong graph."""
    from k3_sglang.dcp_mla.metadata import stripe_batch

    req_to_token = torch.arange(40, dtype=torch.int32, device="cuda").view(4, 10)
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: True), seq_lens=torch.tensor([3, 4],
                            device="cuda"), req_pool_indices=torch.tensor([1, 2], device="cuda"))
    stripe_batch(batch, req_to_token, 1, 1, 0)  # eager: fine
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="cannot run under CUDA-graph capture"):
        with torch.cuda.graph(graph):
            stripe_batch(batch, req_to_token, 1, 1, 0)
