"""`K3_KV_READ_TRACE=DIR`: each rank appends one line per MLA attention call, "<mode> <rows>", to DIR/rank<r>.txt,
where rows is how many latent pool rows the attention kernel was handed (what it reads from this rank's KV pool).
`k3 bench dcp` reads the files to measure KV bytes read per rank per decode step. Off (no I/O) when unset."""
from __future__ import annotations

from pathlib import Path

ENV = "K3_KV_READ_TRACE"


class KVReadTrace:
    """Append-only per-rank trace of MLA pool rows read; `record` is a no-op when the setting is unset."""

    def __init__(self, directory: str | Path | None, rank: int):
        self.path = Path(directory) / f"rank{rank}.txt" if directory else None
        self._file = None

    @classmethod
    def from_env(cls, rank: int) -> "KVReadTrace":
        from k3_sglang.worker_settings import worker_settings

        return cls(worker_settings().kv_read_trace, rank)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def record(self, mode: str, rows: int) -> None:
        if self.path is None:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", buffering=1)  # line-buffered: the bench reads while we serve
        self._file.write(f"{mode} {rows}\n")


def read_rows(path: Path, start_line: int = 0) -> list[tuple[str, int]]:
    """The (mode, rows) records of one rank's trace file from line `start_line` on."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()[start_line:]
    return [(mode, int(rows)) for mode, rows in (line.split() for line in lines if line.strip())]
