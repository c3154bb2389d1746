"""`k3_dcp_mla`: one MLA attention backend with decode context parallelism (DCP) for SGLang's own K3 beyond
Blackwell (Hopper CUDA through a Triton kernel, the k3_cpu platform through torch) and for the portable model.

- kernels: `kernels/mla/dcp_{torch,triton}.py` behind `dispatch.mla_dcp`, reference `naive.mla_dcp_attention_paged`;
- where the keys are: `metadata.py` (SGLang's widened DCP layout -> block tables, rank-local and global lengths);
- the backend SGLang's K3 calls (`backend.py`), registered with SGLang's attention-backend registry;
- the model-override hook that gives SGLang's K3 this backend under `--dcp-size > 1` (`overrides.py`);
- torch equivalents of SGLang's DCP Triton helpers for CPU hosts (`cpu_kernels.py`);
- the LSE merge the portable model calls (`merge.py`: SGLang's own ag_rs / a2a merges).
"""

BACKEND_NAME = "k3_dcp_mla"


def add_backend_choice() -> None:
    """Let SGLang's argument parser accept BACKEND_NAME (its extension point for backend choices)."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
