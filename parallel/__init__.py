"""Parallelism for K3 serving (installed as `k3_sglang.parallel`): the TP layout (`tp.py`), pipeline stages and their
wire format (`pipeline.py`, `pipeline_trace.py`). DCP (stripe layout, kernel, merges) lives with the k3_dcp_mla
backend: `k3_sglang/dcp_mla` and `kernels/mla/dcp_*.py`."""
