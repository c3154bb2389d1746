"""The `k3` command line: one entry point, one subcommand per module.

Each subcommand module exposes `register(subparsers)`, which adds its parser and sets
`func=<callable taking the parsed args and returning an exit code>`. Modules are
imported lazily: a module that fails to import only disables its own subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand name -> module that registers it
SUBCOMMAND_MODULES: dict[str, str] = {
    "serve": "k3_sglang.serving.cli",
    "make-tiny": "k3_sglang.tiny.cli",
    "router": "k3_sglang.router.cli",
    "plan": "k3_sglang.plan.cli",
    "launch": "k3_sglang.launch.cli",
    "bench": "k3_sglang.bench.cli",
}


class CliError(Exception):
    """A user-facing error: printed as `k3: error: ...`, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="k3", description="k3-sglang: Kimi K3 long-context serving on SGLang")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in SUBCOMMAND_MODULES.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # subcommand not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    # `k3 serve` passes unknown flags through to SGLang; other commands are strict.
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if extra and not getattr(args, "accepts_extra_args", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "accepts_extra_args", False):
        args.extra_args = extra
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"k3 {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
