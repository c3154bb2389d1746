"""Per-step JSONL records of K3_CSV (K3_SPEC_RECORD): what `k3 bench profile-verify` fits the cost model from."""
from __future__ import annotations

import json
import os
import threading


class StepRecorder:
    """Appends one JSON object per decode step; inert without a path. Each line:
    {"kind": "verify"|"decode", "n_reqs", "n_tokens", "l_max", "seconds", "accepted", "drafted", "budget"}."""

    def __init__(self, path: str | None, rank: int = 0):
        self.path = path if path and rank == 0 else None
        self._lock = threading.Lock()
        if self.path:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)

    def step(self, **fields) -> None:
        if not self.path:
            return
        with self._lock, open(self.path, "a") as f:
            f.write(json.dumps(fields) + "\n")
