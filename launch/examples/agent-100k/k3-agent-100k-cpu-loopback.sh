#!/usr/bin/env bash
# Rendered by `k3 launch render --target cpu-loopback` from plan 'agent-100k' (gb300-nvl72); re-render, do not edit.
# The plan's roles on this host over 127.0.0.1, one server per group, parallel sizes capped at 2 (launch/loopback.py):
#   prefill-0: prefill TP1 PP2  (plan: 2 x prefill TP1 PP8)
#   decode-0: decode TP2 DCP2 EP2  (plan: 7 x decode TP8 DCP8 EP8)
# Usage: bash THIS_FILE [--dry-run]. MODEL_PATH (default: the embedded tiny K3), K3_SERVE_ARGS (added to every k3 serve),
# K3_ROUTER_ARGS, BASE_PORT, BOOTSTRAP_PORT, ROUTER_PORT, LOG_DIR override; Ctrl-C stops everything.
# shellcheck disable=SC2317  # cleanup runs from the traps; shellcheck cannot see that
set -euo pipefail

BASE_PORT="${BASE_PORT:-30000}"
BOOTSTRAP_PORT="${BOOTSTRAP_PORT:-8998}"
ROUTER_PORT="${ROUTER_PORT:-8000}"
HEALTH_TIMEOUT_S="${HEALTH_TIMEOUT_S:-900}"
HEALTH_POLL_S="${HEALTH_POLL_S:-2}"
MODEL_ARGS=()
if [[ -n "${MODEL_PATH:-}" ]]; then MODEL_ARGS=(--model-path "$MODEL_PATH"); fi
read -r -a SERVE_EXTRA <<< "${K3_SERVE_ARGS:-}"
read -r -a ROUTER_EXTRA <<< "${K3_ROUTER_ARGS:-}"

die() { echo "k3-launch: error: $*" >&2; exit 1; }

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

trap 'trap - EXIT; cleanup; exit 143' TERM
trap 'trap - EXIT; cleanup; exit 130' INT

DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
  esac
done
command -v k3 >/dev/null || (( DRY_RUN )) || die "k3 is not on PATH (activate the k3-sglang environment)"

if (( DRY_RUN )); then LOG_DIR="${LOG_DIR:-LOG_DIR}"; else LOG_DIR="${LOG_DIR:-$(mktemp -d -t k3-loopback.XXXXXX)}"; fi

start() {  # start NAME COMMAND...: a server in the background, its output in LOG_DIR/NAME.log
  local name="$1"; shift
  if (( DRY_RUN )); then show "$name" "$@"; return 0; fi
  "$@" > "${LOG_DIR}/${name}.log" 2>&1 &
  PIDS+=("$!")
  echo "k3-launch: started ${name} (pid $!, log ${LOG_DIR}/${name}.log)"
}

start prefill-0 k3 serve "${MODEL_ARGS[@]}" --tp-size 1 --pp-size 2 --disaggregation-mode prefill --disaggregation-bootstrap-port "$((BOOTSTRAP_PORT + 0))" --host 127.0.0.1 --port "$((BASE_PORT + 0))" "${SERVE_EXTRA[@]}"
start decode-0 k3 serve "${MODEL_ARGS[@]}" --tp-size 2 --dcp-size 2 --ep-size 2 --disaggregation-mode decode --host 127.0.0.1 --port "$((BASE_PORT + 1))" "${SERVE_EXTRA[@]}"

wait_healthy prefill-0 "http://127.0.0.1:$((BASE_PORT + 0))"
wait_healthy decode-0 "http://127.0.0.1:$((BASE_PORT + 1))"

supervise() {  # run until the router or any server exits, then stop the rest
  local status=0
  wait -n "${PIDS[@]}" || status=$?
  die "a server or the router exited (status ${status}); stopping the rest (logs in ${LOG_DIR})"
}

ROUTER=(k3 router --prefill "http://127.0.0.1:$((BASE_PORT + 0))" "$((BOOTSTRAP_PORT + 0))" --decode "http://127.0.0.1:$((BASE_PORT + 1))" --host 127.0.0.1 --port "$ROUTER_PORT" "${ROUTER_EXTRA[@]}")
if (( DRY_RUN )); then show router "${ROUTER[@]}"; exit 0; fi
echo "k3-launch: all servers healthy; router on http://127.0.0.1:${ROUTER_PORT}"
"${ROUTER[@]}" &
PIDS+=("$!")
supervise
