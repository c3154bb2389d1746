"""`k3 router ...` (serve) and `k3 router replay TRACE.jsonl ...`.

    k3 router --worker http://127.0.0.1:30000 --worker http://127.0.0.1:30001 [--config workers.yaml]
              [--host 127.0.0.1] [--port 30080] [--admin-key KEY] [--api-key KEY]
    k3 router --prefill http://127.0.0.1:30000 [8998] --decode http://127.0.0.1:30001   (PD disaggregation)
    k3 router replay TRACE.jsonl [--json] [--workers 4] [--kv-tokens N] [--state-slots N] ...
    k3 router make-trace shared-prompt|tool-agent --out FILE [--sessions N] [--arrival-gap S] [--seed N]
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
    make_trace = actions.add_parser("make-trace", help="write a deterministic synthetic Mooncake-format trace")
    add_make_trace_arguments(make_trace)
    make_trace.set_defaults(func=run_make_trace)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the router service."""
    parser.add_argument("--worker", action="append", default=[], metavar="URL", help="SGLang worker URL (repeat)")
    parser.add_argument("--prefill", action="append", default=[], nargs="+", metavar=("URL", "BOOTSTRAP_PORT"),
                        help="PD prefill server, optionally with its --disaggregation-bootstrap-port "
                             "(default: read from the server) (repeat)")
    parser.add_argument("--decode", action="append", default=[], metavar="URL", help="PD decode server (repeat)")
    parser.add_argument("--config", metavar="YAML", help="config file (workers, capacities, policy, reliability)")
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 30080)")
    parser.add_argument("--admin-key", help="key for the admin API (disabled without it)")
    parser.add_argument("--api-key", help="key clients must send (Authorization: Bearer KEY)")
    parser.add_argument("--admission", choices=("reject", "queue"), help="when full: 429 or a bounded wait")
    parser.add_argument("--session-ttl", type=float, metavar="S", help="idle session TTL in seconds")
    parser.add_argument("--session-home", choices=("score", "rendezvous"),
                        help="a new session's home: lowest score, or rendezvous hashing of its id (router replicas)")
    parser.add_argument("--curve-key", metavar="FILE",
                        help="this router's ZMQ certificate (both keys) for workers whose KV events use CURVE")
    parser.add_argument("--curve-server-key", metavar="FILE", help="the workers' public ZMQ certificate")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def build_serve_config(args: argparse.Namespace) -> RouterConfig:
    """Merge the config file and flags (flags win); CliError on bad input."""
    try:
        config = load_config_file(args.config) if args.config else RouterConfig()
        extra = tuple(WorkerSpec(url=url) for url in args.worker) + _pd_specs(args.prefill, args.decode)
    except ConfigError as exc:
        raise _cli_error(str(exc)) from None
    known = {w.url for w in config.workers}
    workers = config.workers + tuple(w for w in extra if w.url not in known)
    if not workers:
        raise _cli_error("no workers: pass --worker URL (repeatable), or --prefill URL and --decode URL for PD, "
                         "or --config FILE with a workers list")
    if args.port is not None and not 0 <= args.port <= 65535:
        raise _cli_error(f"--port must be 0..65535, got {args.port}")
    policy = config.policy
    try:
        if args.admission:
            policy = dataclasses.replace(policy, admission=args.admission)
        if args.session_ttl is not None:
            policy = dataclasses.replace(policy, session_ttl_s=args.session_ttl)
        if args.session_home:
            policy = dataclasses.replace(policy, session_home=args.session_home)
    except ConfigError as exc:
        raise _cli_error(str(exc)) from None
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port), ("admin_key", args.admin_key),
                                   ("api_key", args.api_key), ("events_curve_key", args.curve_key),
                                   ("events_curve_server_key", args.curve_server_key)) if v is not None}
    try:
        config = dataclasses.replace(config, workers=workers, policy=policy, **overrides)
    except ConfigError as exc:
        raise _cli_error(str(exc)) from None
    if config.events_curve_key is not None:
        from k3_sglang.router.event_curve import load_keys

        try:
            if load_keys(config.events_curve_key, "--curve-key").secret is None:
                raise ValueError(f"--curve-key: {config.events_curve_key} holds no secret key")
            load_keys(config.events_curve_server_key, "--curve-server-key")
        except ValueError as exc:
            raise _cli_error(str(exc)) from None
    return config


def _pd_specs(prefill: list[list[str]], decode: list[str]) -> tuple[WorkerSpec, ...]:
    """WorkerSpecs of `--prefill URL [BOOTSTRAP_PORT]` and `--decode URL` (ConfigError when malformed)."""
    specs = []
    for words in prefill:
        if len(words) > 2:
            raise ConfigError(f"--prefill takes URL [BOOTSTRAP_PORT], got {' '.join(words)!r}")
        port = None
        if len(words) == 2:
            if not words[1].isdigit():
                raise ConfigError(f"--prefill {words[0]}: bootstrap port must be a number, got {words[1]!r}")
            port = int(words[1])
        specs.append(WorkerSpec(url=words[0], role="prefill", bootstrap_port=port))
    return tuple(specs) + tuple(WorkerSpec(url=url, role="decode") for url in decode)


def preflight(config: RouterConfig, timeout_s: float = 3.0) -> None:
    """Ask every worker what it is before serving; CliError for a role or KV-layout problem that is certain.
    Workers that do not answer are judged later, when they come up (at pairing)."""
    import concurrent.futures

    import httpx

    from k3_sglang.router.pd import preflight_problems

    def info(url: str):
        try:
            response = httpx.get(url + "/get_server_info", timeout=timeout_s, trust_env=False)
            return response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    urls = [w.url for w in config.workers]
    with concurrent.futures.ThreadPoolExecutor(min(16, len(urls))) as pool:
        infos = dict(zip(urls, pool.map(info, urls)))
    problems = preflight_problems([(w.url, w.role) for w in config.workers], infos)
    if problems:
        raise _cli_error("; ".join(problems))


def run_serve(args: argparse.Namespace) -> int:
    """Start the router service (blocks until interrupted)."""
    from aiohttp import web

    from k3_sglang.router.app import create_app
    from k3_sglang.router.threaded import new_event_loop

    config = build_serve_config(args)
    preflight(config)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("k3.router")
    if config.host not in ("127.0.0.1", "localhost", "::1") and config.api_key is None:
        log.warning("binding %s without --api-key: client endpoints are open", config.host)
    if config.disaggregated:
        roles = [w.role for w in config.workers]
        fleet = f"{roles.count('prefill')} prefill and {roles.count('decode')} decode server(s) (PD)"
    else:
        fleet = f"{len(config.workers)} worker(s)"
    ready = f"k3 router on http://{config.host}:{config.port} in front of {fleet}"
    web.run_app(create_app(config), host=config.host, port=config.port, access_log=None, keepalive_timeout=75,
                shutdown_timeout=5, loop=new_event_loop(), print=lambda *_: print(ready, flush=True))
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
    parser.add_argument("--policy", action="append", default=[], metavar="KEY=VALUE",
                        help="override a policy knob of our policy, e.g. kv_barrier_s=1.0 (repeatable)")
    parser.add_argument("--limit", type=int, help="replay only the first N requests")
    parser.add_argument("--docs-dir", default="docs", help="where the table and plot go (default docs/)")
    parser.add_argument("--section", help="docs section and plot name (default: the trace's file name)")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/")
    parser.add_argument("--events", action="store_true",
                        help="compare the event-fed arms (text-inferred, event-fed, event-fed + retention + prefetch) "
                             "on workers that publish KV events, instead of the baselines")
    parser.add_argument("--replicas", type=int, metavar="N",
                        help="compare one router replica with N (requests split round-robin, events to all), "
                             "keyless and with named sessions (rendezvous homes), instead of the baselines")
    parser.add_argument("--retain-s", type=float, default=300.0, help="--events: retention each session asks for")
    parser.add_argument("--host-factor", type=float, default=1.0,
                        help="--events: host-tier size as a multiple of the device cache (0: no host tier)")


def run_replay_command(args: argparse.Namespace) -> int:
    """Run the replay and print/write its table."""
    from k3_sglang.tooling.router.replay import markdown_table, report, run_replay, section_name
    from k3_sglang.tooling.router.replay_sim import FleetSpec, load_trace

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
    policy = policy_from_overrides(args.policy, session_ttl_s=args.session_ttl)
    if args.replicas is not None:
        from k3_sglang.tooling.router.replay_replicas import run_replica_replay

        if args.replicas < 2 or args.events:
            raise _cli_error("--replicas must be >= 2 (and is not combined with --events)")
        rows, samples = run_replica_replay(trace, spec, policy, args.replicas)
        args.section = args.section or f"replicas{args.replicas}-" + section_name(args.trace)
    elif args.events:
        from k3_sglang.tooling.router.replay_events import event_arms

        if args.retain_s < 0 or args.host_factor < 0:
            raise _cli_error("--retain-s and --host-factor must be >= 0")
        arms = event_arms(args.retain_s, args.host_factor)
        rows, samples = run_replay(trace, spec, policy, names=list(arms), arms=arms)
        args.section = args.section or "events-" + section_name(args.trace)
    else:
        rows, samples = run_replay(trace, spec, policy)
    if not args.no_write:
        given = sys.argv[1:]
        command = "k3 " + " ".join(shlex.quote(a) for a in given) if given[:2] == ["router", "replay"] \
            else f"k3 router replay {args.trace}" + (" --events" if args.events else "")
        report(rows, samples, spec, args.trace, command, args.docs_dir, args.section)
    print(json.dumps(rows, indent=2) if args.json else markdown_table(rows))
    return 0


def policy_from_overrides(pairs: list[str], **base):
    """A PolicyConfig from `KEY=VALUE` strings (typed like the field they set); CliError when wrong."""
    from k3_sglang.router.config import PolicyConfig

    names = sorted(f.name for f in dataclasses.fields(PolicyConfig))
    values = dict(base)
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or key not in names:
            raise _cli_error(f"--policy {pair!r}: expected KEY=VALUE with KEY one of {', '.join(names)}")
        kind = type(getattr(PolicyConfig(), key))
        try:
            values[key] = raw.lower() in ("1", "true", "yes") if kind is bool else kind(raw)
        except ValueError:
            raise _cli_error(f"--policy {pair!r}: {key} takes a {kind.__name__}") from None
    try:
        return PolicyConfig(**values)
    except ConfigError as exc:
        raise _cli_error(str(exc)) from None


def add_make_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the synthetic trace generator."""
    from k3_sglang.tooling.router.trace_gen import KINDS

    parser.add_argument("kind", choices=KINDS, help="shared-prompt (one system prompt for all) or tool-agent")
    parser.add_argument("--out", required=True, help="JSONL file to write")
    parser.add_argument("--sessions", type=int, help="conversations / agent sessions (default 1,500 / 800)")
    parser.add_argument("--arrival-gap", type=float, metavar="S", help="mean seconds between new sessions")
    parser.add_argument("--seed", type=int, default=0)


def run_make_trace(args: argparse.Namespace) -> int:
    """Generate a synthetic trace and write it."""
    from k3_sglang.tooling.router.trace_gen import default_shape, generate, write_trace

    if args.sessions is not None and args.sessions <= 0:
        raise _cli_error("--sessions must be positive")
    if args.arrival_gap is not None and not args.arrival_gap > 0:
        raise _cli_error("--arrival-gap must be positive")
    shape = default_shape(args.kind, args.sessions)
    if args.arrival_gap is not None:
        shape = dataclasses.replace(shape, arrival_gap_s=args.arrival_gap)
    rows = generate(args.kind, shape, args.seed)
    try:
        write_trace(args.out, rows)
    except OSError as exc:
        raise _cli_error(f"cannot write {args.out}: {exc.strerror}") from None
    print(f"wrote {len(rows)} requests ({shape.sessions} sessions) to {args.out}")
    return 0
