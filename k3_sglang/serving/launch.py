"""Process entry of `k3 serve`: SGLang's HTTP server with our request guard and a ready line.

Run as `python -m k3_sglang.serving.launch <sglang args>` with the environment `k3 serve` composed (its
decision in `K3_DEPLOYMENT`, k3_sglang/deployment.py; SGLANG_EXTERNAL_MODEL_PACKAGE for the portable model,
SGLANG_PLATFORM=k3_cpu on CPU). When the portable model serves, or SGLang's own K3 runs on the k3_cpu platform, the
parsed ServerArgs (a `--config` file included) are checked again against the same limits table before any server
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


READY_LINE_TARGET = "sglang.srt.entrypoints.http_server.launch_server"
_sglang_launch_server = None  # SGLang's own launch_server, set by main() before it is replaced


def launch_with_ready_line(args, *a, **kw):
    """SGLang's `launch_server` with a `launch_callback` that prints our ready line once SGLang reports ready."""
    def announce():
        print(_ready_line(args.host, args.port, args.model_path), flush=True)

    kw.setdefault("launch_callback", announce)
    return _sglang_launch_server(args, *a, **kw)


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
    if decided is not None and (decided.portable or decided.on_cpu):
        reasons = deployment_refusals(decided, server_args, os.environ if decided.on_cpu else None)
        message = refusal_message(decided, reasons) if reasons else None
    if message:
        print(f"k3 serve: error: {message}", file=sys.stderr, flush=True)
        sys.exit(2)
    install_guard(http_server.app, settings)
    global _sglang_launch_server
    _sglang_launch_server = http_server.launch_server
    http_server.launch_server = launch_with_ready_line
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
