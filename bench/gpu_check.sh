#!/usr/bin/env bash
# One command for a lent CUDA machine, under 9 minutes in all (each step has its own time limit, 510 s together):
#   1. install this checkout (editable; with its dependencies when an index is reachable, else --no-deps);
#   2. the kernel tests compiled on the GPU (K3_KERNEL_TESTS_ON_GPU=1: `gpu` tests run, interpreter tests skip);
#   2b. the k3_dcp_mla Triton kernel against the float64 reference on every DCP rank at K3's MLA shapes
#      (bench/dcp_kernel_check.py: torch and triton only, no pytest or SGLang; sm90 included);
#   3. the tiny K3 served on CUDA by the portable model (`k3 serve` picks it for the tiny checkpoint) and compared
#      token for token with the float64 reference (tests/e2e/test_serve_matches_reference.py);
#   4. bench/kernels_gpu.py: every Triton kernel checked and timed at K3-full shapes, and the fused KDA decode as a
#      fraction of the measured HBM bandwidth (goal >= 70 %).
# Everything (machine, versions, each step's exit code, time and output) goes to one markdown report:
#   bash bench/gpu_check.sh [REPORT]      (default: $OUT/gpu_check_report.md, else ./gpu_check_report.md)
# A step that cannot run (no CUDA, SGLang not installable offline) is reported as such, never as a pass.
set -u
cd "$(dirname "$0")/.."
REPORT=${1:-${OUT:-.}/gpu_check_report.md}
PY=${PYTHON:-python3}
export PY PYTHONUNBUFFERED=1 K3_CACHE_DIR=${K3_CACHE_DIR:-$(mktemp -d)/k3-cache}
unset TRITON_INTERPRET
FAILED=0

section() { printf '\n## %s\n\n' "$1" >>"$REPORT"; }

# step NAME SECONDS 'SHELL COMMAND': run it (functions below included) under a time limit, append its exit code,
# duration and output to the report.
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
            "$([ "$rc" = 124 ] && echo ' (time limit reached)')" "$(($(date +%s) - start))" "$limit"
        tail -n 200 "$log"
        printf '```\n'
    } >>"$REPORT"
    echo "gpu_check: $name -> exit $rc"
    rm -f "$log"
    [ "$rc" = 0 ] || FAILED=1
    return "$rc"
}

install() {
    if "$PY" -c 'import sglang' 2>/dev/null || ! "$PY" -m pip install -q -e '.[test]'; then
        # offline, or SGLang already there: this checkout only (Python 3.12 images: ignore our 3.11 pin)
        "$PY" -m pip install -q --no-deps --no-build-isolation --ignore-requires-python -e . || return 1
    fi
    "$PY" -c 'import k3_sglang.kernels.dispatch, torch, triton; print("k3_sglang", k3_sglang.__file__); print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available())'
}

serve_vs_reference() {
    if ! "$PY" -c 'import sglang' 2>/dev/null; then
        echo "NOT RUN: SGLang is not importable here (no package index reachable to install sglang==0.5.23)."
        return 3
    fi
    "$PY" -m pytest tests/e2e/test_serve_matches_reference.py -q -p no:cacheprovider -rA
}

: >"$REPORT"
{
    echo "# gpu_check report"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- checkout: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "- host: $(nproc) cores, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)"
    echo "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'none visible')"
    echo "- python: $("$PY" --version 2>&1)"
} >>"$REPORT"

export -f install serve_vs_reference
step "1. install" 60 install
step "2. kernel tests, compiled (K3_KERNEL_TESTS_ON_GPU=1)" 100 \
    'K3_KERNEL_TESTS_ON_GPU=1 "$PY" -m pytest tests/kernels -q -p no:cacheprovider -rs'
step "2b. k3_dcp_mla Triton kernel vs the float64 reference (bench/dcp_kernel_check.py)" 60 \
    '"$PY" bench/dcp_kernel_check.py'
step "3. tiny K3 on CUDA (portable model) vs the float64 reference" 170 serve_vs_reference
step "4. kernel benchmark (bench/kernels_gpu.py)" 120 '"$PY" bench/kernels_gpu.py --iters 30 --warmup 5'

section "verdict"
if [ "$FAILED" = 0 ]; then echo "every step exited 0" >>"$REPORT"; else echo "at least one step did not exit 0 (see above)" >>"$REPORT"; fi
echo "gpu_check: report in $REPORT"
exit "$FAILED"
