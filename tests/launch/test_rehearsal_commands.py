"""launch/rehearsal.py (pure): the per-rank `k3 serve` lines of the rendered multi-node examples in all three forms
(bash script, SLURM batch script, LWS manifest), their variables resolved as each form's runtime would, and the
loopback rewrite keeping the multi-node flags. The servers themselves start in tests/e2e/test_multinode_rehearsal_slow.py."""
from __future__ import annotations

import pytest

from k3_sglang.launch.golden import render_example
from k3_sglang.launch.rehearsal import loopback_args, multinode_commands

FORMS = [("long-context", "k3-long-context.sh", "shell"), ("agent-100k", "k3-agent-100k.sbatch", "slurm"),
         ("agent-100k", "k3-agent-100k-lws.yaml", "lws")]


def _flag(argv, flag):
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("preset,name,form", FORMS)
def test_every_form_gives_two_ranks_of_one_tp_server(preset, name, form):
    ranks = multinode_commands(render_example(preset)[name], form)
    assert [(_flag(a, "--nnodes"), _flag(a, "--node-rank")) for a in ranks] == [("2", "0"), ("2", "1")]
    assert len({_flag(a, "--dist-init-addr") for a in ranks}) == 1
    assert _flag(ranks[0], "--dist-init-addr").startswith("127.0.0.1:")
    assert int(_flag(ranks[0], "--tp-size")) >= 8  # the rack's TP, rehearsed as TP2 on loopback
    rewritten = loopback_args(ranks[1], "/tiny", 4321, ["--dtype", "float32"])
    assert rewritten == ["--model-path", "/tiny", "--tp-size", "2", "--nnodes", "2", "--node-rank", "1",
                         "--dist-init-addr", "127.0.0.1:4321", "--host", "127.0.0.1", "--dtype", "float32"]


def test_unresolved_or_missing_flags_are_refused():
    raw = ["--tp-size", "8", "--nnodes", "$(LWS_GROUP_SIZE)", "--node-rank", "$(LWS_WORKER_INDEX)",
           "--dist-init-addr", "$(LWS_LEADER_ADDRESS):5000"]
    with pytest.raises(ValueError, match="unresolved multi-node flags"):
        loopback_args(raw, "/tiny", 1, [])
    with pytest.raises(ValueError, match="lacks --node-rank"):
        loopback_args(["--nnodes", "2"], "/tiny", 1, [])
    with pytest.raises(ValueError, match="unknown launch form 'helm'"):
        multinode_commands("", "helm")
    with pytest.raises(ValueError, match="no tensor-parallel LeaderWorkerSet"):
        multinode_commands("kind: Service\n", "lws")
