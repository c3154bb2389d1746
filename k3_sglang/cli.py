"""The `k3` command line: one entry point, one subcommand per module.

Each subcommand module exposes `register(subparsers)`, which adds its parser and sets
`func=<callable taking the parsed args and returning an exit code>`. Modules are
imported lazily: a module that fails to import only disables its own subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand name -> (module that registers it, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("k3_sglang.serving.cli", "serve K3 with SGLang (default: the tiny K3 on CPU)"),
    "make-tiny": ("k3_sglang.tiny.cli", "write the deterministic random k3-tiny checkpoint"),
    "router": ("k3_sglang.router.cli", "place agent sessions across SGLang workers"),
    "plan": ("k3_sglang.plan.cli", "capacity planner for K3 deployments"),
    "launch": ("k3_sglang.launch.cli", "render launch scripts from a plan"),
    "bench": ("k3_sglang.tooling.bench.cli", "run a benchmark"),
    "hooks": ("k3_sglang.sglang_fingerprints", "check the SGLang targets we hook against the committed snapshot"),
}


class CliError(Exception):
    """A user-facing error: printed as `k3 <command>: error: ...`, exit code 2."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `k3` parser; only `command`'s module is imported (the others get a placeholder)."""
    parser = argparse.ArgumentParser(prog="k3", description="k3-sglang: Kimi K3 long-context serving on SGLang")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        if name == command:
            importlib.import_module(module_name).register(sub)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in SUBCOMMANDS else None)
    # `k3 serve` passes unknown flags through to SGLang; other commands are strict.
    args, extra = parser.parse_known_args(argv)
    if args.command is None or not hasattr(args, "func"):
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
    # Run through the package module so CliError is the class the subcommands raise.
    from k3_sglang.cli import main as package_main

    sys.exit(package_main())
