"""K3ServerProcess (the tests' and benchmarks' `k3 serve` launcher): a server whose HTTP port was taken between
our pick and its bind is restarted on a fresh port; a port the caller chose is never changed. A stand-in server
(bind, log uvicorn's bind error and hang like it, or answer /health) keeps this fast."""
from __future__ import annotations

import socket
import sys

import pytest

from k3_sglang.serving import process as process_module
from k3_sglang.serving.process import BIND_ERROR, K3ServerProcess

STAND_IN = f"""
import http.server, socket, sys, time
port = int(sys.argv[1])
try:
    server = http.server.HTTPServer(("127.0.0.1", port), http.server.BaseHTTPRequestHandler)
except OSError:
    print("ERROR:    [Errno 98] {BIND_ERROR} ('127.0.0.1', %d): address already in use" % port, flush=True)
    time.sleep(600)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
server.RequestHandlerClass = Health
server.serve_forever()
"""


class StandIn(K3ServerProcess):
    def command(self) -> list[str]:
        return [sys.executable, "-c", STAND_IN, str(self.port)]


@pytest.fixture
def taken():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


def test_a_picked_port_taken_before_the_bind_is_replaced(monkeypatch, taken, tmp_path):
    from k3_sglang.net import free_port

    picks = iter([taken])
    monkeypatch.setattr(process_module, "free_port", lambda: next(picks, None) or free_port())
    server = StandIn([], tmp_path / "serve.log").start(timeout_s=60)
    try:
        assert server.port != taken and server.healthy()
    finally:
        server.stop()


def test_a_chosen_port_is_not_changed(taken, tmp_path):
    with pytest.raises(RuntimeError, match=f"could not bind port {taken}"):
        StandIn([], tmp_path / "serve.log", port=taken).start(timeout_s=60)
