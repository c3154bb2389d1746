"""Parallelism for K3 serving (installed as `k3_sglang.parallel`): the tensor-parallel block layout (`tp.py`). Pipeline
stages are SGLang's own (its K3 and PP scheduler); DCP (stripe layout, kernel, merges) lives with the k3_dcp_mla
backend: `k3_sglang/dcp_mla` and `kernels/mla/dcp_*.py`."""
