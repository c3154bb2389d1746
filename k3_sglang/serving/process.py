"""Start and stop a `k3 serve` process (used by the end-to-end tests and `k3 bench serve`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from k3_sglang.net import free_port

BIND_ERROR = "error while attempting to bind on address"
ZMQ_BIND_ERROR = "zmq.error.ZMQError: Address already in use"  # a KV-event port `k3 serve` picked was taken


class K3ServerProcess:
    """A `k3 serve` child on 127.0.0.1; `start()` waits for /health, `stop()` signals and reaps it."""

    def __init__(self, args: list[str], log_path: Path, port: int | None = None, env: dict[str, str] | None = None):
        self._own_port = port is None  # a port we picked may be taken by another process before the server binds
        self.port = port or free_port()
        self.args = args
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300.0, bind_retries: int = 2) -> "K3ServerProcess":
        """Start and wait for /health. A server whose HTTP port was taken between our pick and its bind (it logs
        the bind error and never turns healthy) is stopped and, on a port we picked, started again on a fresh one
        up to bind_retries times; so is one that died because a KV-event port `k3 serve` picked was taken before
        SGLang's scheduler bound it (it binds after the model loads)."""
        command = self.command()
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if self._picked_event_port_taken() and bind_retries >= 1:
                    self._reap()  # `k3 serve` picks fresh KV-event ports on each start
                    return self.start(max(1.0, deadline - time.monotonic()), bind_retries - 1)
                raise RuntimeError(f"k3 serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.healthy():
                return self
            tail = self.log_tail()
            if BIND_ERROR in tail and f"'127.0.0.1', {self.port})" in tail:
                self.stop()
                if not self._own_port or bind_retries < 1:
                    raise RuntimeError(f"k3 serve could not bind port {self.port}:\n{self.log_tail()}")
                self.port = free_port()
                return self.start(max(1.0, deadline - time.monotonic()), bind_retries - 1)
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"k3 serve not healthy within {timeout_s:.0f} s:\n{self.log_tail()}")

    def _picked_event_port_taken(self) -> bool:
        """Whether the server died because a KV-event port it picked itself was taken before SGLang bound it."""
        from k3_sglang.serving.kv_events_config import KV_EVENTS_FLAG

        user_given = any(a == KV_EVENTS_FLAG or a.startswith(KV_EVENTS_FLAG + "=") for a in self.args)
        return not user_given and ZMQ_BIND_ERROR in self.log_tail(20000)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "k3_sglang.cli", "serve", "--port", str(self.port), *self.args]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text()[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._log.close()

    def _reap(self) -> None:
        """After the server exited on its own: end what is left of its process group and close the log."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._log.close()

    def __enter__(self) -> "K3ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
