"""The rendered examples in launch/examples/: which presets, and how to regenerate them.

    python -m k3_sglang.launch.golden      # rewrite launch/examples/ after changing the generator
"""

from __future__ import annotations

import sys
from pathlib import Path

from k3_sglang.launch.render import render_artefacts, write_artefacts
from k3_sglang.launch.settings import LaunchSettings
from k3_sglang.plan.capacity import make_plan
from k3_sglang.plan.presets import plan_preset
from k3_sglang.plan.spec import spec_from_dict

EXAMPLES_DIR = Path(__file__).parent / "examples"
EXAMPLE_PRESETS = ("agent-100k", "long-context")


def render_example(preset: str) -> dict[str, str]:
    """The artefacts of one plan preset with default launch settings: its GPU launchers and its
    cpu-loopback script (the same plan.yaml serves both)."""
    result, settings = make_plan(spec_from_dict(plan_preset(preset))), LaunchSettings()
    return {**render_artefacts(result, settings), **render_artefacts(result, settings, target="cpu-loopback")}


def regenerate(out_dir: Path = EXAMPLES_DIR) -> list[Path]:
    """Rewrite every example folder; returns the files written."""
    written = []
    for preset in EXAMPLE_PRESETS:
        folder = out_dir / preset
        for stale in folder.glob("*") if folder.is_dir() else ():
            stale.unlink()
        written += write_artefacts(render_example(preset), folder)
    return written


if __name__ == "__main__":
    for path in regenerate():
        sys.stdout.write(f"wrote {path}\n")
