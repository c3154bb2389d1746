"""Run an ASGI app with uvicorn in a background thread on 127.0.0.1 (tests and benchmarks)."""

from __future__ import annotations

import threading
import time

import uvicorn

from k3_sglang.net import free_port  # noqa: F401 - re-exported for tests and benches


class ServerThread:
    """uvicorn serving `app` in a daemon thread; `start()` waits until it accepts connections."""

    def __init__(self, app, port: int | None = None) -> None:
        self.port = port or free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                access_log=False, lifespan="on", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name=f"uvicorn-{self.port}")

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> "ServerThread":
        """Start and wait for readiness (raises TimeoutError)."""
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise TimeoutError(f"server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to exit and join the thread (bounded)."""
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
