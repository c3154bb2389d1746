"""`k3 plan`: size a K3 deployment (weights, pools, sessions) and say which ceiling binds."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from k3_sglang.cli import CliError
from k3_sglang.plan.args import add_plan_arguments, spec_from_args
from k3_sglang.plan.capacity import make_plan
from k3_sglang.plan.chart import draw_chart
from k3_sglang.plan.report import plan_json, plan_table
from k3_sglang.plan.spec import dump_json, dump_plan_yaml


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `plan` subcommand."""
    parser = subparsers.add_parser("plan", help="capacity planner: sessions per topology, binding ceiling",
                                   description=__doc__)
    add_plan_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON ({spec, result})")
    parser.add_argument("--chart", metavar="PNG", help="also write the DCP x GPU-count capacity chart")
    parser.add_argument("--save", metavar="PLAN.yaml", help="also write the plan's inputs as YAML")
    parser.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    """Build, check and print the plan; bad input or an impossible plan raises CliError (exit 2)."""
    try:
        spec = spec_from_args(args)
        result = make_plan(spec)
        if args.chart:
            draw_chart(spec, args.chart)
    except ValueError as exc:  # PlanError is a ValueError
        raise CliError(str(exc)) from None
    if args.save:
        Path(args.save).write_text(dump_plan_yaml(spec))
    sys.stdout.write(dump_json(plan_json(result)) if args.json else plan_table(result))
    return 0
