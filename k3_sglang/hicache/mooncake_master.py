"""A Mooncake store master on loopback, started from the installed `mooncake` package (the real `mooncake_master`
binary): the L3 tier of the HiCache tests and of `k3 bench sessions`.

    with LoopbackMooncakeMaster(log_path) as master:
        env = master.client_env()      # MOONCAKE_MASTER=127.0.0.1:PORT for `k3 serve --hicache-storage-backend mooncake`
        ...
        master.kill()                  # the fault tests: the master dies mid-session

A restartable store (`LoopbackMooncakeSegment`): objects live in the memory segments that clients mount, and a
`k3 serve` rank mounts its own (`MOONCAKE_GLOBAL_SEGMENT_SIZE`), which goes away with the process. A standalone
`mooncake_client` (the package's binary) mounting a segment that outlives the worker, with the worker mounting none
(`segment.worker_env()`: MOONCAKE_GLOBAL_SEGMENT_SIZE=0), is what lets a restarted worker resume from the store.

Both of its ports (RPC and metrics/admin) are picked free and bound to 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from k3_sglang.net import free_port

READY_LINE = "Master service started"
SEGMENT_READY_LINE = "Starting real client service on"


def master_binary(name: str = "mooncake_master") -> Path:
    """An executable shipped in the mooncake package (`mooncake_master`, `mooncake_client`; FileNotFoundError if
    absent)."""
    import mooncake

    path = Path(mooncake.__file__).parent / name
    if not path.is_file():
        raise FileNotFoundError(f"no {name} in {path.parent}: install mooncake-transfer-engine(-non-cuda)")
    return path


class LoopbackMooncakeMaster:
    """One `mooncake_master` child process on 127.0.0.1; `start()` waits for its ready line."""

    def __init__(self, log_path: Path, port: int | None = None):
        self.log_path = Path(log_path)
        self.port = port or free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [str(master_binary()), f"-rpc_port={self.port}", "-rpc_address=127.0.0.1",
                "-enable_http_metadata_server=false", "-metrics_host=127.0.0.1", f"-metrics_port={self.metrics_port}",
                "-enable_metric_reporting=false"]

    def client_env(self) -> dict[str, str]:
        """What a `k3 serve --hicache-storage-backend mooncake` needs to reach this master."""
        return {"MOONCAKE_MASTER": self.address}

    ready_line = READY_LINE
    extra_env: dict[str, str] = {}

    def start(self, timeout_s: float = 60.0) -> "LoopbackMooncakeMaster":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env={**os.environ, **self.extra_env})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.command()[0]} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.ready_line in self.log_tail(20000):
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.command()[0]} not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL (a crash, not a shutdown) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> "LoopbackMooncakeMaster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class LoopbackMooncakeSegment(LoopbackMooncakeMaster):
    """A standalone `mooncake_client` on 127.0.0.1 mounting `size` of memory into `master`'s store (TCP): the segment
    stored objects live in across worker restarts. `start()` waits for its ready line."""

    ready_line = SEGMENT_READY_LINE
    extra_env = {"MC_TCP_BIND_ADDRESS": "127.0.0.1"}  # its transfer listener on loopback too

    def __init__(self, log_path: Path, master: LoopbackMooncakeMaster, size: str = "512MB"):
        super().__init__(log_path)
        self.master, self.size = master, size

    def command(self) -> list[str]:
        return [str(master_binary("mooncake_client")), f"-master_server_address={self.master.address}",
                "-metadata_server=P2PHANDSHAKE", "-host=127.0.0.1", f"-global_segment_size={self.size}",
                f"-port={self.port}", "-protocol=tcp"]

    def worker_env(self) -> dict[str, str]:
        """A worker that stores into this segment and mounts none of its own (its objects outlive it)."""
        return {**self.master.client_env(), "MOONCAKE_GLOBAL_SEGMENT_SIZE": "0"}
