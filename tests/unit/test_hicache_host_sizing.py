"""The HiCache host tier `k3 serve --enable-hierarchical-cache` sizes from free memory (hicache/host_sizing.py)."""

from __future__ import annotations

import pytest

from k3_sglang.hicache.host_sizing import CAP_GB, SHARE, host_tier, mem_available_bytes
from k3_sglang.hicache.serve_flags import cpu_hicache_flags, cpu_host_tier

GB = 10 ** 9


@pytest.mark.parametrize("free, ranks, flags", [
    (20 * GB, 1, ("--hicache-size", "5")),          # the machine: a quarter of 20 GB free
    (20 * GB, 2, ("--hicache-size", "2")),          # split over the ranks on the host (floor of 2.5)
    (1000 * GB, 1, ("--hicache-size", str(CAP_GB))),  # capped
    (3 * GB, 1, ("--hicache-ratio", "2")),          # under 1 GB per rank: SGLang's ratio
    (None, 1, ("--hicache-ratio", "2")),            # unknown free memory
])
def test_host_tier_is_a_capped_share_of_free_memory(free, ranks, flags):
    tier = host_tier(free, ranks)
    assert tier.flags == flags
    assert tier.message.startswith("HiCache host tier:")
    if flags[0] == "--hicache-size":
        assert int(flags[1]) <= SHARE * free / GB / ranks and f"{flags[1]} GB per rank" in tier.message
        assert ("capped" in tier.message) == (int(flags[1]) == CAP_GB)


def test_user_size_flags_win_and_hicache_off_adds_nothing():
    assert cpu_host_tier(["--dtype", "float32"], 20 * GB) is None
    assert cpu_host_tier(["--enable-hierarchical-cache", "--hicache-ratio", "3"], 20 * GB) is None
    assert cpu_host_tier(["--enable-hierarchical-cache", "--hicache-size", "1"], 20 * GB) is None
    tier = cpu_host_tier(["--enable-hierarchical-cache", "--tp-size", "2"], 20 * GB)
    assert tier.flags == ("--hicache-size", "2")
    flags = cpu_hicache_flags(["--enable-hierarchical-cache"], cpu_host_tier(["--enable-hierarchical-cache"], 8 * GB))
    assert flags[-2:] == ["--hicache-size", "2"] and flags.count("--hicache-size") == 1


def test_mem_available_reads_proc_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n")
    assert mem_available_bytes(meminfo) == 20000000 * 1024
    meminfo.write_text("MemTotal: 1 kB\n")
    assert mem_available_bytes(meminfo) is None
    assert mem_available_bytes(tmp_path / "missing") is None


def test_k3_serve_prints_the_host_tier_it_chose(capsys):
    from k3_sglang.cli import main

    assert main(["serve", "--dry-run", "--enable-hierarchical-cache"]) == 0
    captured = capsys.readouterr()
    assert "HiCache host tier:" in captured.err
    assert ("--hicache-size" in captured.out) != ("--hicache-ratio 2" in captured.out)
    assert main(["serve", "--dry-run", "--enable-hierarchical-cache", "--hicache-ratio", "4"]) == 0
    captured = capsys.readouterr()
    assert "HiCache host tier:" not in captured.err and "--hicache-ratio 4" in captured.out
