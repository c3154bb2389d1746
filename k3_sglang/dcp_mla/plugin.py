"""SGLang general plugin `k3_dcp_mla` (entry point in pyproject.toml): the k3_dcp_mla backend and its model-override
hook for SGLang's own K3 on a GPU host (CUDA; ROCm and Blackwell keep SGLang's DCP backends unless asked), in a
server `k3 serve` started (its decision in K3_DEPLOYMENT; plain `sglang serve` on the same host is untouched).

Inert on the k3_cpu platform, where the
SGLang-K3-on-CPU plugin (`k3_sglang/sglang_cpu/hooks.py`) installs the same backend and hook together with the CPU
paths of SGLang's DCP helpers.
"""
from __future__ import annotations


from k3_sglang.dcp_mla.overrides import OVERRIDES_TARGET, collect_overrides_with_k3_dcp_mla
from k3_sglang.sglang_guard import sglang_plugin


def active() -> bool:
    """True where `k3 serve` started SGLang's own K3 on a GPU host (its deployment: platform cuda);
    plain `sglang serve` in the same environment is left alone."""
    from k3_sglang.deployment import current

    deployment = current()
    return deployment is not None and not deployment.on_cpu


def installed_hooks():
    """(target, hook, hook type name) of every hook `register` installs."""
    return [(OVERRIDES_TARGET, collect_overrides_with_k3_dcp_mla, "AROUND")]


@sglang_plugin
def register() -> None:
    """Entry point: the override hook and the backend registration, or nothing when inactive."""
    if not active():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from k3_sglang.dcp_mla import backend

    for target, hook, kind in installed_hooks():
        HookRegistry.register(target, hook, HookType[kind])
    backend.register()
