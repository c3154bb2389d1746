"""Parallelism for K3 serving (installed as `k3_sglang.parallel`): DCP layouts, pipeline stages,
process groups. Filled by the DCP and pipeline-prefill work; the package exists so the layout
and its namespace mapping are tested from the start."""
