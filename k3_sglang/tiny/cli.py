"""`k3 make-tiny DIR`."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("make-tiny", help="write the deterministic random k3-tiny checkpoint")
    parser.add_argument("out_dir", type=Path, help="folder to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument("--no-tokenizer", action="store_true", help="omit the tokenizer (for --skip-tokenizer-init tests)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from k3_sglang.cli import CliError
    from k3_sglang.tiny.checkpoint import write_tiny_checkpoint

    if args.out_dir.exists() and not args.out_dir.is_dir():
        raise CliError(f"{args.out_dir} exists and is not a folder")
    path = write_tiny_checkpoint(args.out_dir, seed=args.seed, with_tokenizer=not args.no_tokenizer)
    print(f"wrote k3-tiny checkpoint to {path}")
    return 0
