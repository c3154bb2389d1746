"""A Mooncake store master on loopback, started from the installed `mooncake` package (the real `mooncake_master`
binary): the L3 tier of the HiCache tests and of `k3 bench sessions`.

    with LoopbackMooncakeMaster(log_path) as master:
        env = master.client_env()      # MOONCAKE_MASTER=127.0.0.1:PORT for `k3 serve --hicache-storage-backend mooncake`
        ...
        master.kill()                  # the fault tests: the master dies mid-session

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


def master_binary() -> Path:
    """The `mooncake_master` executable shipped in the mooncake package (FileNotFoundError if absent)."""
    import mooncake

    path = Path(mooncake.__file__).parent / "mooncake_master"
    if not path.is_file():
        raise FileNotFoundError(f"no mooncake_master in {path.parent}: install mooncake-transfer-engine(-non-cuda)")
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

    def start(self, timeout_s: float = 60.0) -> "LoopbackMooncakeMaster":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mooncake_master exited with {self.proc.returncode}:\n{self.log_tail()}")
            if READY_LINE in self.log_tail(20000):
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"mooncake_master not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

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
