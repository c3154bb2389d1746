"""`k3 router ...` (serve) and `k3 router replay TRACE.jsonl ...`.

    k3 router --worker http://127.0.0.1:30000 --worker http://127.0.0.1:30001 [--config workers.yaml]
              [--host 127.0.0.1] [--port 30080] [--admin-key KEY] [--api-key KEY]
    k3 router replay TRACE.jsonl [--json] [--workers 4] [--kv-tokens N] [--state-slots N] ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shlex
import sys

from k3_sglang.router.config import ConfigError, RouterConfig, WorkerSpec, load_config_file


def _cli_error(message: str) -> Exception:
    from k3_sglang.cli import CliError

    return CliError(message)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `router` (serve options on the parent, `replay` as a sub-subcommand)."""
    parser = subparsers.add_parser("router", help="session-placing router in front of SGLang workers",
                                   description="Serve the router (default) or replay a trace (`replay`).")
    add_serve_arguments(parser)
    parser.set_defaults(func=run_serve)
    actions = parser.add_subparsers(dest="router_action", metavar="ACTION")
    replay = actions.add_parser("replay", help="replay a Mooncake trace against a simulated fleet")
    add_replay_arguments(replay)
    replay.set_defaults(func=run_replay_command)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the router service."""
    parser.add_argument("--worker", action="append", default=[], metavar="URL", help="SGLang worker URL (repeat)")
    parser.add_argument("--config", metavar="YAML", help="config file (workers, capacities, policy, reliability)")
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 30080)")
    parser.add_argument("--admin-key", help="key for the admin API (disabled without it)")
    parser.add_argument("--api-key", help="key clients must send (Authorization: Bearer KEY)")
    parser.add_argument("--admission", choices=("reject", "queue"), help="when full: 429 or a bounded wait")
    parser.add_argument("--session-ttl", type=float, metavar="S", help="idle session TTL in seconds")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def build_serve_config(args: argparse.Namespace) -> RouterConfig:
    """Merge the config file and flags (flags win); CliError on bad input."""
    try:
        config = load_config_file(args.config) if args.config else RouterConfig()
        extra = tuple(WorkerSpec(url=url) for url in args.worker)
    except ConfigError as exc:
        raise _cli_error(str(exc)) from None
    known = {w.url for w in config.workers}
    workers = config.workers + tuple(w for w in extra if w.url not in known)
    if not workers:
        raise _cli_error("no workers: pass --worker URL (repeatable) or --config FILE with a workers list")
    if args.port is not None and not 0 <= args.port <= 65535:
        raise _cli_error(f"--port must be 0..65535, got {args.port}")
    policy = config.policy
    try:
        if args.admission:
            policy = dataclasses.replace(policy, admission=args.admission)
        if args.session_ttl is not None:
            policy = dataclasses.replace(policy, session_ttl_s=args.session_ttl)
    except ConfigError as exc:
        raise _cli_error(str(exc)) from None
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port), ("admin_key", args.admin_key),
                                   ("api_key", args.api_key)) if v is not None}
    return dataclasses.replace(config, workers=workers, policy=policy, **overrides)


def run_serve(args: argparse.Namespace) -> int:
    """Start the router service (blocks until interrupted)."""
    import uvicorn

    from k3_sglang.router.app import create_app

    config = build_serve_config(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if config.host not in ("127.0.0.1", "localhost", "::1") and config.api_key is None:
        logging.getLogger("k3.router").warning("binding %s without --api-key: client endpoints are open", config.host)
    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level=args.log_level,
                access_log=False, timeout_keep_alive=75)
    return 0


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the trace replay."""
    parser.add_argument("trace", help="Mooncake-format JSONL trace")
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    parser.add_argument("--workers", type=int, default=4, help="fleet size (default 4)")
    parser.add_argument("--kv-tokens", type=int, default=2_097_152,
                        help="KV tokens per worker, DCP included (default 2,097,152 = 262,144 x DCP 8)")
    parser.add_argument("--state-slots", type=int, default=64, help="KDA state slots per worker (default 64)")
    parser.add_argument("--prefill-tps", type=float, default=12_000.0, help="prefill tokens/s per worker (default 12,000)")
    parser.add_argument("--tpot-ms", type=float, default=30.0, help="decode time per output token")
    parser.add_argument("--session-ttl", type=float, default=1800.0, help="idle session TTL (s)")
    parser.add_argument("--limit", type=int, help="replay only the first N requests")
    parser.add_argument("--docs-dir", default="docs", help="where the table and plot go (default docs/)")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/")


def run_replay_command(args: argparse.Namespace) -> int:
    """Run the replay and print/write its table."""
    from k3_sglang.router.config import PolicyConfig
    from k3_sglang.router.replay import markdown_table, report, run_replay
    from k3_sglang.router.replay_sim import FleetSpec, load_trace

    for name in ("workers", "kv_tokens", "state_slots", "prefill_tps", "tpot_ms", "session_ttl"):
        if getattr(args, name) <= 0:
            raise _cli_error(f"--{name.replace('_', '-')} must be positive")
    if args.limit is not None and args.limit <= 0:
        raise _cli_error("--limit must be positive")
    if not os.path.isfile(args.trace):
        raise _cli_error(f"trace not found: {args.trace}")
    try:
        trace = load_trace(args.trace, args.limit)
    except ValueError as exc:
        raise _cli_error(str(exc)) from None
    if not trace:
        raise _cli_error(f"trace {args.trace} has no requests")
    spec = FleetSpec(args.workers, args.kv_tokens, args.state_slots, args.prefill_tps, args.tpot_ms / 1000.0)
    rows, samples = run_replay(trace, spec, PolicyConfig(session_ttl_s=args.session_ttl))
    if not args.no_write:
        given = sys.argv[1:]
        command = "k3 " + " ".join(shlex.quote(a) for a in given) if given[:2] == ["router", "replay"] \
            else f"k3 router replay {args.trace}"
        report(rows, samples, spec, args.trace, command, args.docs_dir)
    print(json.dumps(rows, indent=2) if args.json else markdown_table(rows))
    return 0
