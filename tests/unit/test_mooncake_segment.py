"""The Mooncake store memory that outlives a worker (k3_sglang/hicache/mooncake_master.py `LoopbackMooncakeSegment`):
a loopback master and a standalone `mooncake_client` mounting a segment; a client that mounts none (a worker with
MOONCAKE_GLOBAL_SEGMENT_SIZE=0) stores an object and exits, and a new process reads it back. This is what lets a
restarted `k3 serve` worker resume from the Mooncake tier; without the segment, the object is gone with its writer.
A few seconds (two mooncake processes and two short Python clients, all on 127.0.0.1)."""
from __future__ import annotations

import subprocess
import sys

import pytest

mooncake = pytest.importorskip("mooncake.store")

from k3_sglang.hicache.mooncake_master import LoopbackMooncakeMaster, LoopbackMooncakeSegment  # noqa: E402

CLIENT = """
import sys
from mooncake.store import MooncakeDistributedStore
store = MooncakeDistributedStore()
assert store.setup("127.0.0.1", "P2PHANDSHAKE", int(sys.argv[2]), 16 << 20, "tcp", "", sys.argv[1]) == 0
if sys.argv[3] == "put":
    assert store.put("k3-restart-probe", bytes(range(256)) * 16) == 0
else:
    print(store.is_exist("k3-restart-probe"), (store.get("k3-restart-probe") or b"") == bytes(range(256)) * 16)
store.close()
"""


def _client(address: str, op: str, segment_bytes: int = 0) -> str:
    done = subprocess.run([sys.executable, "-c", CLIENT, address, str(segment_bytes), op], capture_output=True,
                          text=True, timeout=120, env={"MC_TCP_BIND_ADDRESS": "127.0.0.1", "PATH": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_an_object_written_by_a_client_without_a_segment_outlives_it(tmp_path):
    with LoopbackMooncakeMaster(tmp_path / "master.log") as master:
        segment = LoopbackMooncakeSegment(tmp_path / "segment.log", master, "64MB").start()
        try:
            assert segment.worker_env() == {"MOONCAKE_MASTER": master.address, "MOONCAKE_GLOBAL_SEGMENT_SIZE": "0"}
            _client(master.address, "put")  # the "worker" mounts nothing, stores into the segment, exits
            assert _client(master.address, "get") == "1 True"  # a new process finds it, bytes intact
        finally:
            segment.stop()
        assert _client(master.address, "get", 16 << 20) != "1 True"  # the segment gone: the object with it
