"""SGLang's `extra_buffer` prefix-cache contract for the portable KDA layer: state snapshots in the track slots.

With `--mamba-radix-cache-strategy extra_buffer` SGLang's scheduler gives each request two spare "ping-pong" slots
in the mamba pool and, per forward, names the requests to snapshot (`mamba_track_mask`), the slot to write
(`mamba_track_indices`, translated by the hybrid backend's forward metadata) and, for an extend, how many of the
chunk's tokens the snapshot covers (`ForwardBatch.mamba_track_aligned_lens()`: a multiple of
`mamba_cache_chunk_size`, floored; SGLang's `_force_track_h` +1 cancels under the floor). The radix tree later
names that slot as the state at depth prefix_len + aligned_len and copies it into a new request's slot on a hit.

What SGLang's own KDA backend (srt/layers/attention/linear/kda_backend.py, `forward_extend` and
`_track_mamba_state_extend` in hybrid_linear_attn_backend.py) leaves in a track slot, and so what this module
writes, per KDA layer and in the pool's own layout:
  conv [track] = the W-1 pre-conv q|k|v rows ending at token aligned_len of the extend (oldest first)
  temporal [track] = the recurrent state after those aligned_len tokens (fp32)
  decode: both copied from the request's slot after the step, for rows whose new seq_len hits the track grid.

The portable prefill (dispatch.kda_prefill) only returns final states, so an extend whose snapshot falls inside
the chunk runs in two passes split at aligned_len (a multiple of the 64-token KDA chunk, so the chunk grid is the
same): after the first pass each tracked request's own slot holds exactly the snapshot, which is copied to its
track slot before the second pass continues from it. Engine-independent pieces (`split_extend`, `packed_rows`)
are pure; `snapshot_plan` is the thin SGLang adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class SnapshotPlan:
    """Which batch rows leave a state snapshot, where, and after how many of their tokens.

    rows: batch rows to snapshot; lens: tokens of that row's extend the snapshot covers (decode: 1, the step);
    dst: [len(rows)] int64 track slots (negative = the scheduler freed the request: write nothing)."""

    rows: tuple[int, ...]
    lens: tuple[int, ...]
    dst: torch.Tensor


def split_extend(extend_lens: list[int], plan: SnapshotPlan) -> tuple[list[int], list[int]]:
    """Per request (first, rest): the tokens the first prefill pass runs and those the second continues with.

    A tracked row's first pass stops at its snapshot (lens clamped to [0, extend_len]); an untracked row runs whole
    in the first pass. first[i] + rest[i] == extend_lens[i]."""
    first = list(extend_lens)
    for row, n in zip(plan.rows, plan.lens):
        first[row] = max(0, min(int(n), extend_lens[row]))
    return first, [e - f for e, f in zip(extend_lens, first)]


def packed_rows(starts: list[int], offsets: list[int], lens: list[int]) -> list[int]:
    """Packed token indices of rows starts[i] + offsets[i] + [0, lens[i]) for every request i, in request order."""
    out: list[int] = []
    for s, o, n in zip(starts, offsets, lens):
        out.extend(range(s + o, s + o + n))
    return out


def copy_snapshots(conv: torch.Tensor, temporal: torch.Tensor, slots: torch.Tensor, plan: SnapshotPlan) -> None:
    """conv [S, W-1, D] and temporal [S, H, K, V] pools: track slot <- the request's slot, for the planned rows
    whose source and destination are both real slots (>= 0)."""
    if not plan.rows:
        return
    src = slots[torch.tensor(plan.rows, dtype=torch.long, device=slots.device)].long()
    dst = plan.dst.to(device=slots.device, dtype=torch.long)
    keep = (src >= 0) & (dst >= 0)
    if not bool(keep.all()):
        src, dst = src[keep], dst[keep]
    if src.numel():
        conv[dst] = conv[src]
        temporal[dst] = temporal[src]


PrefillFn = Callable[..., torch.Tensor]  # (mixed_qkv, f, b, g_out, cu_seqlens, slots, has_state) -> o [T, H*V]


def prefill_with_snapshots(prefill: PrefillFn, mixed_qkv: torch.Tensor, f: torch.Tensor, b: torch.Tensor,
                           g_out: torch.Tensor, query_start_loc: torch.Tensor, conv: torch.Tensor,
                           temporal: torch.Tensor, slots: torch.Tensor, has_state: torch.Tensor,
                           plan: SnapshotPlan | None) -> torch.Tensor:
    """Varlen KDA prefill (mixed_qkv [T, D], f [T, H*K], b [T, H], g_out [T, H*V], query_start_loc [N+1], slots [N],
    has_state [N] bool) that also leaves plan's snapshots in the track slots. Returns o [T, H*V]."""
    if plan is None or not plan.rows:
        return prefill(mixed_qkv, f, b, g_out, query_start_loc, slots, has_state)
    starts = [int(v) for v in query_start_loc.tolist()]
    extend_lens = [hi - lo for lo, hi in zip(starts[:-1], starts[1:])]
    first, rest = split_extend(extend_lens, plan)
    if not any(rest):  # every snapshot is the chunk's final state
        o = prefill(mixed_qkv, f, b, g_out, query_start_loc, slots, has_state)
        copy_snapshots(conv, temporal, slots, plan)
        return o
    o = mixed_qkv.new_empty(mixed_qkv.shape[0], g_out.shape[1])
    dev = mixed_qkv.device

    def run(lens: list[int], offsets: list[int], keep: list[int], pass_slots, pass_state) -> None:
        rows = torch.tensor(packed_rows([starts[i] for i in keep], [offsets[i] for i in keep], [lens[i] for i in keep]),
                            dtype=torch.long, device=dev)
        cu = torch.tensor([0] + [lens[i] for i in keep], dtype=query_start_loc.dtype, device=dev).cumsum(0)
        cu = cu.to(query_start_loc.dtype)
        o[rows] = prefill(*(t.index_select(0, rows) for t in (mixed_qkv, f, b, g_out)), cu, pass_slots, pass_state)

    everyone = list(range(len(extend_lens)))
    # A request whose first pass is empty is skipped there (slot -1): the kernels then touch nothing of it.
    first_slots = torch.where(torch.tensor(first, device=slots.device) > 0, slots, torch.full_like(slots, -1))
    run(first, [0] * len(first), everyone, first_slots, has_state)
    copy_snapshots(conv, temporal, slots, plan)
    later = [i for i in everyone if rest[i] > 0]
    idx = torch.tensor(later, dtype=torch.long, device=slots.device)
    cont = has_state.index_select(0, idx.to(has_state.device)) | (torch.tensor(first, device=has_state.device)[idx] > 0)
    run(rest, first, later, slots.index_select(0, idx), cont)
    return o


def snapshot_plan(forward_batch, track_slots: torch.Tensor | None) -> SnapshotPlan | None:
    """The snapshots SGLang asks this forward for (None: extra_buffer off or nothing tracked).

    track_slots: the hybrid backend's `forward_metadata.mamba_track_indices` (physical slots, one per batch row)."""
    mask = getattr(forward_batch, "mamba_track_mask", None)
    if mask is None or track_slots is None:
        return None
    mode = forward_batch.forward_mode
    if mode.is_decode():
        rows = [i for i, m in enumerate(mask.tolist()) if m]
        lens = [1] * len(rows)
    elif mode.is_extend() and not mode.is_target_verify():
        cpu_mask = getattr(forward_batch, "mamba_prefill_track_mask_cpu", None)
        rows = [i for i, m in enumerate(cpu_mask if cpu_mask is not None else mask.tolist()) if m]
        if not rows:
            return None
        aligned = forward_batch.mamba_track_aligned_lens()
        if aligned is None:
            return None
        lens = [int(aligned[i]) for i in rows]
    else:
        return None
    if not rows:
        return None
    dst = track_slots.long()[torch.tensor(rows, dtype=torch.long, device=track_slots.device)]
    return SnapshotPlan(rows=tuple(rows), lens=tuple(lens), dst=dst)
