#!/usr/bin/env bash
# One command for a lent CUDA machine, under 9 minutes in all (each step has its own time limit):
#   bash bench/gpu_check.sh [REPORT]      (default: $OUT/gpu_check_report.md, else ./gpu_check_report.md)
# Made for the lent image: Python 3.12, torch, triton and pytest, no sglang, no network, 64 MiB carried. Nothing is
# installed or fetched: the checkout goes on PYTHONPATH (k3_sglang/_checkout.py maps kernels/ to k3_sglang.kernels).
# Kernel steps (torch + triton only):
#   1. environment: python, torch, triton, k3_sglang.kernels from this checkout, a visible CUDA device;
#   2. the kernel tests compiled on the GPU (tests/kernels, K3_KERNEL_TESTS_ON_GPU=1: `gpu` tests run, interpreter
#      tests skip);
#   2b. the k3_dcp_mla Triton kernel against the float64 reference on every DCP rank at K3's MLA shapes
#      (bench/dcp_kernel_check.py: torch and triton only; sm90 included);
#   2c. docs/roofline.md's rows measured: that kernel for one MLA layer at every (preset, context 32K-1M, DCP 1-8)
#      row, time and fraction of the measured copy bandwidth (bench/roofline_check.py; fails only on a non-finite
#      output);
#   3. bench/kernels_gpu.py: our server's Triton kernels (the k3_dcp_mla decode, the LSE merge) checked and timed at
#      K3-full shapes against the measured copy bandwidth.
# SGLang steps, only where sglang 0.5.23 imports (elsewhere reported as NOT RUN; they never fail the kernel verdict):
#   4. the CPU plugin's kernel tests that need SGLang (tests/model, K3_KERNEL_TESTS_ON_GPU=1);
#   5. the tiny K3 served on CUDA by SGLang's own K3, token for token against the float64 reference.
# Everything (machine, versions, each step's exit code, time and output, two verdicts) goes to one markdown report.
# Exit code 0 only when the kernel steps passed and no SGLang step that ran failed. A step that cannot run is
# reported as NOT RUN, never as a pass; without a CUDA device the kernel verdict is NOT RUN and the exit code 1.
set -u
cd "$(dirname "$0")/.."
REPO=$(pwd)
REPORT=${1:-${OUT:-.}/gpu_check_report.md}
PY=${PYTHON:-python3}
NOT_RUN=3  # exit code of a step that could not run here (it prints NOT RUN and the reason)
export PY NOT_RUN PYTHONUNBUFFERED=1 K3_CACHE_DIR=${K3_CACHE_DIR:-$(mktemp -d)/k3-cache}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET

section() { printf '\n## %s\n\n' "$1" >>"$REPORT"; }

# step NAME SECONDS 'SHELL COMMAND': run it (the functions below included) under a time limit, append its exit code,
# duration and output to the report; returns the command's exit code.
step() {
    local name=$1 limit=$2 log rc start
    shift 2
    log=$(mktemp)
    start=$(date +%s)
    timeout --kill-after=10 "$limit" bash -c "$*" >"$log" 2>&1
    rc=$?
    section "$name"
    {
        printf -- '- command: `%s`\n- exit code: %s%s\n- time: %s s (limit %s s)\n\n```\n' "$*" "$rc" \
            "$([ "$rc" = 124 ] && echo ' (time limit reached)')$([ "$rc" = "$NOT_RUN" ] && echo ' (not run)')" \
            "$(($(date +%s) - start))" "$limit"
        tail -n 200 "$log"
        printf '```\n'
    } >>"$REPORT"
    echo "gpu_check: $name -> exit $rc"
    rm -f "$log"
    return "$rc"
}

environment() {
    "$PY" -c 'import sys, torch, triton, k3_sglang.kernels.dispatch as d
print("python", sys.version.split()[0], "| torch", torch.__version__, "| triton", triton.__version__)
print("k3_sglang.kernels from", d.__file__)
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")' \
        || return 1
    if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
        echo "NOT RUN: no CUDA device visible to torch"
        return "$NOT_RUN"
    fi
}

sglang_ready() {
    "$PY" -c 'import sys, sglang; v = sglang.__version__; print("sglang", v); sys.exit(0 if v == "0.5.23" else 4)'
}

serve_vs_reference() {
    "$PY" -m pytest tests/e2e/test_serve_matches_reference.py -q -p no:cacheprovider -rA
}

verdict() {  # verdict LABEL RC...: PASS if every rc is 0, FAIL if one failed, NOT RUN if one could not run
    local label=$1 rc state=PASS
    shift
    for rc in "$@"; do
        if [ "$rc" = "$NOT_RUN" ] && [ "$state" = PASS ]; then state="NOT RUN"; fi
        if [ "$rc" != 0 ] && [ "$rc" != "$NOT_RUN" ]; then state=FAIL; fi
    done
    echo "- $label: $state" >>"$REPORT"
    echo "$state"
}

: >"$REPORT"
{
    echo "# gpu_check report"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- checkout: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "- host: $(nproc) cores, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)"
    echo "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'none visible')"
    echo "- python: $("$PY" --version 2>&1); PYTHONPATH=$PYTHONPATH (nothing installed)"
} >>"$REPORT"

export -f environment sglang_ready serve_vs_reference
step "1. environment (torch, triton, the checkout's kernels, CUDA)" 60 environment
ENV_RC=$?
if [ "$ENV_RC" = 0 ]; then
    step "2. kernel tests, compiled (K3_KERNEL_TESTS_ON_GPU=1)" 150 \
        'K3_KERNEL_TESTS_ON_GPU=1 "$PY" -m pytest tests/kernels -q -p no:cacheprovider -rs'
    TESTS_RC=$?
    step "2b. k3_dcp_mla Triton kernel vs the float64 reference (bench/dcp_kernel_check.py)" 60 \
        '"$PY" bench/dcp_kernel_check.py'
    DCP_RC=$?
    step "2c. docs/roofline.md rows: k3_dcp_mla per MLA layer vs measured bandwidth (bench/roofline_check.py)" 100 \
        '"$PY" bench/roofline_check.py --iters 20'
    ROOF_RC=$?
    step "3. kernel benchmark (bench/kernels_gpu.py)" 120 '"$PY" bench/kernels_gpu.py --iters 30 --warmup 5'
    BENCH_RC=$?
else
    TESTS_RC=$NOT_RUN DCP_RC=$NOT_RUN ROOF_RC=$NOT_RUN BENCH_RC=$NOT_RUN  # the verdict still fails on a failed environment step (ENV_RC)
fi

SGLANG_STATE=$(sglang_ready 2>&1 | tail -n 1)
if sglang_ready >/dev/null 2>&1 && [ "$ENV_RC" = 0 ]; then
    step "4. model layers through the kernels, compiled (tests/model)" 80 \
        'K3_KERNEL_TESTS_ON_GPU=1 "$PY" -m pytest tests/model -q -p no:cacheprovider -rs'
    MODEL_RC=$?
    step "5. tiny K3 on CUDA (SGLang's K3) vs the float64 reference" 170 serve_vs_reference
    SERVE_RC=$?
else
    section "4-5. SGLang steps"
    echo "NOT RUN: they need sglang 0.5.23 ($SGLANG_STATE) and a passed environment step (exit $ENV_RC)" >>"$REPORT"
    echo "gpu_check: SGLang steps -> not run"
    MODEL_RC=$NOT_RUN SERVE_RC=$NOT_RUN
fi

section "verdict"
KERNELS=$(verdict "kernels (steps 1-3)" "$ENV_RC" "$TESTS_RC" "$DCP_RC" "$ROOF_RC" "$BENCH_RC")
SGLANG=$(verdict "SGLang steps (4-5)" "$MODEL_RC" "$SERVE_RC")
echo "gpu_check: kernels $KERNELS, SGLang steps $SGLANG; report in $REPORT"
[ "$KERNELS" = PASS ] && [ "$SGLANG" != FAIL ]
