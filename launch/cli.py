"""`k3 launch render`: write launch scripts and manifests for a plan."""

from __future__ import annotations

import argparse
import sys

from k3_sglang.cli import CliError
from k3_sglang.launch.loopback import DEFAULT_WIDTH, TARGETS
from k3_sglang.launch.render import render_artefacts, write_artefacts
from k3_sglang.launch.settings import settings_from_dict
from k3_sglang.plan.args import add_plan_arguments, plan_document_from_args
from k3_sglang.plan.capacity import make_plan
from k3_sglang.plan.spec import spec_from_dict


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `launch` subcommand (with its `render` action)."""
    parser = subparsers.add_parser("launch", help="render launch scripts for a plan", description=__doc__)
    actions = parser.add_subparsers(dest="launch_action", metavar="ACTION")
    render = actions.add_parser("render", help="write SLURM/LWS (NVL72) or shell (8-GPU hosts) launchers")
    add_plan_arguments(render)
    render.add_argument("--out", required=True, metavar="DIR", help="folder to write the artefacts into")
    render.add_argument("--dry-run", action="store_true", help="print what would be written and the commands")
    render.add_argument("--model-path", help="weights folder on the GPU hosts")
    render.add_argument("--image", help="container image (LeaderWorkerSet manifests)")
    render.add_argument("--router-port", type=int)
    render.add_argument("--base-port", type=int, help="HTTP port of the first server (others count up)")
    render.add_argument("--target", choices=TARGETS, default="gpu",
                        help="gpu: the plan's hosts (default); cpu-loopback: its roles on this CPU host over "
                             "127.0.0.1, one server per group (docs/pd.md)")
    render.add_argument("--loopback-width", type=int, default=DEFAULT_WIDTH, metavar="N",
                        help=f"cpu-loopback: cap TP/DCP/PP/EP at N (default {DEFAULT_WIDTH})")
    parser.set_defaults(func=run_launch)


def run_launch(args: argparse.Namespace) -> int:
    """Render (or, with --dry-run, print) the launch artefacts of the plan the flags describe."""
    if args.launch_action != "render":
        raise CliError("choose an action: k3 launch render (PLAN.yaml | --system PRESET ...) --out DIR")
    try:
        doc = plan_document_from_args(args)
        settings = settings_from_dict(doc.pop("launch", None)).with_overrides(
            model_path=args.model_path, image=args.image, router_port=args.router_port, base_port=args.base_port)
        result = make_plan(spec_from_dict(doc))
        files = render_artefacts(result, settings, args.target, args.loopback_width)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.dry_run:
        for name, text in files.items():
            sys.stdout.write(f"would write {args.out}/{name} ({len(text.splitlines())} lines)\n")
        for line in _commands(files):
            sys.stdout.write(line + "\n")
        return 0
    for path in write_artefacts(files, args.out):
        sys.stdout.write(f"wrote {path}\n")
    return 0


def _commands(files: dict[str, str]) -> list[str]:
    """The server and router command lines inside the rendered scripts."""
    lines = []
    for name, text in files.items():
        if not name.endswith((".sh", ".sbatch")):
            continue
        for line in text.splitlines():
            stripped = line.strip()
            if stripped.startswith(("start_on ", "start k3", "start env", "ROUTER=(")) or (
                    stripped.startswith("start ") and " k3 serve " in stripped):
                lines.append(f"{name}: {stripped}")
    return lines
