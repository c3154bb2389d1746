"""K3_STEP_TIMING: where a server's decode step goes, split into the model forward and everything else (host work).

With `K3_STEP_TIMING=<prefix>` every scheduler process appends one JSON line per decode step to
`<prefix>.<pid>.jsonl` (general plugin `k3_step_timing`; without the variable nothing is registered):

    {"t": the step's start (time.perf_counter: CLOCK_MONOTONIC, comparable across processes on Linux),
     "b": requests in the step, "loop": s from this step's run_batch to the next one's,
     "run": s in Scheduler.run_batch, "fwd": s in ModelRunner.forward (every forward of the step)}

`loop` covers one whole scheduler iteration (run_batch, process_batch_result, receiving requests and building the
next batch), so `loop - fwd` is what the server spends per step besides the model itself: scheduler bookkeeping,
SGLang's speculative path, K3_CSV's worker; `loop - run` is everything after run_batch (process_batch_result
included: it is not timed on its own, which would take one more hook). A step is written when the next decode step starts right after it
(steps followed by a prefill or an idle loop are left out). The loop only appends records to a buffer; a daemon
thread writes the buffer every FLUSH_SECONDS (so a server stopped by a signal, which runs no atexit, loses at most
that much: wait FLUSH_SECONDS after the last request before stopping it). `k3 bench plain-decode` reads these files.

Two AROUND hooks through SGLang's HookRegistry (k3_sglang/hook_inventory.py), for measurement only.
"""
from __future__ import annotations

import atexit
import json
import os
import threading
import time
from pathlib import Path

from pydantic import field_validator

from k3_sglang.env_settings import EnvModel
from k3_sglang.sglang_guard import sglang_plugin

RUN_BATCH_TARGET = "sglang.srt.managers.scheduler.Scheduler.run_batch"
FORWARD_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
FLUSH_SECONDS = 0.5  # the background writer's period (the loop itself never writes the file)


class StepTimingSettings(EnvModel):
    """K3_STEP_TIMING: the path prefix of the per-process step files (unset: no hooks)."""

    step_timing: str | None = None

    @field_validator("step_timing")
    @classmethod
    def _writable_parent(cls, value: str | None) -> str | None:
        if value and not Path(value).resolve().parent.is_dir():
            raise ValueError(f"K3_STEP_TIMING={value}: no directory {Path(value).resolve().parent}")
        return value


class StepTimer:
    """Accumulates one decode step at a time and buffers it once the next decode step begins; `flush` (the writer
    thread, and atexit) appends the buffer to the file."""

    def __init__(self, path: Path, clock=time.perf_counter):
        self.path, self.clock = path, clock
        self._open: dict | None = None  # the decode step in flight: b, t0, run, fwd
        self._lines: list[str] = []
        self._lock = threading.Lock()  # the loop appends, the writer thread takes the buffer

    def begin(self, is_decode: bool, batch_size: int) -> None:
        """run_batch starts: close the previous step (kept only when this one is a decode step too)."""
        now = self.clock()
        prev, self._open = self._open, None
        if prev is not None and is_decode:
            row = {"t": prev["t0"], "b": prev["b"], "loop": now - prev["t0"], "run": prev["run"], "fwd": prev["fwd"]}
            line = json.dumps(row)
            with self._lock:
                self._lines.append(line)
        if is_decode:
            self._open = {"b": batch_size, "t0": now, "run": 0.0, "fwd": 0.0}

    def add(self, field: str, seconds: float) -> None:
        if self._open is not None:
            self._open[field] += seconds

    def flush(self) -> None:
        with self._lock:
            lines, self._lines = self._lines, []
        if lines:
            with self.path.open("a") as f:
                f.write("\n".join(lines) + "\n")

    def start_writer(self, every: float = FLUSH_SECONDS) -> threading.Thread:
        """A daemon thread that flushes every `every` seconds for the life of the process."""
        def write_forever():
            while True:
                time.sleep(every)
                self.flush()

        thread = threading.Thread(target=write_forever, name="k3-step-timing-writer", daemon=True)
        thread.start()
        return thread


_timer: StepTimer | None = None


def _timed(field: str, original, *args, **kwargs):
    t = time.perf_counter()
    try:
        return original(*args, **kwargs)
    finally:
        if _timer is not None:
            _timer.add(field, time.perf_counter() - t)


def time_run_batch(original, self, batch, *args, **kwargs):
    """AROUND `Scheduler.run_batch`: opens a decode step's record (K3_STEP_TIMING) and times the call."""
    if _timer is not None:
        mode = getattr(batch, "forward_mode", None)
        _timer.begin(bool(mode is not None and mode.is_decode()), len(getattr(batch, "reqs", ()) or ()))
    return _timed("run", original, self, batch, *args, **kwargs)


def time_forward(original, *args, **kwargs):
    """AROUND `ModelRunner.forward`: adds the model forward's time to the open decode step (K3_STEP_TIMING)."""
    return _timed("fwd", original, *args, **kwargs)


def installed_hooks():
    """(target, hook, hook type name) of every hook `register` installs when K3_STEP_TIMING is set."""
    return [(RUN_BATCH_TARGET, time_run_batch, "AROUND"), (FORWARD_TARGET, time_forward, "AROUND")]


@sglang_plugin
def register() -> None:
    """Entry point: with K3_STEP_TIMING set, start this process's step file and register the hooks."""
    global _timer
    prefix = StepTimingSettings.from_env().step_timing
    if not prefix:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    _timer = StepTimer(Path(f"{prefix}.{os.getpid()}.jsonl"))
    _timer.start_writer()
    atexit.register(_timer.flush)
    for target, hook, kind in installed_hooks():
        HookRegistry.register(target, hook, HookType[kind])


def read_steps(prefix: str | Path) -> list[dict]:
    """Every step record the processes of one server wrote under `prefix` (files `<prefix>.<pid>.jsonl`)."""
    prefix = Path(prefix)
    rows: list[dict] = []
    for path in sorted(prefix.parent.glob(prefix.name + ".*.jsonl")):
        rows.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return rows
