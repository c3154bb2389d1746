"""A multi-node command line, as rendered, made runnable on one CPU host: the loopback rehearsal of a two-node server.

The launch renderers write a multi-node server as one `k3 serve` per host with `--nnodes`, `--node-rank` and
`--dist-init-addr` filled from the form's own variables: the bash and SLURM scripts use the node list
(`"${NODE_ADDRS[0]}:5000"`, `"${NODES[4]}:5002"`), an LWS pod `$(LWS_GROUP_SIZE)`, `$(LWS_WORKER_INDEX)` and
`$(LWS_LEADER_ADDRESS)`. `multinode_commands` takes those per-rank argument lists out of a rendered artefact, and
`resolve` fills the variables as the form's runtime would (every host address 127.0.0.1; the LWS group size and
worker index from the manifest). `loopback_args` then keeps the multi-node flags as resolved and swaps what only
a GPU rack has (TP16/DCP8/EP, fp8/bf16 KV, MXFP4 MoE runners, PD) for the tiny checkpoint at TP2 on CPU (gloo);
each rank gets its own HTTP port (on separate hosts rank 1's placeholder health server shares rank 0's port; on
one host they would collide) and the rendezvous port is a free one.
"""
from __future__ import annotations

import re
import shlex

import yaml

LOOPBACK = "127.0.0.1"
_SHELL_HOST = re.compile(r"\$\{[A-Z_]+\[\d+\]\}")  # ${NODE_ADDRS[0]}, ${NODES[4]}
KEEP = ("--nnodes", "--node-rank", "--dist-init-addr")


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _serve_argv(words: list[str]) -> list[str]:
    """The `k3 serve` arguments of one rendered line (after `start`, `start_on HOST`, `env X=Y`)."""
    for i in range(len(words) - 1):
        if words[i] == "k3" and words[i + 1] == "serve":
            return words[i + 2:]
    raise ValueError(f"no `k3 serve` in {' '.join(words)[:200]}")


def _tensor_parallel(argv: list[str]) -> bool:
    return int(_value(argv, "--tp-size") or 1) > 1


def _script_commands(text: str) -> list[list[str]]:
    """bash / SLURM forms: the ranks of the first multi-node tensor-parallel server, in node-rank order."""
    groups: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        if "k3 serve" not in line or "--nnodes" not in line:
            continue
        argv = _serve_argv(shlex.split(line.strip()))
        if _tensor_parallel(argv):
            groups.setdefault(_value(argv, "--dist-init-addr"), []).append(argv)
    if not groups:
        raise ValueError("no multi-node tensor-parallel `k3 serve` in the script")
    ranks = next(iter(groups.values()))
    return sorted(ranks, key=lambda a: int(_value(a, "--node-rank")))


def _lws_commands(text: str) -> list[list[str]]:
    """LWS form: the leader's and each worker's command of the first tensor-parallel LeaderWorkerSet, with the
    variables LWS sets in every pod (leader: worker index 0; workers 1..size-1)."""
    for doc in yaml.safe_load_all(text):
        if not doc or doc.get("kind") != "LeaderWorkerSet":
            continue
        tmpl = doc["spec"]["leaderWorkerTemplate"]
        leader = tmpl["leaderTemplate"]["spec"]["containers"][0]["command"]
        worker = tmpl["workerTemplate"]["spec"]["containers"][0]["command"]
        if not _tensor_parallel(_serve_argv(leader)):
            continue
        size = int(tmpl["size"])
        pods = [(leader, 0)] + [(worker, i) for i in range(1, size)]
        env = {"LWS_GROUP_SIZE": str(size), "LWS_LEADER_ADDRESS": LOOPBACK}
        return [[re.sub(r"\$\((LWS_[A-Z_]+)\)", lambda m: {**env, "LWS_WORKER_INDEX": str(i)}[m.group(1)], w)
                 for w in _serve_argv(cmd)] for cmd, i in pods]
    raise ValueError("no tensor-parallel LeaderWorkerSet in the manifest")


def multinode_commands(text: str, form: str) -> list[list[str]]:
    """Per node rank, the `k3 serve` arguments of a rendered artefact's first multi-node TP server; form is
    `shell`, `slurm` or `lws`. Host variables of the script forms are resolved to 127.0.0.1."""
    if form == "lws":
        return _lws_commands(text)
    if form not in ("shell", "slurm"):
        raise ValueError(f"unknown launch form {form!r}; supported: shell, slurm, lws")
    return [[_SHELL_HOST.sub(LOOPBACK, w) for w in argv] for argv in _script_commands(text)]


def loopback_args(argv: list[str], model_path: str, dist_port: int, cpu_args: list[str]) -> list[str]:
    """One rank's rendered arguments for this host: the multi-node flags as resolved (rendezvous on dist_port),
    the tiny checkpoint at TP2, and cpu_args (dtype, chunking, pool); no --host/--port (the caller sets them)."""
    for flag in KEEP:
        if _value(argv, flag) is None:
            raise ValueError(f"rendered command lacks {flag}")
    nnodes, rank, addr = (_value(argv, f) for f in KEEP)
    host = addr.rsplit(":", 1)[0]
    if not (nnodes.isdigit() and rank.isdigit()) or host != LOOPBACK:
        raise ValueError(f"unresolved multi-node flags: --nnodes {nnodes} --node-rank {rank} --dist-init-addr {addr}")
    return ["--model-path", model_path, "--tp-size", nnodes, "--nnodes", nnodes, "--node-rank", rank,
            "--dist-init-addr", f"{host}:{dist_port}", "--host", LOOPBACK, *cpu_args]
