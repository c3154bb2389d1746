"""Run an app on 127.0.0.1 in a background thread (tests and benchmarks): an aiohttp application
(the router) on its own event loop, or an ASGI app (the mock worker) under uvicorn."""

from __future__ import annotations

import asyncio
import threading
import time

import uvicorn
from aiohttp import web

from k3_sglang.net import free_port  # noqa: F401 - re-exported for tests and benches


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed (it ships with SGLang), else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class ServerThread:
    """`app` served in a daemon thread; `start()` waits until it accepts connections."""

    def __init__(self, app, port: int | None = None) -> None:
        self.port = port or free_port()
        self.app = app
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.server: uvicorn.Server | None = None
        if isinstance(app, web.Application):
            target = self._run_aiohttp
        else:
            config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                    access_log=False, lifespan="on", timeout_graceful_shutdown=2)
            self.server = uvicorn.Server(config)
            target = self.server.run
        self.thread = threading.Thread(target=target, daemon=True, name=f"server-{self.port}")

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://127.0.0.1:{self.port}"

    def _run_aiohttp(self) -> None:
        loop = self._loop = new_event_loop()
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
        try:
            self._stop = asyncio.Event()
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", self.port)
            loop.run_until_complete(site.start())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()
            loop.run_until_complete(runner.cleanup())
            loop.close()
            return
        self._ready.set()
        loop.run_until_complete(self._stop.wait())
        loop.run_until_complete(runner.cleanup())
        loop.close()

    def _started(self) -> bool:
        return self.server.started if self.server is not None else self._ready.is_set()

    def start(self, timeout_s: float = 20.0) -> "ServerThread":
        """Start and wait for readiness (raises TimeoutError, or the app's startup error)."""
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._started():
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise TimeoutError(f"server on port {self.port} did not start")
            time.sleep(0.01)
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the server to exit and join the thread (bounded)."""
        if self.server is not None:
            self.server.should_exit = True
        elif self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(timeout_s)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
