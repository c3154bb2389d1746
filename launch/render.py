"""Plan -> launch artefacts: which files a system gets, and writing them."""

from __future__ import annotations

from pathlib import Path

from k3_sglang.launch.layout import place_instances
from k3_sglang.launch.loopback import DEFAULT_WIDTH, TARGETS, loopback_file_name, render_loopback
from k3_sglang.launch.lws import render_lws
from k3_sglang.launch.settings import LaunchSettings
from k3_sglang.launch.shell import render_shell
from k3_sglang.launch.slurm import render_slurm
from k3_sglang.plan.capacity import PlanResult
from k3_sglang.plan.errors import PlanError
from k3_sglang.plan.spec import dump_plan_yaml

MAX_SHELL_HOSTS = 2  # the plain script covers one or two hosts; larger clusters want a scheduler


def artefact_names(result: PlanResult) -> list[str]:
    """File names `render_artefacts` produces for this plan's system."""
    name = f"k3-{result.spec.name}"
    if result.spec.system.is_rack:
        return ["plan.yaml", f"{name}.sbatch", f"{name}-lws.yaml"]
    return ["plan.yaml", f"{name}.sh"]


def render_artefacts(result: PlanResult, settings: LaunchSettings, target: str = "gpu",
                     loopback_width: int = DEFAULT_WIDTH) -> dict[str, str]:
    """{file name: text}: the plan itself plus SLURM + LWS (rack) or a shell script (1-2 hosts) for the GPU
    target; for `cpu-loopback`, the plan plus one script that runs its roles on this host (launch/loopback.py)."""
    if target not in TARGETS:
        raise PlanError("launch-target", f"--target {target}: choose one of {', '.join(TARGETS)}")
    plan_file = dump_plan_yaml(result.spec, _launch_section(settings))
    if target == "cpu-loopback":
        return {"plan.yaml": plan_file, loopback_file_name(result): render_loopback(result, settings, loopback_width)}
    instances = place_instances(result, settings)
    names = artefact_names(result)
    files = {names[0]: plan_file}
    if result.spec.system.is_rack:
        files[names[1]] = render_slurm(result, instances, settings)
        files[names[2]] = render_lws(result, instances, settings)
        return files
    hosts = max(i.first_node + i.nnodes for i in instances)
    if hosts > MAX_SHELL_HOSTS:
        raise PlanError("launch-hosts", f"the plan spans {hosts} hosts; the shell launcher covers at most "
                        f"{MAX_SHELL_HOSTS} (by {hosts - MAX_SHELL_HOSTS} too many)")
    files[names[1]] = render_shell(result, instances, settings)
    return files


def _launch_section(settings: LaunchSettings) -> dict:
    defaults = LaunchSettings()
    return {k: v for k, v in vars(settings).items() if v != getattr(defaults, k)}


def write_artefacts(files: dict[str, str], out_dir: str | Path) -> list[Path]:
    """Write the files (scripts executable); returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in files.items():
        path = out / name
        path.write_text(text)
        if name.endswith((".sh", ".sbatch")):
            path.chmod(0o755)
        paths.append(path)
    return paths
