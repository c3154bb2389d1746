"""Tables of `k3 bench dcp` (decode step time, KV rows read per rank, logical capacity) and docs/bench-dcp.md."""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
from pathlib import Path

ROW_BYTES_BF16 = (64 + 16) * 2  # tiny K3 latent row: kv_lora_rank 64 + rope 16 values, bf16


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration, subprocess.SubprocessError):
        return platform.processor() or "unknown CPU"


def summarize(cells, contexts: list[int], capacity: dict[str, int]) -> str:
    lines = ["| context | DCP1 step (ms) | DCP2 step (ms) | DCP2 / DCP1 step | DCP1 rows read per rank | "
             "DCP2 rows read per rank | DCP2 / DCP1 rows (max rank) | DCP2 KB read per rank per MLA call |",
             "|---:|---:|---:|---:|---|---|---:|---:|"]
    for n in contexts:
        a, b = cells[("dcp1", n)], cells[("dcp2", n)]
        sa, sb = statistics.median(a.step_ms), statistics.median(b.step_ms)
        ra = [statistics.median(x[r] for x in a.rows_per_rank) for r in range(len(a.rows_per_rank[0]))]
        rb = [statistics.median(x[r] for x in b.rows_per_rank) for r in range(len(b.rows_per_rank[0]))]
        ratio = max(rb) / max(ra) if max(ra) else float("nan")
        lines.append(f"| {n} | {sa:.1f} | {sb:.1f} | {sb / sa:.2f} | {' / '.join(f'{x:.0f}' for x in ra)} | "
                     f"{' / '.join(f'{x:.0f}' for x in rb)} | {ratio:.3f} | {max(rb) * ROW_BYTES_BF16 / 1024:.1f} |")
    lines += ["", "| server | logical KV tokens (/get_server_info) | vs DCP1 |", "|---|---:|---:|"]
    for name, tokens in capacity.items():
        lines.append(f"| {name} | {tokens} | {tokens / capacity['dcp1']:.2f}x |")
    return "\n".join(lines)


MODEL_TITLES = {"portable": "The portable model (k3_sglang/model)",
                "sglang": "SGLang's own K3, k3_dcp_mla backend in both arms"}


def write_report(path: Path, started, args, summaries: dict[str, str]) -> None:
    """summaries: model ("portable" / "sglang") -> its tables (summarize)."""
    load = os.getloadavg()
    sections = "\n\n".join(f"## {MODEL_TITLES[m]}\n\n{t}" for m, t in summaries.items())
    text = f"""# `k3 bench dcp`: decode with the MLA KV striped over two DCP ranks

Run {started:%Y-%m-%d %H:%M} UTC on {os.cpu_count()} x {_cpu()} (load average at the end {load[0]:.2f}),
`k3 bench dcp --model-impl {args.model_impl} --contexts {' '.join(map(str, args.contexts))} --decode-tokens \
{args.decode_tokens} --repeats {args.repeats}`.
Both servers are TP2 (two ranks, one core each) of the tiny K3 in bf16 with the same per-rank pool
(--max-total-tokens {args.pool_tokens}); `dcp2` adds --dcp-size 2. Rounds alternate the servers on the same prompt;
medians over {args.repeats} rounds. Rows read are counted from the pool rows each rank's MLA attention kernel was
handed per decode call (K3_KV_READ_TRACE); one tiny-K3 latent row is {ROW_BYTES_BF16} bytes in bf16 (K3: 1,152).
SGLang's K3 runs the k3_dcp_mla backend in both of its servers (same kernel; only the striping differs).

{sections}

"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")
