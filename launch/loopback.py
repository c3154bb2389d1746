"""A plan's deployment shape on one CPU host over loopback: `k3 launch render --target cpu-loopback`.

The GPU plan (say agent-100k: 2 x PP8 prefill and 7 x TP8/DCP8/EP8 decode servers behind `k3 router`) is
kept role for role and feature for feature, at a width 2 cores run: one server per group; TP, DCP, PP and EP
capped at `width` (default 2), a feature the plan uses (DCP > 1, PP > 1, EP > 1) staying on; the servers
serve the embedded tiny K3 (or MODEL_PATH) with `k3 serve`'s CPU defaults for dtype, pools and chunking, so
the plan's GPU memory flags and layer partition do not apply. PD servers talk Mooncake TCP on 127.0.0.1
(serving/pd_cpu.py). What this exercises: the same roles, the same parallel features and the same
router pairing as the rack deployment; what it does not: the plan's sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from k3_sglang.launch.bash import FUNCTIONS, HEADER, join_blocks
from k3_sglang.launch.commands import ROUTER, SERVE, Raw, shell_words
from k3_sglang.launch.layout import group_names
from k3_sglang.launch.settings import LaunchSettings
from k3_sglang.plan.capacity import PlanResult
from k3_sglang.plan.errors import PlanError

LOOPBACK = "127.0.0.1"
DEFAULT_WIDTH = 2
MAX_WIDTH = 8  # `k3 serve` on CPU is tested up to TP8/DCP8 (oversubscribed); wider is refused here
TARGETS = ("gpu", "cpu-loopback")


@dataclass(frozen=True)
class LoopbackServer:
    """One `k3 serve` of the loopback deployment: a plan group shrunk to `width`."""

    name: str
    role: str
    tp: int
    dcp: int
    pp: int
    ep: int
    index: int  # port offset: HTTP BASE_PORT + index, bootstrap BOOTSTRAP_PORT + index
    source: str  # the plan group it stands for, e.g. '7 x decode TP8 DCP8 EP8'

    def label(self) -> str:
        """e.g. 'decode TP2 DCP2 EP2'."""
        parts = [self.role, f"TP{self.tp}"]
        parts += [f"{name}{value}" for name, value in (("DCP", self.dcp), ("PP", self.pp), ("EP", self.ep))
                  if value > 1]
        return " ".join(parts)


def _cap(value: int, width: int) -> int:
    return min(value, width) if value > 1 else 1


def loopback_servers(result: PlanResult, width: int = DEFAULT_WIDTH) -> list[LoopbackServer]:
    """One server per plan group, every parallel size capped at `width` (a size > 1 stays > 1).

    DCP stripes over attention-TP, so it is capped to the capped TP; EP likewise. DP attention is not
    served by SGLang's K3 on CPU and has no loopback form: such a plan is refused (PlanError)."""
    if not 2 <= width <= MAX_WIDTH:
        raise PlanError("loopback-width", f"--loopback-width {width}: choose 2 to {MAX_WIDTH}")
    servers = []
    for index, (name, plan) in enumerate(zip(group_names(result), result.groups)):
        g = plan.group
        if g.dp_attention > 1:
            raise PlanError("loopback-dp-attention", f"group {name} uses DP attention ({g.label()}), which the "
                            "SGLang's K3 on CPU does not serve; a cpu-loopback render needs dp_attention 1")
        tp = _cap(g.tp, width)
        servers.append(LoopbackServer(
            name=f"{name}-0", role=g.role, tp=tp, dcp=min(_cap(g.dcp, width), tp), pp=_cap(g.pp, width),
            ep=min(_cap(g.ep, width), tp), index=index, source=f"{g.replicas} x {g.label()}"))
    return servers


def _port(var: str, index: int) -> Raw:
    return Raw(f'"$(({var} + {index}))"')


def _url(server: LoopbackServer) -> Raw:
    return Raw(f'"http://{LOOPBACK}:$((BASE_PORT + {server.index}))"')


def loopback_serve_command(server: LoopbackServer) -> list[str]:
    """`k3 serve` words for one loopback server (MODEL_ARGS and K3_SERVE_ARGS are shell arrays)."""
    words = list(SERVE) + [Raw('"${MODEL_ARGS[@]}"'), "--tp-size", str(server.tp)]
    if server.dcp > 1:
        words += ["--dcp-size", str(server.dcp)]
    if server.pp > 1:
        words += ["--pp-size", str(server.pp)]
    if server.ep > 1:
        words += ["--ep-size", str(server.ep)]
    if server.role != "unified":
        words += ["--disaggregation-mode", server.role]
    if server.role == "prefill":
        words += ["--disaggregation-bootstrap-port", _port("BOOTSTRAP_PORT", server.index)]
    return words + ["--host", LOOPBACK, "--port", _port("BASE_PORT", server.index), Raw('"${SERVE_EXTRA[@]}"')]


def loopback_router_command(servers: list[LoopbackServer]) -> list[str]:
    """`k3 router` over the loopback servers, PD pairs as `--prefill URL BOOTSTRAP --decode URL`."""
    words = list(ROUTER)
    for server in servers:
        if server.role == "prefill":
            words += ["--prefill", _url(server), _port("BOOTSTRAP_PORT", server.index)]
        elif server.role == "decode":
            words += ["--decode", _url(server)]
        else:
            words += ["--worker", _url(server)]
    return words + ["--host", LOOPBACK, "--port", Raw('"$ROUTER_PORT"'), Raw('"${ROUTER_EXTRA[@]}"')]


def _settings(settings: LaunchSettings) -> str:
    return f"""BASE_PORT="${{BASE_PORT:-{settings.base_port}}}"
BOOTSTRAP_PORT="${{BOOTSTRAP_PORT:-{settings.bootstrap_port}}}"
ROUTER_PORT="${{ROUTER_PORT:-{settings.router_port}}}"
HEALTH_TIMEOUT_S="${{HEALTH_TIMEOUT_S:-900}}"
HEALTH_POLL_S="${{HEALTH_POLL_S:-2}}"
MODEL_ARGS=()
if [[ -n "${{MODEL_PATH:-}}" ]]; then MODEL_ARGS=(--model-path "$MODEL_PATH"); fi
read -r -a SERVE_EXTRA <<< "${{K3_SERVE_ARGS:-}}"
read -r -a ROUTER_EXTRA <<< "${{K3_ROUTER_ARGS:-}}"
"""


ARGUMENTS = """DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
  esac
done
command -v k3 >/dev/null || (( DRY_RUN )) || die "k3 is not on PATH (activate the k3-sglang environment)"
"""

START = r"""start() {  # start NAME COMMAND...: a server in the background, its output in LOG_DIR/NAME.log
  local name="$1"; shift
  if (( DRY_RUN )); then show "$name" "$@"; return 0; fi
  "$@" > "${LOG_DIR}/${name}.log" 2>&1 &
  PIDS+=("$!")
  echo "k3-launch: started ${name} (pid $!, log ${LOG_DIR}/${name}.log)"
}
"""

ROUTER_RUN = """supervise() {{  # run until the router or any server exits, then stop the rest
  local status=0
  wait -n "${{PIDS[@]}}" || status=$?
  die "a server or the router exited (status ${{status}}); stopping the rest (logs in ${{LOG_DIR}})"
}}

ROUTER=({router})
if (( DRY_RUN )); then show router "${{ROUTER[@]}}"; exit 0; fi
echo "k3-launch: all servers healthy; router on http://{host}:${{ROUTER_PORT}}"
"${{ROUTER[@]}}" &
PIDS+=("$!")
supervise
"""

# SIGTERM/SIGINT end the script through its EXIT trap, which stops every server it started
SIGNALS = "trap 'trap - EXIT; cleanup; exit 143' TERM\ntrap 'trap - EXIT; cleanup; exit 130' INT\n"


def render_loopback(result: PlanResult, settings: LaunchSettings, width: int = DEFAULT_WIDTH) -> str:
    """The loopback script text: start every server, wait for /health, run the router in the foreground."""
    servers = loopback_servers(result, width)
    spec = result.spec
    head = [HEADER,
            f"# Rendered by `k3 launch render --target cpu-loopback` from plan {spec.name!r} ({spec.system.name}); "
            "re-render, do not edit.",
            "# The plan's roles on this host over 127.0.0.1, one server per group, parallel sizes capped at "
            f"{width} (launch/loopback.py):"]
    head += [f"#   {s.name}: {s.label()}  (plan: {s.source})" for s in servers]
    head += ["# Usage: bash THIS_FILE [--dry-run]. MODEL_PATH (default: the embedded tiny K3), K3_SERVE_ARGS (added "
             "to every k3 serve),",
             "# K3_ROUTER_ARGS, BASE_PORT, BOOTSTRAP_PORT, ROUTER_PORT, LOG_DIR override; Ctrl-C stops everything.",
             "# shellcheck disable=SC2317  # cleanup runs from the traps; shellcheck cannot see that",
             "set -euo pipefail"]
    log_dir = ('if (( DRY_RUN )); then LOG_DIR="${LOG_DIR:-LOG_DIR}"; '
               'else LOG_DIR="${LOG_DIR:-$(mktemp -d -t k3-loopback.XXXXXX)}"; fi\n')
    starts = "\n".join(f"start {s.name} {shell_words(loopback_serve_command(s))}" for s in servers)
    waits = "\n".join(f"wait_healthy {s.name} {_url(s)}" for s in servers)
    router = ROUTER_RUN.format(router=shell_words(loopback_router_command(servers)), host=LOOPBACK)
    return join_blocks(["\n".join(head), _settings(settings), FUNCTIONS, SIGNALS, ARGUMENTS, log_dir, START, starts, waits,
                        router])


def loopback_file_name(result: PlanResult) -> str:
    """e.g. k3-agent-100k-cpu-loopback.sh."""
    return f"k3-{result.spec.name}-cpu-loopback.sh"
