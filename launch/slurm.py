"""SLURM batch script for an NVL72 rack: one task per tray, one multi-node `k3 serve` per instance."""

from __future__ import annotations

from k3_sglang.launch.bash import FUNCTIONS, HEADER, exports, join_blocks, router_block, settings_block
from k3_sglang.launch.commands import Raw, router_command, serve_command, serving_env, shell_words
from k3_sglang.launch.layout import Instance, nodes_used
from k3_sglang.launch.settings import LaunchSettings
from k3_sglang.plan.capacity import PlanResult

MODEL = Raw('"$MODEL_PATH"')


def _node(index: int) -> str:
    return f'"${{NODES[{index}]}}"'


def _url(instance: Instance) -> str:
    return f"http://${{NODES[{instance.first_node}]}}:{instance.port}"


def _sbatch_lines(result: PlanResult, settings: LaunchSettings, trays: int) -> list[str]:
    lines = [f"#SBATCH --job-name=k3-{result.spec.name}", f"#SBATCH --nodes={trays}", "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={result.spec.system.gpus_per_node}", "#SBATCH --exclusive",
             f"#SBATCH --time={settings.slurm_time}", "#SBATCH --output=k3-%x-%j.log"]
    if settings.slurm_partition:
        lines.append(f"#SBATCH --partition={settings.slurm_partition}")
    if settings.slurm_account:
        lines.append(f"#SBATCH --account={settings.slurm_account}")
    return lines


def _node_list(trays: int) -> str:
    return f"""if [[ -n "${{K3_NODES:-}}" ]]; then
  read -r -a NODES <<< "$K3_NODES"
elif [[ -n "${{SLURM_JOB_NODELIST:-}}" ]]; then
  mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
else
  die "no node list: submit with sbatch, or set K3_NODES='host1 host2 ...'"
fi
(( ${{#NODES[@]}} >= {trays} )) || die "the plan needs {trays} trays, the allocation has ${{#NODES[@]}}"
"""


START_ON = r"""start_on() {  # start_on HOST COMMAND...: one task on one tray, in the background
  local host="$1"; shift
  if (( DRY_RUN )); then show "srun on ${host}" "$@"; return 0; fi
  srun --nodes=1 --ntasks=1 --nodelist="$host" --kill-on-bad-exit=1 "$@" &
  PIDS+=("$!")
}
"""


def _instance_block(instance: Instance, result: PlanResult) -> str:
    nodes = instance.nodes
    lines = [f"# {instance.name}: {instance.group.label()}, trays {nodes.start}-{nodes.stop - 1}"]
    for rank, node in enumerate(nodes):
        dist = Raw(f'"${{NODES[{instance.first_node}]}}:{instance.dist_init_port}"')
        words = serve_command(instance, result.spec, MODEL, str(rank), dist)
        lines.append(f"start_on {_node(node)} {shell_words(words)}")
    return "\n".join(lines) + "\n"


def render_slurm(result: PlanResult, instances: list[Instance], settings: LaunchSettings) -> str:
    """The batch script text."""
    trays = nodes_used(instances)
    spec = result.spec
    summary = ", ".join(f"{g.group.replicas} x {g.group.label()}" for g in result.groups)
    head = [HEADER, *_sbatch_lines(result, settings, trays),
            f"# Rendered by `k3 launch render` from plan {spec.name!r} on {spec.system.name}; re-render, do not edit.",
            f"# {summary}: {spec.topology.total_gpus} GPUs on {trays} trays of {spec.system.gpus_per_node}.",
            "# Usage: sbatch THIS_FILE            (bash THIS_FILE --dry-run prints the commands)",
            "set -euo pipefail"]
    arguments = ('DRY_RUN=0\nfor arg in "$@"; do\n  case "$arg" in\n    --dry-run) DRY_RUN=1 ;;\n'
                 '    *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;\n  esac\ndone')
    blocks = ["\n".join(head), settings_block(settings.model_path, settings.health_timeout_s), arguments,
              exports(serving_env(spec), "Mooncake KV transfer over the rack's MNNVL fabric"),
              FUNCTIONS, START_ON, _node_list(trays)]
    blocks += [_instance_block(i, result) for i in instances]
    blocks.append("\n".join(f'wait_healthy {i.name} "{_url(i)}"' for i in instances))
    blocks.append(router_block(router_command([(Raw(f'"{_url(i)}"'), i) for i in instances], settings)))
    return join_blocks(blocks)
