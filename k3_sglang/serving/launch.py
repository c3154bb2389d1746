"""Process entry of `k3 serve`: SGLang's HTTP server with our request guard and a ready line.

The ready line goes through SGLang's own public `launch_server(server_args, launch_callback=...)`, the call SGLang's
`run_server` makes in its default (HTTP) mode; the other modes (encoder-only, SMG gRPC, Ray) go to `run_server`
unchanged, without a ready line. Nothing in SGLang is replaced.

Run as `python -m k3_sglang.serving.launch <sglang args>` with the environment `k3 serve` composed (its
decision in `K3_DEPLOYMENT`, k3_sglang/deployment.py; SGLANG_PLATFORM=k3_cpu on CPU). When SGLang's K3 runs on the
k3_cpu platform, the parsed ServerArgs (a `--config` file included) are checked again against the same limits table before any server
starts (serving/limits_table.py): exit code 2 and the reasons, as `k3 serve` gives them.
"""

from __future__ import annotations

import os
import sys

from k3_sglang import deployment as deployment_decision
from k3_sglang.serving.guards import RequestGuard, SampleLimits
from k3_sglang.serving.limits_table import deployment_refusals, refusal_message
from k3_sglang.serving.retention import RetentionSettings
from k3_sglang.serving.settings import ServeSettings
from k3_sglang.sglang_guard import check_sglang_version


def _ready_line(host: str, port: int, model: str) -> str:
    url = f"http://{host}:{port}"
    return (
        f"k3 serve: ready at {url} (model {model}, OpenAI API at {url}/v1)\n"
        f"  try: curl {url}/v1/chat/completions -H 'Content-Type: application/json' "
        f"-d '{{\"model\": \"default\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}], \"max_tokens\": 16}}'"
    )


# `run_server` flags (raw and resolved) that select a mode other than SGLang's default HTTP server
OTHER_MODE_FLAGS = ("encoder_only", "smg_grpc_mode", "grpc_mode", "use_ray")


def _other_mode(cfg) -> bool:
    return any(getattr(cfg, flag, False) for flag in OTHER_MODE_FLAGS)


def serve(server_args, run_server, launch_server) -> None:
    """SGLang's default HTTP mode as `run_server` starts it, plus `launch_callback` printing our ready line once
    SGLang reports ready; any other mode through `run_server` itself (it seeds gRPC's tokenizer path before
    resolving, so those flags are read raw first, then again once resolution has settled them)."""
    from sglang.srt.arg_groups.overrides import resolving_view

    if not _other_mode(server_args):
        server_args.resolve_once()  # what run_server does first (idempotent: run_server's own call returns)
        if not _other_mode(resolving_view(server_args)):
            def announce():
                print(_ready_line(server_args.host, server_args.port, server_args.model_path), flush=True)

            launch_server(server_args, launch_callback=announce)
            return
    run_server(server_args)


def install_guard(app, settings: ServeSettings) -> None:
    """Our request guard (serving/guards.py) in front of SGLang's FastAPI app, with the process's limits."""
    app.add_middleware(RequestGuard, limits=SampleLimits(settings.max_n, settings.max_sequences),
                       max_retain_s=RetentionSettings.from_env().max_s)


def main(argv: list[str]) -> None:
    check_sglang_version("k3 serve")  # before SGLang's plugins run (they check again in every server process)
    from sglang.launch_server import run_server
    from sglang.srt.entrypoints import http_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    settings = ServeSettings.from_env()
    load_plugins()
    server_args = prepare_server_args(argv)
    message = None
    decided = deployment_decision.current()  # K3_DEPLOYMENT, or SGLang's own selectors for a server started by hand
    if decided is not None and decided.on_cpu:
        reasons = deployment_refusals(decided, server_args, os.environ if decided.on_cpu else None)
        message = refusal_message(decided, reasons) if reasons else None
    if message:
        print(f"k3 serve: error: {message}", file=sys.stderr, flush=True)
        sys.exit(2)
    install_guard(http_server.app, settings)
    try:
        serve(server_args, run_server, http_server.launch_server)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
