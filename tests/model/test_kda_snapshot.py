"""SGLang's extra_buffer contract in the portable KDA layer (k3_sglang/model/kda_snapshot.py): after an extend or a
decode step each tracked request's track slot holds the conv window and recurrent state at its snapshot position,
against float64 references built from the naive ops. Track slots start NaN-poisoned, so a snapshot that is not
written fails; untracked track slots and every other pool row must stay bit-identical."""
from __future__ import annotations

import copy
import functools

import pytest
import torch

from k3_sglang.kernels import dispatch
from k3_sglang.model.kda_layer import KDAStateView
from k3_sglang.model.kda_snapshot import SnapshotPlan, packed_rows, split_extend
from tests.model.test_model_through_dispatch import BACKENDS, CFG, _kda_mixer, _kda_pools, _reference_token
from tests.utils.numerics import FP32_VS_FP64, assert_bit_exact, assert_close

NAN = float("nan")


def _plan(rows, lens, dst) -> SnapshotPlan:
    return SnapshotPlan(rows=tuple(rows), lens=tuple(lens), dst=torch.tensor(dst, dtype=torch.long))


def test_split_extend_and_packed_rows_against_a_plain_loop():
    gen = torch.Generator().manual_seed(3)
    for _ in range(200):
        n = int(torch.randint(1, 6, (1,), generator=gen))
        lens = torch.randint(0, 300, (n,), generator=gen).tolist()
        rows = [i for i in range(n) if torch.rand(1, generator=gen).item() < 0.5]
        snap = [int(torch.randint(-5, 320, (1,), generator=gen)) for _ in rows]
        first, rest = split_extend(lens, _plan(rows, snap, [0] * len(rows)))
        for i in range(n):
            want = max(0, min(snap[rows.index(i)], lens[i])) if i in rows else lens[i]
            assert (first[i], rest[i]) == (want, lens[i] - want)
        starts = [sum(lens[:i]) for i in range(n)]
        got = packed_rows(starts, first, rest)
        want_rows = [starts[i] + first[i] + t for i in range(n) for t in range(rest[i])]
        assert got == want_rows
        assert sorted(packed_rows(starts, [0] * n, first) + got) == list(range(sum(lens)))


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_extend_leaves_snapshots_in_track_slots(monkeypatch, backend, device):
    """Batch: request 0 fresh (slot 5) snapshotted inside its chunk at 128 of 150 tokens (track slot 8), request 1
    continuing slot 2 snapshotted at its chunk end 64 (track slot 9), request 2 untracked (slot 3, its track slot 10
    must stay poisoned), request 3 padding."""
    monkeypatch.setattr(dispatch, "kda_prefill", functools.partial(dispatch.kda_prefill, backend=backend))
    mixer = _kda_mixer()
    conv0, state0 = _kda_pools(12, live=[2, 3])
    for t in (conv0, state0):
        t[8:11] = NAN
    conv, state = conv0.to(device, copy=True), state0.to(device, copy=True)
    lens = [150, 64, 70, 5]
    x = torch.randn(sum(lens), CFG.hidden_size)
    qsl = torch.tensor([0, 150, 214, 284, 289], device=device)
    view = KDAStateView(conv=conv, temporal=state, slots=torch.tensor([5, 2, 3, -1], device=device),
                        query_start_loc=qsl, snapshots=_plan([0, 1], [128, 64], [8, 9]))
    with torch.no_grad():
        out = copy.deepcopy(mixer).to(device).forward_extend(x.to(device), view, [0, 64, 192, 0]).cpu()
        ref0, win0, S0 = _reference_token(mixer, x[:150], None, None)
        _, snap_win0, snap_S0 = _reference_token(mixer, x[:128], None, None)
        ref1, win1, S1 = _reference_token(mixer, x[150:214], conv0[2], state0[2])
        ref2, win2, S2 = _reference_token(mixer, x[214:284], conv0[3], state0[3])
    conv, state = conv.cpu(), state.cpu()
    for name, ref, got in [("request 0 output", ref0, out[:150]), ("request 1 output", ref1, out[150:214]),
                           ("request 2 output", ref2, out[214:284]), ("request 0 final state", S0, state[5]),
                           ("request 0 final window", win0, conv[5]), ("request 1 final state", S1, state[2]),
                           ("request 2 final state", S2, state[3]), ("request 0 snapshot state", snap_S0, state[8]),
                           ("request 0 snapshot window", snap_win0, conv[8]), ("request 1 snapshot state", S1, state[9]),
                           ("request 1 snapshot window", win1, conv[9])]:
        assert_close(name, ref, got, FP32_VS_FP64)
    # the window holds pre-conv rows: the snapshot's are exactly the projected rows 125..127 of request 0
    pre = copy.deepcopy(mixer).project(x[125:128])[0]
    assert_close("request 0 snapshot window rows", pre, conv[8], 1e-6)
    for row in (0, 1, 4, 6, 7, 10, 11):
        assert_bit_exact(f"state row {row}", state0[row], state[row])
        assert_bit_exact(f"conv row {row}", conv0[row], conv[row])


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_decode_step_copies_the_new_state_to_track_slots(monkeypatch, backend, device):
    """Rows 0 and 2 hit the track grid (track slots 6 and -1: the second was freed by the scheduler), row 1 not."""
    monkeypatch.setattr(dispatch, "kda_decode", functools.partial(dispatch.kda_decode, backend=backend))
    mixer = _kda_mixer()
    conv0, state0 = _kda_pools(8, live=[1, 2, 3])
    for t in (conv0, state0):
        t[6:8] = NAN
    conv, state = conv0.to(device, copy=True), state0.to(device, copy=True)
    x = torch.randn(3, CFG.hidden_size)
    view = KDAStateView(conv=conv, temporal=state, slots=torch.tensor([1, 2, 3], device=device),
                        query_start_loc=torch.arange(4, device=device), snapshots=_plan([0, 2], [1, 1], [6, -1]))
    with torch.no_grad():
        copy.deepcopy(mixer).to(device).forward_decode(x.to(device), view)
        _, window, S = _reference_token(mixer, x[:1], conv0[1], state0[1])
    conv, state = conv.cpu(), state.cpu()
    assert_close("snapshot state", S, state[6], FP32_VS_FP64)
    assert_close("snapshot window", window, conv[6], FP32_VS_FP64)
    assert_bit_exact("snapshot equals the live slot (state)", state[1], state[6])
    assert_bit_exact("snapshot equals the live slot (conv)", conv[1], conv[6])
    for row in (0, 4, 5, 7):
        assert_bit_exact(f"state row {row}", state0[row], state[row])
        assert_bit_exact(f"conv row {row}", conv0[row], conv[row])
