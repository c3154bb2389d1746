"""Multi-node rehearsal: the rendered two-node command lines of every launch form (bash script, SLURM batch script,
LeaderWorkerSet manifest) started on loopback as two processes, one per node rank, SGLang's K3 on CPU
at TP2 across them over gloo (launch/rehearsal.py keeps the rendered --nnodes, --node-rank
and --dist-init-addr, resolved as each form's runtime would, and swaps the rack's TP/DCP/EP and GPU flags for the
tiny checkpoint). Rank 0 serves; its greedy output must equal the float64 reference, which SGLang's K3 at TP1
matches token for token (tests/e2e/test_serve_matches_reference.py). About 3-5 minutes per form on 2 shared cores."""
from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from k3_sglang.launch.golden import render_example
from k3_sglang.launch.rehearsal import loopback_args, multinode_commands
from k3_sglang.net import free_port
from k3_sglang.serving.process import K3ServerProcess
from tests.e2e.parallel_checks import generate, prompt

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]
CPU_ARGS = ["--dtype", "float32", "--chunked-prefill-size", "64", "--max-total-tokens", "8192",
            "--mem-fraction-static", "0.98"]
FORMS = [("long-context", "k3-long-context.sh", "shell"), ("agent-100k", "k3-agent-100k.sbatch", "slurm"),
         ("agent-100k", "k3-agent-100k-lws.yaml", "lws")]


@pytest.mark.parametrize("preset,name,form", FORMS)
def test_two_node_ranks_serve_and_match_the_reference(preset, name, form, tiny_dir, reference, tmp_path):
    ranks = multinode_commands(render_example(preset)[name], form)
    dist_port = free_port()
    procs = [K3ServerProcess(loopback_args(argv, str(tiny_dir), dist_port, CPU_ARGS), tmp_path / f"rank{i}.log",
                             env={"K3_MAX_N": "16"}) for i, argv in enumerate(ranks)]
    try:
        with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:  # rank 0 is healthy only once rank 1 joined
            for started in [pool.submit(p.start, 900.0) for p in procs]:
                started.result()
        head = procs[0]
        info = httpx.get(head.url + "/get_server_info", timeout=30).json()
        assert (info["tp_size"], info["nnodes"], info["node_rank"]) == (2, 2, 0), info
        for length in (45, 2 * 64 + 37):
            ids = prompt(length, 77 + length)
            assert generate(head, ids, 10)["output_ids"] == reference.greedy(ids, 10), (form, length)
        assert all(p.proc.poll() is None for p in procs), "a node rank exited while serving"
    finally:
        for p in procs:
            p.stop()
