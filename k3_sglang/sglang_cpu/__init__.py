"""SGLang's own K3 (`sglang.srt.models.kimi_k3`) on the k3_cpu platform: the hooks and CPU kernels that SGLang
lacks on a CPU host, registered through SGLang's general-plugin entry point `k3_sglang_k3_cpu` (hooks.py)."""
