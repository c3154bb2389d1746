"""Which MLA attention backend a plan's servers run, and the plans the pinned SGLang (0.5.23) would refuse at start.

SGLang's K3 serves DCP only through the `cutedsl_mla` decode backend (Blackwell SM100, with trtllm_mla prefill) or
`aiter` (ROCm): its K3 override provider asserts any other decode backend under `--dcp-size > 1`, and SGLang refuses
cutedsl_mla and trtllm_mla off Blackwell. On Hopper our `k3_dcp_mla` backend (k3_sglang/dcp_mla, chosen by our
override hook and named explicitly in the rendered command) serves K3's DCP instead; it runs eagerly (no CUDA
graphs) with a bf16 latent cache.

`serving.attention_backend` in a plan:
- `auto` (default): k3_dcp_mla for DCP groups off Blackwell, SGLang's own choice everywhere else;
- `k3_dcp_mla`: this backend (also on Blackwell, where it replaces cutedsl_mla);
- `sglang`: no backend flag, SGLang decides (refused for a DCP group off Blackwell: SGLang would pick cutedsl_mla);
- `cutedsl_mla`: SGLang's Blackwell DCP decode backend (refused off Blackwell).
A system is Blackwell when it runs MXFP4 experts natively (`native_mxfp4`, the GB300/GB200/B300 presets).
"""
from __future__ import annotations

from k3_sglang.plan.errors import PlanError

K3_DCP_MLA = "k3_dcp_mla"
ATTENTION_CHOICES = ("auto", K3_DCP_MLA, "sglang", "cutedsl_mla")


def attention_backend(choice: str, dcp: int, blackwell: bool, kv_cache_flag: str, where: str) -> str | None:
    """The `--attention-backend` a group's servers get (None: no flag, SGLang decides), or PlanError naming what
    SGLang 0.5.23 (or k3_dcp_mla) refuses at start."""
    if choice not in ATTENTION_CHOICES:
        raise PlanError("attention-backend", f"attention_backend {choice!r}: expected one of "
                        f"{', '.join(ATTENTION_CHOICES)}")
    if choice == "cutedsl_mla" and not blackwell:
        raise PlanError("attention-backend", f"{where}: cutedsl_mla runs on Blackwell (SM100) only; SGLang 0.5.23 "
                        "refuses it at start on this system (use attention_backend auto or k3_dcp_mla)")
    if choice == "auto":
        choice = K3_DCP_MLA if dcp > 1 and not blackwell else "sglang"
    if choice == "sglang" and dcp > 1 and not blackwell:
        raise PlanError("attention-backend", f"{where}: SGLang 0.5.23 serves K3 with DCP (dcp={dcp}) only through "
                        "the cutedsl_mla decode backend (Blackwell SM100) or aiter (ROCm) and refuses this plan at "
                        "start (its K3 override asserts the decode backend); use attention_backend auto or k3_dcp_mla")
    if choice == K3_DCP_MLA and kv_cache_flag not in ("bf16", "auto"):
        raise PlanError("attention-backend", f"{where}: k3_dcp_mla keeps a bf16 latent cache; kv_cache "
                        f"{kv_cache_flag} is not served by it (use kv_cache bf16)")
    if choice == "sglang" or (choice == "cutedsl_mla" and dcp > 1):
        return None  # SGLang's own pick (cutedsl_mla + trtllm_mla prefill under DCP on Blackwell)
    return choice


def backend_args(backend: str | None) -> list[str]:
    """The `k3 serve` flags of a resolved backend: k3_dcp_mla runs eagerly (no decode CUDA graphs)."""
    if backend is None:
        return []
    if backend == K3_DCP_MLA:
        return ["--attention-backend", K3_DCP_MLA, "--cuda-graph-backend-decode", "disabled"]
    return ["--decode-attention-backend", backend]
