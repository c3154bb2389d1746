"""The Triton launches a GPU server of ours makes, at K3's production shapes, for `k3 bench kernels --static`.

Reached from a server: the k3_dcp_mla backend (`dispatch.mla_dcp`: `mla_dcp_kernel`, and `merge_states_kernel` when
the keys are split), the portable model's KDA decode / verify / chunked prefill and AttnRes read, and the loader's
MXFP4 dequant. (`mxfp4_grouped_matmul` is a benchmark kernel no server calls.) Shapes come from the planner's two
presets: GB300 `agent-100k` decode TP8/DCP8 and H200 `long-context` TP16/DCP8. Under DCP the backend all-gathers the
group's query heads, so the MLA kernel sees (96 / attn-TP) * DCP heads per rank; KDA runs 96 / TP heads per rank.
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
KDA_HEADS, KDA_K, KDA_V, KDA_W = 96, 128, 128, 4
HIDDEN, BANK = 7168, 9
VERIFY_Q = 4
DECODE_SPLITS = 8  # NUM_SPLITS constexpr of a split decode (a long context on a full GPU); merge runs after it
BF16 = torch.bfloat16


@dataclass(frozen=True)
class PlanShape:
    """What one decode plan puts on a rank: MLA kernel heads (gathered over DCP) and KDA heads."""

    plan: str
    system: str
    tp: int
    dcp: int

    @property
    def mla_heads(self) -> int:
        return MLA_HEADS // self.tp * self.dcp

    @property
    def kda_heads(self) -> int:
        return KDA_HEADS // self.tp


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


def _kda_weights(h: int):
    from k3_sglang.kernels.kda.decode_common import KDAWeights

    d = 2 * h * KDA_K + h * KDA_V
    return KDAWeights(torch.zeros(d, KDA_W), torch.zeros(max(h, 128)), torch.zeros(h * KDA_K), torch.ones(KDA_V))


def _kda_step(h: int, n: int, verify: bool) -> Callable[[], object]:
    def call():
        from k3_sglang.kernels.kda.decode_common import VerifyScratch
        from k3_sglang.kernels.kda.fused_recurrent import kda_fused_decode, kda_fused_verify

        b, d = 2, 2 * h * KDA_K + h * KDA_V
        x, f = torch.zeros(b, n, d, dtype=BF16), torch.zeros(b, n, h * KDA_K, dtype=BF16)
        beta, g = torch.zeros(b, n, h, dtype=BF16), torch.zeros(b, n, h * KDA_V, dtype=BF16)
        conv, state = torch.zeros(b, KDA_W - 1, d, dtype=BF16), torch.zeros(b, h, KDA_K, KDA_V)
        slots, w = torch.arange(b), _kda_weights(h)
        if not verify:
            return kda_fused_decode(x, f, beta, g, w, conv, state, slots)
        scratch = VerifyScratch(torch.zeros(b, n, h, KDA_K, KDA_V), torch.zeros(b, n, KDA_W - 1, d, dtype=BF16),
                                torch.arange(b))
        return kda_fused_verify(x, f, beta, g, w, conv, state, slots, scratch)
    return call


def _kda_prefill(h: int) -> Callable[[], object]:
    def call():
        from k3_sglang.kernels.kda.chunk import kda_chunk_prefill

        lens, d = [70, 9], 2 * h * KDA_K + h * KDA_V
        t = sum(lens)
        cu = torch.tensor([0, lens[0], t], dtype=torch.int32)
        x, f = torch.zeros(t, d, dtype=BF16), torch.zeros(t, h * KDA_K, dtype=BF16)
        beta, g = torch.zeros(t, h, dtype=BF16), torch.zeros(t, h * KDA_V, dtype=BF16)
        conv, state = torch.zeros(2, KDA_W - 1, d, dtype=BF16), torch.zeros(2, h, KDA_K, KDA_V)
        return kda_chunk_prefill(x, f, beta, g, cu, _kda_weights(h), conv, state, torch.arange(2))
    return call


def _attn_res(t: int) -> Callable[[], object]:
    def call():
        from k3_sglang.kernels.attn_res.read import attn_res_read_triton

        return attn_res_read_triton(torch.zeros(BANK, t, HIDDEN, dtype=BF16), torch.ones(HIDDEN), 1e-5)
    return call


def _dequant() -> object:
    from k3_sglang.kernels.mxfp4.dequant import dequant_mxfp4_triton

    # the loader dequantises to fp32 (loader/weights.py); bf16 is the benchmark's form
    return [dequant_mxfp4_triton(torch.zeros(64, 3584 // 2, dtype=torch.uint8),
                                 torch.zeros(64, 3584 // 32, dtype=torch.uint8), dt) for dt in (torch.float32, BF16)]


_MLA_MODULES = ("kernels/mla/dcp_triton.py", "kernels/mla/decode.py")
_KDA_STEP = ("kernels/kda/fused_recurrent.py",)


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
    verify, prefill chunk), KDA at each preset's heads per rank, AttnRes and the MXFP4 dequant."""
    out: list[Case] = []
    for h, plans in mla_head_counts().items():
        tag = ", ".join(plans)
        out += [
            Case(f"mla_dcp decode H={h} splits={DECODE_SPLITS} [{tag}]", _MLA_MODULES, _mla(h, 1, 2, DECODE_SPLITS)),
            Case(f"mla_dcp verify q={VERIFY_Q} H={h} [{tag}]", _MLA_MODULES, _mla(h, VERIFY_Q, 2, 1)),
            Case(f"mla_dcp prefill-chunk H={h} [{tag}]", _MLA_MODULES, _mla(h, None, 2, 1)),
        ]
    for s in plan_shapes():
        tag = f"{s.system} TP{s.tp}"
        out += [
            Case(f"kda decode H={s.kda_heads} [{tag}]", _KDA_STEP, _kda_step(s.kda_heads, 1, False)),
            Case(f"kda verify q={VERIFY_Q} H={s.kda_heads} [{tag}]", _KDA_STEP, _kda_step(s.kda_heads, VERIFY_Q, True)),
            Case(f"kda prefill-chunk H={s.kda_heads} [{tag}]", ("kernels/kda/chunk.py",), _kda_prefill(s.kda_heads)),
        ]
    out += [
        Case(f"attn_res read D={HIDDEN} N={BANK}", ("kernels/attn_res/read.py",), _attn_res(8)),
        Case("mxfp4 dequant expert [*, 3584] fp32/bf16", ("kernels/mxfp4/dequant.py",), _dequant),
    ]
    return out
