"""Bash shared by the rendered scripts: argument handling, failure, process tracking, health waits."""

from __future__ import annotations

from k3_sglang.launch.commands import shell_words

HEADER = "#!/usr/bin/env bash"


def settings_block(model_path: str, health_timeout_s: int) -> str:
    """Overridable settings at the top of every script."""
    return f"""MODEL_PATH="${{MODEL_PATH:-{model_path}}}"
HEALTH_TIMEOUT_S="${{HEALTH_TIMEOUT_S:-{health_timeout_s}}}"
HEALTH_POLL_S="${{HEALTH_POLL_S:-10}}"
"""


FUNCTIONS = r"""die() { echo "k3-launch: error: $*" >&2; exit 1; }

PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

show() {  # show LABEL COMMAND...: print a command the way --dry-run reports it
  local label="$1"; shift
  printf '[dry-run] %s:' "$label"
  printf ' %q' "$@"
  printf '\n'
}

wait_healthy() {  # wait_healthy NAME URL: poll URL/health; fail if a server dies or time runs out
  local name="$1" url="$2" start=$SECONDS pid
  if (( DRY_RUN )); then echo "[dry-run] wait for ${url}/health (${name})"; return 0; fi
  until curl -fsS -o /dev/null --max-time 5 "${url}/health"; do
    for pid in "${PIDS[@]}"; do
      kill -0 "$pid" 2>/dev/null || die "${name}: a server process exited before ${url}/health answered"
    done
    (( SECONDS - start < HEALTH_TIMEOUT_S )) || die "${name}: ${url}/health not ready after ${HEALTH_TIMEOUT_S}s"
    sleep "$HEALTH_POLL_S"
  done
  echo "k3-launch: ${name} healthy at ${url}"
}
"""


def router_block(router_words: list[str]) -> str:
    """Start the router in the foreground once every server is healthy (or print it under --dry-run)."""
    return f"""ROUTER=({shell_words(router_words)})
if (( DRY_RUN )); then show router "${{ROUTER[@]}}"; exit 0; fi
echo "k3-launch: all servers healthy; starting the router"
"${{ROUTER[@]}}" || die "router exited with status $?"
"""


def exports(env: dict[str, str], comment: str, overridable: bool = False) -> str:
    """`export K=V` lines (as defaults the caller's environment can override, if asked)."""
    if not env:
        return ""
    lines = [f"# {comment}"]
    for key, value in env.items():
        lines.append(f'export {key}="${{{key}:-{value}}}"' if overridable else f"export {key}={value}")
    return "\n".join(lines) + "\n"


def join_blocks(blocks: list[str]) -> str:
    """Script text: non-empty blocks separated by one blank line."""
    return "\n\n".join(b.strip("\n") for b in blocks if b.strip()) + "\n"
