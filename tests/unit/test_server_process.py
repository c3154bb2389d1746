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


EVENT_PORT_STAND_IN = f"""
import http.server, pathlib, sys
port, marker = int(sys.argv[1]), pathlib.Path(sys.argv[2])
if not marker.exists():  # the first start dies like SGLang's scheduler when its KV-event port was taken
    marker.write_text("died once")
    print("{process_module.ZMQ_BIND_ERROR} (addr='tcp://127.0.0.1:40000')", flush=True)
    sys.exit(1)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


class EventPortStandIn(K3ServerProcess):
    def command(self) -> list[str]:
        return [sys.executable, "-c", EVENT_PORT_STAND_IN, str(self.port), str(self.log_path) + ".marker"]


def test_a_picked_kv_event_port_taken_before_the_bind_restarts_the_server(tmp_path):
    server = EventPortStandIn([], tmp_path / "serve.log").start(timeout_s=60)
    try:
        assert server.healthy() and (tmp_path / "serve.log.marker").exists()
    finally:
        server.stop()


def test_a_user_given_kv_event_config_is_not_retried(tmp_path):
    with pytest.raises(RuntimeError, match="exited with 1"):
        EventPortStandIn(["--kv-events-config", "{}"], tmp_path / "serve.log").start(timeout_s=60)


def test_picked_ports_avoid_the_ephemeral_range_and_are_bindable():
    from k3_sglang.net import ephemeral_range, free_port, free_port_block

    low, high = ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert not low <= port <= high
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    base = free_port_block(4)
    assert not any(low <= p <= high for p in range(base, base + 4))
    for port in range(base, base + 4):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_ephemeral_range_reads_the_kernel_file_and_falls_back(tmp_path):
    from k3_sglang.net import ephemeral_range

    (tmp_path / "range").write_text("40000\t50000\n")
    assert ephemeral_range(tmp_path / "range") == (40000, 50000)
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)
