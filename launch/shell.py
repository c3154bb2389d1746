"""Plain shell script for one or two 8-GPU hosts (H200, B300): run it on every host with its rank."""

from __future__ import annotations

from k3_sglang.launch.bash import FUNCTIONS, HEADER, exports, join_blocks, router_block, settings_block
from k3_sglang.launch.commands import Raw, nic_pinning_env, router_command, serve_command, serving_env, shell_words
from k3_sglang.launch.layout import Instance, nodes_used
from k3_sglang.launch.settings import LaunchSettings
from k3_sglang.plan.capacity import PlanResult

MODEL = Raw('"$MODEL_PATH"')

START = r"""start() {  # start COMMAND...: a server on this host, in the background
  if (( DRY_RUN )); then show "node ${NODE_RANK}" "$@"; return 0; fi
  "$@" &
  PIDS+=("$!")
}
"""


def _url(instance: Instance) -> str:
    return f"http://${{NODE_ADDRS[{instance.first_node}]}}:{instance.port}"


def _arguments(hosts: int) -> str:
    last = hosts - 1
    return f"""DRY_RUN=0
NODE_RANK=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    [0-9]) NODE_RANK="$arg" ;;
    *) echo "usage: $0 NODE_RANK(0-{last}) [--dry-run]" >&2; exit 2 ;;
  esac
done
if [[ -z "$NODE_RANK" ]] || (( NODE_RANK > {last} )); then
  echo "usage: $0 NODE_RANK(0-{last}) [--dry-run]" >&2
  exit 2
fi
"""


def _addresses(hosts: int) -> str:
    if hosts == 1:
        return 'read -r -a NODE_ADDRS <<< "${K3_NODE_ADDRS:-127.0.0.1}"\n'
    return f"""read -r -a NODE_ADDRS <<< "${{K3_NODE_ADDRS:-}}"
(( ${{#NODE_ADDRS[@]}} == {hosts} )) || die "set K3_NODE_ADDRS to the {hosts} host addresses, rank 0 first"
"""


def _node_function(node: int, instances: list[Instance], result: PlanResult) -> str:
    lines = [f"node_{node}() {{"]
    for instance in instances:
        if node not in instance.nodes:
            continue
        rank = node - instance.first_node
        dist = Raw(f'"${{NODE_ADDRS[{instance.first_node}]}}:{instance.dist_init_port}"')
        words = serve_command(instance, result.spec, MODEL, str(rank), dist)
        lines.append(f"  # {instance.name}: {instance.group.label()}, host rank {rank} of {instance.nnodes}")
        lines.append(f"  start {shell_words(words)}")
    if len(lines) == 1:
        lines.append("  :")
    return "\n".join(lines) + "\n}\n"


def _dispatch(hosts: int) -> str:
    cases = " ".join(f"{n}) node_{n} ;;" for n in range(hosts))
    return f"""case "$NODE_RANK" in {cases} esac

if (( NODE_RANK != 0 )); then
  (( DRY_RUN )) && exit 0
  (( ${{#PIDS[@]}} )) || exit 0
  status=0
  wait -n "${{PIDS[@]}}" || status=$?
  die "a server on host ${{NODE_RANK}} exited (status ${{status}})"
fi
"""


def render_shell(result: PlanResult, instances: list[Instance], settings: LaunchSettings) -> str:
    """The script text."""
    spec, hosts = result.spec, nodes_used(instances)
    summary = ", ".join(f"{g.group.replicas} x {g.group.label()}" for g in result.groups)
    usage = ("K3_NODE_ADDRS='ADDR0 ADDR1' bash THIS_FILE NODE_RANK   (on every host; rank 0 runs the router)"
             if hosts > 1 else "bash THIS_FILE 0")
    head = [HEADER,
            f"# Rendered by `k3 launch render` from plan {spec.name!r} on {spec.system.name}; re-render, do not edit.",
            f"# {summary}: {spec.topology.total_gpus} GPUs on {hosts} host(s) of {spec.system.gpus_per_node}.",
            f"# Usage: {usage}; add --dry-run to print the commands.",
            "set -euo pipefail"]
    blocks = ["\n".join(head), settings_block(settings.model_path, settings.health_timeout_s), _arguments(hosts),
              exports(nic_pinning_env(spec), "NIC pinning: NCCL/Gloo bootstrap and IB HCAs (multi-host H200 does "
                      "not start without it); override from the environment", overridable=True),
              exports(serving_env(spec), "Mooncake KV transfer"),
              FUNCTIONS, START, _addresses(hosts)]
    blocks += [_node_function(n, instances, result) for n in range(hosts)]
    blocks.append(_dispatch(hosts))
    blocks.append("\n".join(f'wait_healthy {i.name} "{_url(i)}"' for i in instances))
    blocks.append(router_block(router_command([(Raw(f'"{_url(i)}"'), i) for i in instances], settings)))
    return join_blocks(blocks)
