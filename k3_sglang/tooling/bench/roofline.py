"""`k3 bench roofline`: what one decode step of K3's MLA layers costs per rank, from K3's real dimensions.

Per rank and per request (batch 1; the KV terms grow with the batch, the weights do not), for a context of S tokens
under DCP c with attention-TP t (the planner's presets: H200 TP16, GB300 TP8):
- keys read per MLA layer: ceil(S / c) rows of the latent cache (kv_lora_rank + qk_rope = 576 bf16, 1152 B);
- kernel heads: (96 / t) * c (the DCP group's heads, all-gathered), q in and o out bf16 [heads, 576] / [heads, 512];
- attention flops per layer: 2 * heads * keys * (576 + 512) (absorbed q.k over the latent and rope, p.V over 512);
- MLA weights per rank and layer: the attention-TP share of q_a/q_b/kv_a/kv_b/gate/o_proj plus the replicated norms
  (k3_sglang.plan.weights.mla_attention), read once per step whatever the batch;
- times 24 MLA layers. Step time at 100 % and 70 % of the HBM bandwidth, attention core (KV + q/o) and whole MLA
  (plus weights); arithmetic intensity of the attention core against the device's ridge point (flops per byte at
  which bf16 dense tensor throughput and HBM bandwidth take the same time).
`bench/gpu_check.py --roofline` measures the same rows' attention core on a lent GPU (one rank, c keys of S).

    k3 bench roofline            # print the tables
    k3 bench roofline --write    # and write docs/roofline.md
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from k3_sglang.config import K3Config
from k3_sglang.config_presets import k3_full
from k3_sglang.plan.weights import mla_attention

BF16 = 2
CONTEXTS = (32 * 1024, 128 * 1024, 1024 * 1024)
DCP_SIZES = (1, 2, 4, 8)
FRACTIONS = (1.0, 0.7)
DOC = Path(__file__).resolve().parents[3] / "docs" / "roofline.md"


@dataclass(frozen=True)
class Device:
    """HBM bandwidth (bytes/s), dense bf16 tensor throughput (flop/s) and SMs of one GPU (vendor figures)."""

    name: str
    hbm_bytes_s: float
    bf16_flops_s: float
    sms: int
    attn_tp: int  # the planner preset's attention-TP on this system

    @property
    def ridge(self) -> float:
        """Flops per byte where compute and memory take the same time."""
        return self.bf16_flops_s / self.hbm_bytes_s


DEVICES = (
    Device("H200", 4.8e12, 989e12, 132, 16),  # long-context preset: TP16/DCP8 over two 8xH200 nodes
    Device("GB300", 8.0e12, 2500e12, 160, 8),  # agent-100k preset: TP8/DCP8 decode on an NVL72 rack
)


@dataclass(frozen=True)
class Row:
    """One rank's MLA work for one decode step of one request (all 24 MLA layers)."""

    device: str
    dcp: int
    context: int
    heads: int  # kernel heads per rank
    keys: int  # keys per rank per layer
    kv_bytes: int  # latent cache rows read, all layers
    qo_bytes: int  # q in, o out of the attention kernel, all layers
    weight_bytes: int  # MLA weights per rank, all layers
    flops: int  # attention core, all layers

    @property
    def core_bytes(self) -> int:
        return self.kv_bytes + self.qo_bytes

    @property
    def intensity(self) -> float:
        return self.flops / self.core_bytes


def mla_decode_row(cfg: K3Config, device: Device, dcp: int, context: int) -> Row:
    """Bytes and flops of one decode step's MLA layers on one rank (batch 1), see the module docstring."""
    m = cfg.mla
    if m.num_heads % device.attn_tp:
        raise ValueError(f"roofline: {m.num_heads} heads do not split over attention-TP {device.attn_tp}")
    heads = m.num_heads // device.attn_tp * dcp
    keys = math.ceil(context / dcp)
    layers = cfg.num_mla_layers
    w = mla_attention(cfg)
    return Row(
        device=device.name, dcp=dcp, context=context, heads=heads, keys=keys,
        kv_bytes=layers * keys * m.latent_dim * BF16,
        qo_bytes=layers * heads * (m.latent_dim + m.kv_lora_rank) * BF16,
        weight_bytes=layers * (w.attention // device.attn_tp + w.replicated),
        flops=layers * 2 * heads * keys * (m.latent_dim + m.kv_lora_rank),
    )


def rows(cfg: K3Config | None = None) -> list[Row]:
    cfg = cfg or k3_full()
    return [mla_decode_row(cfg, d, c, s) for d in DEVICES for s in CONTEXTS for c in DCP_SIZES]


def step_us(nbytes: float, device: Device, fraction: float) -> float:
    """Time to move nbytes at `fraction` of the device's HBM bandwidth, microseconds."""
    return nbytes / (device.hbm_bytes_s * fraction) * 1e6


def _ctx(s: int) -> str:
    return f"{s // (1024 * 1024)}M" if s >= 1024 * 1024 else f"{s // 1024}K"


def table(device: Device, all_rows: list[Row]) -> str:
    out = [f"### {device.name}: {device.hbm_bytes_s / 1e12:.1f} TB/s, attention-TP {device.attn_tp}, "
           f"ridge {device.ridge:.0f} flop/B\n",
           "| context | DCP | heads/rank | keys/rank/layer | KV MB | q+o MB | weights MB | attn GFLOP | flop/B | "
           "attn us @100% | @70% | MLA us @100% | @70% | DCP speed-up (attn) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    mine = [r for r in all_rows if r.device == device.name]
    for r in mine:
        base = next(b for b in mine if b.context == r.context and b.dcp == 1)
        attn = [step_us(r.core_bytes, device, f) for f in FRACTIONS]
        whole = [step_us(r.core_bytes + r.weight_bytes, device, f) for f in FRACTIONS]
        out.append(f"| {_ctx(r.context)} | {r.dcp} | {r.heads} | {r.keys} | {r.kv_bytes / 1e6:.1f} | "
                   f"{r.qo_bytes / 1e6:.2f} | {r.weight_bytes / 1e6:.0f} | {r.flops / 1e9:.1f} | {r.intensity:.0f} | "
                   f"{attn[0]:.1f} | {attn[1]:.1f} | {whole[0]:.1f} | {whole[1]:.1f} | "
                   f"{base.core_bytes / r.core_bytes:.2f}x |")
    return "\n".join(out)


def summary(all_rows: list[Row]) -> list[str]:
    """What DCP8 buys against DCP1, per device and context (attention core at 70 % of HBM bandwidth)."""
    lines = []
    for d in DEVICES:
        for s in CONTEXTS:
            one, eight = (next(r for r in all_rows if r.device == d.name and r.context == s and r.dcp == c)
                          for c in (1, 8))
            lines.append(f"- {d.name} {_ctx(s)}: attention core {step_us(one.core_bytes, d, 0.7):.0f} us -> "
                         f"{step_us(eight.core_bytes, d, 0.7):.0f} us per step ({one.core_bytes / eight.core_bytes:.2f}x"
                         f"); flop/B {one.intensity:.0f} -> {eight.intensity:.0f} (ridge {d.ridge:.0f}); KV per rank "
                         f"per request {one.kv_bytes / 1e9:.2f} -> {eight.kv_bytes / 1e9:.2f} GB")
    return lines


def render(all_rows: list[Row] | None = None) -> str:
    all_rows = all_rows or rows()
    body = "\n\n".join(table(d, all_rows) for d in DEVICES)
    return TEMPLATE.format(tables=body, summary="\n".join(summary(all_rows)), reading=reading(all_rows))


def reading(all_rows: list[Row]) -> str:
    """The paragraph that reads the tables, its figures taken from the rows."""
    def row(d, c, s=CONTEXTS[1]):
        return next(r for r in all_rows if r.device == d.name and r.dcp == c and r.context == s)

    h200, gb300 = DEVICES
    big = next(r for r in all_rows if r.device == h200.name and r.dcp == 1 and r.context == CONTEXTS[-1])
    bound = [f"{d.name} {r.intensity:.0f} vs ridge {d.ridge:.0f}" for d in DEVICES for r in [row(d, DCP_SIZES[-1])]]
    under = all(r.intensity < next(d for d in DEVICES if d.name == r.device).ridge for r in all_rows)
    qo = max(r.qo_bytes / r.kv_bytes for r in all_rows)
    return (
        f"Reading it: the attention core's flop/B is {'below' if under else 'NOT below'} the ridge in every row "
        f"(DCP8: {', '.join(bound)}), so it is bandwidth-bound and its step time falls with the DCP size, 8x at DCP8 "
        f"less the q/o bytes, which grow with the gathered heads (at most {qo * 100:.1f} % of the KV bytes, at 32K "
        f"and DCP8). Each rank also holds 1/DCP of the cache: {big.kv_bytes / 1e9:.1f} GB of latent rows per 1M-token "
        f"request at DCP1. The price is arithmetic intensity: gathering the group's heads multiplies the flops per KV "
        f"byte by the DCP size, from {row(h200, 1).intensity:.0f} (H200, {row(h200, 1).heads} heads) and "
        f"{row(gb300, 1).intensity:.0f} (GB300, {row(gb300, 1).heads} heads) flop/B at DCP1 to "
        f"{row(h200, 8).intensity:.0f} and {row(gb300, 8).intensity:.0f} at DCP8, within sight of the ridge: at DCP8 "
        f"the kernel's dots must run on tensor cores at a good fraction of peak (the bf16 branch, not fp32 dots) "
        f"or compute, not HBM, sets the step time. The weights column does not shrink with DCP (attention-TP "
        f"shards them), so at 32K the whole-MLA time is dominated by weights once DCP has cut the KV; batching "
        f"amortizes them.")


TEMPLATE = """# Roofline: K3 MLA decode per rank under DCP

Written by `k3 bench roofline --write` (k3_sglang/tooling/bench/roofline.py; pure arithmetic, tested in
tests/unit/test_roofline.py). Measured against a lent GPU by `bash bench/gpu_check.sh` (step 4, `bench/gpu_check.py
--roofline`), which prints each attention-core row's time and its fraction of the measured copy bandwidth.

What is counted, per rank and one request (batch 1) over K3's 24 MLA layers: the latent cache rows this rank holds
(ceil(context / DCP) keys of 576 bf16, 1152 B each), the kernel's q in and o out (bf16, (96 / attention-TP) x DCP
heads, all-gathered over the DCP group), and the rank's share of the MLA weights (attention-TP-sharded projections,
replicated norms; `plan.weights.mla_attention`). Attention flops: 2 x heads x keys x (576 + 512). Step times are
bytes over 100 % and 70 % of the vendor HBM bandwidth (H200 4.8 TB/s, GB300 8 TB/s); "attn" is the attention core
(KV + q/o), "MLA" adds the weights (which a batch shares, so at batch B the KV and q/o columns scale by B and the
weights do not). Not counted: the DCP all-gather of q and the LSE merge (NVLink, not HBM), projections' flops, KDA.

{tables}

## What DCP8 buys against DCP1

{summary}

{reading}

## What the kernel must sustain

The k3_dcp_mla kernel (kernels/mla/dcp_triton.py) reads each key row once per 32-head block, so the KV bytes above
are read (heads / 32) times from L2 and once from HBM when the head blocks of a request run together. To keep
a bandwidth-bound stream busy an SM needs about bandwidth x latency / SMs bytes in flight: with ~0.7 us of HBM
latency, 4.8e12 x 0.7e-6 / 132 = 25 KB per SM on H200 and 8e12 x 0.7e-6 / 160 = 35 KB on GB300. One program of
the reworked kernel keeps two key tiles of its three pipeline stages in flight, 2 x (16 or 32 keys) x 1152 B =
37-74 KB, and two programs fit per SM (docs/kernels.md, static table), so the loads cover the latency with room
for the softmax and the dots in between; the decode split count (`default_num_splits`) asks for two programs per
SM, which now run in one wave instead of two.
"""


def add_arguments(parser) -> None:
    parser.add_argument("--write", action="store_true", help=f"write {DOC.name} under docs/")


def run(args) -> int:
    text = render()
    print(text)
    if args.write:
        DOC.write_text(text)
        print(f"wrote {DOC}")
    return 0
