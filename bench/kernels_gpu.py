"""GPU kernel benchmark: `python bench/kernels_gpu.py [--batches 1 8 32 64] [--only kda mla ...]`.

Same as `k3 bench kernels`: checks every Triton kernel against its reference at K3-full shapes, then times it
against the device's measured copy bandwidth and matmul rate. Exits with code 2 (and a message) without CUDA.
"""
from __future__ import annotations

import sys

from k3_sglang.bench.kernels import main

if __name__ == "__main__":
    sys.exit(main())
