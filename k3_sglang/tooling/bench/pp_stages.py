"""`k3 bench pp-prefill`'s view of a pipeline: the stage split by SGLang's rule, the bytes a hop carries, and the
per-stage forward spans with the bubble and hand-off figures they give.

Spans: every stage appends one JSON line per forward to <dir>/stage-<start_layer>.jsonl, {"start", "t0_ns", "t1_ns",
"tokens", "mode"} with CLOCK_MONOTONIC times (one clock for all processes of a host), when a server writes them
(`K3_STAGE_TRACE=<dir>`; SGLang's own K3 writes none today, so the report's stage section then says so).
From the spans of one request's chunked prefill (chunk k is the k-th extend forward on every stage):
- busy_s[s]: the stage's forward time; span_s: first stage-0 start to last last-stage end;
- bubble = 1 - sum(busy) / (P * span): the share of stage-time spent not computing;
- exposed hand-off per hop: sum over chunks of t0[s+1][k] - max(t1[s][k], t1[s+1][k-1]), the time stage s+1
  waits for chunk k after both the sender finished it and it finished its own previous chunk.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TRACE_ENV = "K3_STAGE_TRACE"


def stage_bounds(num_layers: int, pp_size: int) -> list[tuple[int, int]]:
    """Layers [start, end) of every stage of a pp_size-way split by SGLang's default rule (`get_pp_indices`): the
    layers split evenly and the last num_layers % pp_size stages get one extra."""
    if not 1 <= pp_size <= num_layers:
        raise ValueError(f"pp_size must be in 1..{num_layers}, got {pp_size}")
    base, extra = divmod(num_layers, pp_size)
    counts = [base + (1 if r >= pp_size - extra else 0) for r in range(pp_size)]
    bounds = [sum(counts[:r]) for r in range(pp_size + 1)]
    return [(bounds[r], bounds[r + 1]) for r in range(pp_size)]


def hop_bytes_per_token(cut: int, block_size: int, hidden: int, dtype_bytes: int) -> int:
    """Bytes per token crossing the boundary before layer `cut`: the live stream and the ceil(cut / bs) sealed
    AttnRes block snapshots, (1 + ceil(cut / bs)) * hidden * dtype_bytes."""
    return (1 - (-cut // block_size)) * hidden * dtype_bytes


@dataclass(frozen=True)
class Span:
    """One forward of one stage."""

    start_layer: int
    t0_ns: int
    t1_ns: int
    tokens: int
    mode: str

    @property
    def seconds(self) -> float:
        return (self.t1_ns - self.t0_ns) / 1e9


def read_spans(directory: Path) -> dict[int, list[Span]]:
    """start_layer -> that stage's spans in time order."""
    out: dict[int, list[Span]] = {}
    for path in sorted(Path(directory).glob("stage-*.jsonl")):
        for line in path.read_text().splitlines():
            d = json.loads(line)
            out.setdefault(d["start"], []).append(Span(d["start"], d["t0_ns"], d["t1_ns"], d["tokens"], d["mode"]))
    return {k: sorted(v, key=lambda s: s.t0_ns) for k, v in sorted(out.items())}


@dataclass(frozen=True)
class PipelineTiming:
    """Figures of one chunked prefill through P stages (see the module docstring)."""

    busy_s: tuple[float, ...]
    span_s: float
    exposed_handoff_s: tuple[float, ...]  # per hop
    chunks: tuple[int, ...]  # tokens per chunk (stage 0)

    @property
    def bubble(self) -> float:
        return 1.0 - sum(self.busy_s) / (len(self.busy_s) * self.span_s)

    @property
    def imbalance(self) -> float:
        """max busy / mean busy (1.0: balanced stages)."""
        return max(self.busy_s) / (sum(self.busy_s) / len(self.busy_s))


def pipeline_timing(spans: dict[int, list[Span]], t_from_ns: int, t_to_ns: int) -> PipelineTiming:
    """Timing of the extend forwards that started in [t_from_ns, t_to_ns), stages in layer order. Raises
    ValueError when the stages did not run the same number of chunks (other traffic in the window)."""
    stages = [[s for s in spans[k] if s.mode == "extend" and t_from_ns <= s.t0_ns < t_to_ns] for k in sorted(spans)]
    counts = {len(s) for s in stages}
    if len(counts) != 1 or not stages[0]:
        raise ValueError(f"stages ran different numbers of prefill forwards in the window: "
                         f"{[len(s) for s in stages]}")
    busy = tuple(sum(x.seconds for x in s) for s in stages)
    span = (stages[-1][-1].t1_ns - stages[0][0].t0_ns) / 1e9
    exposed = []
    for send, recv in zip(stages, stages[1:]):
        total = 0
        for k, (a, b) in enumerate(zip(send, recv)):
            ready = max(a.t1_ns, recv[k - 1].t1_ns if k else a.t1_ns)
            total += max(0, b.t0_ns - ready)
        exposed.append(total / 1e9)
    return PipelineTiming(busy, span, tuple(exposed), tuple(x.tokens for x in stages[0]))
