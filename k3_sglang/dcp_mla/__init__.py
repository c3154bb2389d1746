"""`k3_dcp_mla`: one MLA attention backend with decode context parallelism (DCP) for SGLang's own K3 beyond
Blackwell (Hopper CUDA through a Triton kernel, the k3_cpu platform through torch), and the MLA attention inside
SGLang's pools that the k3_cpu platform's `k3_cpu_mla` backend runs (TP, and DCP with our own merges).

- kernels: `kernels/mla/dcp_{torch,triton}.py` behind `dispatch.mla_dcp`, reference `naive.mla_dcp_attention_paged`;
- where the keys are: `metadata.py` (SGLang's widened DCP layout -> block tables, rank-local and global lengths);
- the backend SGLang's K3 calls (`backend.py`), registered with SGLang's attention-backend registry;
- the model-override hook that gives SGLang's K3 this backend under `--dcp-size > 1` (`overrides.py`);
- torch equivalents of SGLang's DCP Triton helpers for CPU hosts (`cpu_kernels.py`);
- MLA attention inside SGLang's pools for `k3_cpu_mla` (`pool_attention.py`: write the rows, attend each request's
  cached rows, under DCP merge the ranks' partials with SGLang's own ag_rs / a2a merges, `merge.py`);
- the per-rank pool-read trace `k3 bench dcp` reads (`kv_read_trace.py`, K3_KV_READ_TRACE).
"""

BACKEND_NAME = "k3_dcp_mla"


def add_backend_choice() -> None:
    """Let SGLang's argument parser accept BACKEND_NAME (its extension point for backend choices)."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
