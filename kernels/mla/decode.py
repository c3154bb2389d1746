"""Triton: the exact merge of partial (output, lse) pairs, and the KV split count of a flash-decoding launch.

The absorbed MLA decode itself is the k3_dcp_mla kernel (`dcp_triton.py`, one rank's stripe; c = 1 is plain
decode), which splits long stripes over the KV length and merges the fp32 partials here.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def merge_states_kernel(o_ptr, lse_ptr, out_ptr, out_lse_ptr, P, rows, D, BD: tl.constexpr):
    i_r, i_d = tl.program_id(0), tl.program_id(1)
    dd = i_d * BD + tl.arange(0, BD)
    md = dd < D
    m = tl.load(lse_ptr + i_r).to(tl.float32)
    for p in range(1, P):
        m = tl.maximum(m, tl.load(lse_ptr + p * rows + i_r).to(tl.float32))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = m_safe * 0.0
    acc = tl.zeros([BD], tl.float32)
    for p in range(P):
        w = tl.exp(tl.load(lse_ptr + p * rows + i_r).to(tl.float32) - m_safe)
        o = tl.load(o_ptr + (p * rows + i_r) * D + dd, mask=md, other=0.0).to(tl.float32)
        acc += tl.where(w > 0, w * o, 0.0)  # an empty partial (lse = -inf) is ignored even if its o is NaN
        total += w
    out = tl.where(total > 0, acc / tl.where(total > 0, total, 1.0), 0.0)
    tl.store(out_ptr + i_r * D + dd, out.to(out_ptr.dtype.element_ty), mask=md)
    if i_d == 0:
        tl.store(out_lse_ptr + i_r, m + tl.log(total))


def merge_attention_states_triton(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact merge of P >= 1 partials: outs [P, B, H, D], lses [P, B, H] fp32 (-inf = empty partial).

    Returns (o [B, H, D] in outs.dtype, lse [B, H] fp32); all-empty gives o = 0, lse = -inf.
    """
    if outs.dim() != 4 or tuple(lses.shape) != tuple(outs.shape[:3]) or outs.shape[0] < 1:
        raise ValueError(f"merge_attention_states: outs {tuple(outs.shape)} must be [P>=1, B, H, D], lses {tuple(lses.shape)} [P, B, H]")
    assert outs.is_contiguous() and lses.is_contiguous(), "merge_attention_states: partials must be contiguous"
    P, B, H, D = outs.shape
    out = torch.empty(B, H, D, dtype=outs.dtype, device=outs.device)
    out_lse = torch.empty(B, H, dtype=torch.float32, device=outs.device)
    BD = min(triton.next_power_of_2(D), 512)
    merge_states_kernel[(B * H, triton.cdiv(D, BD))](outs, lses, out, out_lse, P, B * H, D, BD=BD)
    return out, out_lse


def default_num_splits(B: int, head_blocks: int, longest: int, device: torch.device) -> int:
    """Enough splits for ~2 programs per SM, but at least 256 rows per split and at most 64 splits."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    want = triton.cdiv(2 * sms, max(1, B * head_blocks))
    return max(1, min(64, want, triton.cdiv(longest, 256)))
