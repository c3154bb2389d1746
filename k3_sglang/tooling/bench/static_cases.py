"""The Triton launches a GPU server of ours makes, at K3's production shapes, for `k3 bench kernels --static`.

Reached from a server: the k3_dcp_mla backend (`dispatch.mla_dcp`: `mla_dcp_kernel`, and `merge_states_kernel` when
the keys are split), our only Triton kernels (SGLang's K3 runs SGLang's own KDA, AttnRes and MXFP4 kernels). Shapes
come from the planner's two presets: GB300 `agent-100k` decode TP8/DCP8 and H200 `long-context` TP16/DCP8. Under
DCP the backend all-gathers the group's query heads, so the MLA kernel sees (96 / attn-TP) * DCP heads per rank.
The MLA kernel is compiled at every head count DCP 1/2/4/8 gives under those TPs (6 to 96).
KV cache: bf16 only (k3_dcp_mla keeps a bf16 latent cache; the planner refuses fp8 KV for it), page size 64.
Query lengths: decode 1, target verify 4 (K3_CSV draft width), a prefill chunk of ragged requests.
Each case builds tiny CPU tensors of the right dtypes and calls the real launch wrapper inside `static_compile.capture`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from k3_sglang.plan.presets import plan_preset

MLA_HEADS, MLA_LAT, MLA_V, PAGE = 96, 576, 512, 64
VERIFY_Q = 4
DECODE_SPLITS = 8  # NUM_SPLITS constexpr of a split decode (a long context on a full GPU); merge runs after it
BF16 = torch.bfloat16


@dataclass(frozen=True)
class PlanShape:
    """What one decode plan puts on a rank: MLA kernel heads (gathered over DCP)."""

    plan: str
    system: str
    tp: int
    dcp: int

    @property
    def mla_heads(self) -> int:
        return MLA_HEADS // self.tp * self.dcp


def plan_shapes() -> list[PlanShape]:
    """The DCP groups of the planner's presets (one per preset)."""
    out = []
    for name in ("agent-100k", "long-context"):
        p = plan_preset(name)
        g = next(g for g in p["groups"] if g.get("dcp", 1) > 1)
        out.append(PlanShape(name, p["system"], g["tp"], g["dcp"]))
    return out


@dataclass(frozen=True)
class Case:
    """One launch wrapper call: an id, the source modules it compiles from (the cache key) and the call itself."""

    id: str
    modules: tuple[str, ...]
    call: Callable[[], object]


def _mla(h: int, q_len: int | None, cp_world: int, splits: int) -> Callable[[], object]:
    def call():
        from k3_sglang.kernels.mla.dcp_triton import mla_dcp_attention_triton

        lens = [q_len or 1] * 2 if q_len else [5, 11]
        b = len(lens)
        q = torch.zeros(sum(lens), h, MLA_LAT, dtype=BF16)
        pool = torch.zeros(4 * PAGE, MLA_LAT, dtype=BF16)
        table = torch.arange(2 * b, dtype=torch.int32).view(b, 2)
        q_indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        kv = torch.full((b,), 100, dtype=torch.int32)
        return mla_dcp_attention_triton(q, pool, table, q_indptr, kv, kv * cp_world, PAGE, cp_world, 0, MLA_V,
                                        192 ** -0.5, q_len=q_len, num_splits=splits)
    return call


_MLA_MODULES = ("kernels/mla/dcp_triton.py", "kernels/mla/decode.py")


DCP_SIZES = (1, 2, 4, 8)  # the roofline's rows (docs/roofline.md); the presets run DCP8


def mla_head_counts() -> dict[int, list[str]]:
    """MLA kernel heads per rank -> the plans (system TPx/DCPy) that give it, over DCP 1/2/4/8 of each preset's TP."""
    heads: dict[int, list[str]] = {}
    for s in plan_shapes():
        for dcp in DCP_SIZES:
            shape = PlanShape(s.plan, s.system, s.tp, dcp)
            heads.setdefault(shape.mla_heads, []).append(f"{s.system} TP{s.tp}/DCP{dcp}")
    return dict(sorted(heads.items()))


def cases() -> list[Case]:
    """Every launch to compile: the MLA kernel at every head count of DCP 1/2/4/8 under the presets' TP (decode,
    verify, prefill chunk)."""
    out: list[Case] = []
    for h, plans in mla_head_counts().items():
        tag = ", ".join(plans)
        out += [
            Case(f"mla_dcp decode H={h} splits={DECODE_SPLITS} [{tag}]", _MLA_MODULES, _mla(h, 1, 2, DECODE_SPLITS)),
            Case(f"mla_dcp verify q={VERIFY_Q} H={h} [{tag}]", _MLA_MODULES, _mla(h, VERIFY_Q, 2, 1)),
            Case(f"mla_dcp prefill-chunk H={h} [{tag}]", _MLA_MODULES, _mla(h, None, 2, 1)),
        ]
    return out
