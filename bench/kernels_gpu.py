"""GPU kernel benchmark: `python bench/kernels_gpu.py [--batches 1 8 32] [--only mla merge]`.

The same run as `k3 bench kernels`: checks our server's Triton kernels (the k3_dcp_mla decode and the LSE merge)
against their references at K3-full shapes, then times them against the device's measured copy bandwidth and
matmul rate. Exit code 1 if a reference check fails, 2 (with a message) without CUDA. Runs from a checkout with
only torch and triton installed (bench/gpu_check.sh puts the checkout on PYTHONPATH).
"""
from __future__ import annotations

import sys

from k3_sglang.tooling.bench import kernels

if __name__ == "__main__":
    sys.exit(kernels.main(sys.argv[1:]))
