"""Launch artefacts for a K3 plan (installed as `k3_sglang.launch`).

`k3 launch render` turns a plan (k3_sglang.plan) into a SLURM batch script and LeaderWorkerSet
manifests for an NVL72 rack, or a shell script for one or two 8-GPU nodes. Every GPU node runs
`k3 serve`; the router (`k3 router`) starts once every server answers /health. `examples/` holds
the rendered presets; tests/launch regenerates and compares them.
"""

from k3_sglang.launch.render import render_artefacts, write_artefacts
from k3_sglang.launch.settings import LaunchSettings

__all__ = ["LaunchSettings", "render_artefacts", "write_artefacts"]
