"""`k3 bench kernels --static`: every Triton kernel a GPU server of ours launches, compiled for sm_90a and sm_100a at
K3's production shapes, must not spill and must fit its architecture's shared memory. Default tier: a few seconds
from the committed cache (k3_sglang/tooling/bench/kernels_static.json, keyed by Triton version + kernel source
hash); a kernel edit misses the cache and compiles it here (seconds to minutes), so the test never reads a stale
result. (The KDA Triton kernels that spilled retired with the portable model: SGLang's K3 runs SGLang's KDA kernels.)
Plus the tool's own parts: ptxas output parsing, blocks per SM by hand, a kernel built to spill is caught, and the
Triton state is restored after a capture."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from k3_sglang.tooling.bench import kernels_static, static_cases, static_compile
from k3_sglang.tooling.bench.static_compile import ARCHS, Usage, blocks_per_sm, parse_ptxas, problems

def _clean_env() -> dict:
    """This environment without TRITON_INTERPRET (tests/kernels' conftest sets it for the whole pytest process, and
    the interpreter compiles nothing): compiles run in a child process."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    return env


@pytest.fixture(scope="module")
def static_rows():
    cached = {**kernels_static._load(kernels_static.COMMITTED), **kernels_static._load(kernels_static.user_cache())}
    wanted = {kernels_static.entry_key(c, a) for c in static_cases.cases() for a in ARCHS}
    if wanted - set(cached):  # a kernel or tool edit, or another Triton: compile what is missing (into the user cache)
        done = subprocess.run([sys.executable, "-m", "k3_sglang.cli", "bench", "kernels", "--static"],
                              env=_clean_env(), capture_output=True, text=True, timeout=1800)
        assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: problems, which the tests below name
    return kernels_static.results()


@pytest.mark.parametrize("case_id", [c.id for c in static_cases.cases()])
def test_no_spills_and_shared_within_limits(static_rows, case_id):
    mine = [(arch, launch) for cid, arch, launch in static_rows if cid == case_id]
    assert {arch for arch, _ in mine} == set(ARCHS), f"{case_id}: not compiled for every architecture"
    bad = [f"{arch} {launch['kernel']}: {p}" for arch, launch in mine
           for p in problems(kernels_static._usage(launch), ARCHS[arch])]
    assert not bad, "\n".join(bad)


def test_committed_cache_and_doc_are_current(static_rows):
    """The default tier compiles nothing (every key committed) and docs/kernels.md shows these numbers."""
    committed = kernels_static._load(kernels_static.COMMITTED)
    missing = set(kernels_static.current_entries(static_rows)) - set(committed)
    assert not missing, f"run `k3 bench kernels --static --write`; not committed: {sorted(missing)[:3]}"
    assert kernels_static.table(static_rows) in kernels_static.DOC.read_text()


def test_mla_heads_follow_the_plans():
    heads = static_cases.mla_head_counts()
    assert set(heads) == {6, 12, 24, 48, 96}
    assert "gb300-nvl72 TP8/DCP8" in heads[96] and "h200-16x TP16/DCP8" in heads[48]


def test_parse_ptxas_and_blocks_per_sm_by_hand():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
           "ptxas info    : Function properties for k\n"
           "    16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 16 bytes cumulative stack size\n")
    assert parse_ptxas(log) == (255, 12, 8, 16)
    with pytest.raises(ValueError, match="without register"):
        parse_ptxas("ptxas info    : 0 bytes gmem\n")
    h = ARCHS["sm_90a"]
    # 255 regs -> 8192 per warp (256-unit allocation), 4 warps -> 32768: two blocks by registers
    assert blocks_per_sm(Usage(255, 0, 0, 0, 1024, 4, 3), h) == 2
    # 128 regs x 8 warps = 32768 registers, 55 KB shared (+1 KB reserved): two by registers, four by shared memory
    assert blocks_per_sm(Usage(128, 0, 0, 0, 55 * 1024, 8, 3), h) == 2
    # 32 regs, 4 warps: the 32-block and 2048-thread limits (16 blocks of 128 threads)
    assert blocks_per_sm(Usage(32, 0, 0, 0, 0, 4, 3), h) == 16
    assert blocks_per_sm(Usage(32, 0, 0, 0, 100 * 1024, 4, 3), h) == 2
    assert problems(Usage(32, 0, 0, 0, 228 * 1024, 4, 3), h) == [f"shared {228 * 1024} B > {227 * 1024} B per block",
                                                                  "no block fits on an SM"]
    assert problems(Usage(255, 4, 0, 0, 0, 4, 3), h) == ["spills 4 B stores / 0 B loads"]


HOARD = textwrap.dedent("""
    import json
    import torch, triton, triton.language as tl
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction
    from k3_sglang.tooling.bench import static_compile as sc

    @triton.jit
    def hoard(x_ptr, out_ptr, N: tl.constexpr):  # one warp keeps N x N fp32 live across a sort and a reduction
        i = tl.arange(0, N)
        x = tl.load(x_ptr + i[:, None] * N + i[None, :])
        y = tl.sort(x, 1)
        tl.store(out_ptr + i[:, None] * N + i[None, :], y * tl.sum(x, 0)[None, :])

    before = (JITFunction.run, driver._active)
    x = torch.zeros(64, 64)
    with sc.capture(sc.ARCHS["sm_90a"]) as launches:
        hoard[(1,)](x, x, N=64, num_warps=1)
    restored = (JITFunction.run, driver._active) == before and not hoard.device_caches
    (name, kernel), = launches
    u = sc.usage_of(kernel, sc.ARCHS["sm_90a"])
    print(json.dumps({"restored": restored, "name": name, "warps": u.num_warps, "spill": u.spill_stores,
                      "problems": sc.problems(u, sc.ARCHS["sm_90a"])}))
""")


def test_a_kernel_built_to_spill_is_caught_and_triton_is_restored(tmp_path):
    script = tmp_path / "hoard.py"  # a file: Triton reads a kernel's source from it
    script.write_text(HOARD)
    done = subprocess.run([sys.executable, str(script)], env=_clean_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["restored"] and got["name"] == "hoard" and got["warps"] == 1 and got["spill"] > 0
    assert any(p.startswith("spills") for p in got["problems"])
