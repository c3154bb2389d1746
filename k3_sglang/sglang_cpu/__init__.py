"""SGLang's own K3 (`sglang.srt.models.kimi_k3`) on the k3_cpu platform: the hooks and CPU kernels that SGLang
lacks on a CPU host, registered through SGLang's general-plugin entry point `k3_sglang_k3_cpu` (hooks.py)."""

MLA_BACKEND_NAME = "k3_cpu_mla"  # the attention backend name registered with SGLang (mla_backend.py)


def add_backend_choice() -> None:
    """Let SGLang's argument parser accept MLA_BACKEND_NAME (its extension point for backend choices)."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    if MLA_BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([MLA_BACKEND_NAME])
