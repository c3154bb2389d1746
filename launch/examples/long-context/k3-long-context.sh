#!/usr/bin/env bash
# Rendered by `k3 launch render` from plan 'long-context' on h200-16x; re-render, do not edit.
# 1 x unified TP16 DCP8 EP16: 16 GPUs on 2 host(s) of 8.
# Usage: K3_NODE_ADDRS='ADDR0 ADDR1' bash THIS_FILE NODE_RANK   (on every host; rank 0 runs the router); add --dry-run to print the commands.
set -euo pipefail

MODEL_PATH="${MODEL_PATH:-/models/Kimi-K3}"
HEALTH_TIMEOUT_S="${HEALTH_TIMEOUT_S:-1800}"
HEALTH_POLL_S="${HEALTH_POLL_S:-10}"

DRY_RUN=0
NODE_RANK=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    [0-9]) NODE_RANK="$arg" ;;
    *) echo "usage: $0 NODE_RANK(0-1) [--dry-run]" >&2; exit 2 ;;
  esac
done
if [[ -z "$NODE_RANK" ]] || (( NODE_RANK > 1 )); then
  echo "usage: $0 NODE_RANK(0-1) [--dry-run]" >&2
  exit 2
fi

# NIC pinning: NCCL/Gloo bootstrap and IB HCAs (multi-host H200 does not start without it); override from the environment
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-eth0}"
export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-eth0}"
export NCCL_IB_HCA="${NCCL_IB_HCA:-mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7}"

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

start() {  # start COMMAND...: a server on this host, in the background
  if (( DRY_RUN )); then show "node ${NODE_RANK}" "$@"; return 0; fi
  "$@" &
  PIDS+=("$!")
}

read -r -a NODE_ADDRS <<< "${K3_NODE_ADDRS:-}"
(( ${#NODE_ADDRS[@]} == 2 )) || die "set K3_NODE_ADDRS to the 2 host addresses, rank 0 first"

node_0() {
  # unified-0: unified TP16 DCP8 EP16, host rank 0 of 2
  start k3 serve --model-path "$MODEL_PATH" --trust-remote-code --tp-size 16 --dcp-size 8 --dcp-comm-backend a2a --ep-size 16 --attention-backend k3_dcp_mla --cuda-graph-backend-decode disabled --kv-cache-dtype bf16 --mamba-ssm-dtype float32 --mamba-full-memory-ratio 0.15 --mamba-radix-cache-strategy extra_buffer --mamba-max-states-per-path 2 --mem-fraction-static 0.9 --page-size 64 --moe-runner-backend marlin --nnodes 2 --node-rank 0 --dist-init-addr "${NODE_ADDRS[0]}:5000" --host 0.0.0.0 --port 30000
}

node_1() {
  # unified-0: unified TP16 DCP8 EP16, host rank 1 of 2
  start k3 serve --model-path "$MODEL_PATH" --trust-remote-code --tp-size 16 --dcp-size 8 --dcp-comm-backend a2a --ep-size 16 --attention-backend k3_dcp_mla --cuda-graph-backend-decode disabled --kv-cache-dtype bf16 --mamba-ssm-dtype float32 --mamba-full-memory-ratio 0.15 --mamba-radix-cache-strategy extra_buffer --mamba-max-states-per-path 2 --mem-fraction-static 0.9 --page-size 64 --moe-runner-backend marlin --nnodes 2 --node-rank 1 --dist-init-addr "${NODE_ADDRS[0]}:5000" --host 0.0.0.0 --port 30000
}

case "$NODE_RANK" in 0) node_0 ;; 1) node_1 ;; esac

if (( NODE_RANK != 0 )); then
  (( DRY_RUN )) && exit 0
  (( ${#PIDS[@]} )) || exit 0
  status=0
  wait -n "${PIDS[@]}" || status=$?
  die "a server on host ${NODE_RANK} exited (status ${status})"
fi

wait_healthy unified-0 "http://${NODE_ADDRS[0]}:30000"

ROUTER=(k3 router --worker "http://${NODE_ADDRS[0]}:30000" --host 0.0.0.0 --port 8000)
if (( DRY_RUN )); then show router "${ROUTER[@]}"; exit 0; fi
echo "k3-launch: all servers healthy; starting the router"
"${ROUTER[@]}" || die "router exited with status $?"
