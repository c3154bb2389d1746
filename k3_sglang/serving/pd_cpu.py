"""PD disaggregation on CPU: what `k3 serve --disaggregation-mode prefill|decode` adds so SGLang's PD path runs.

SGLang 0.5.23's PD path has three CUDA-only steps that configuration avoids (measured, docs/pd.md):
- decode start-up pins host memory for its retraction backup: `--disaggregation-decode-retraction-backup cpu_tensor`;
- the prefill sender's async page-index path pins memory on the first real send:
  `SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER=1`;
- the early send of a cached prefix records a CUDA event: `SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX=0`.
A CPU host has no RDMA NIC, so the KV goes over Mooncake's TCP transport (`mooncake_tcp`). On a loopback
`--host`, the KV manager and Mooncake's TCP listener stay on that address too (`SGLANG_HOST_IP`,
`MC_TCP_BIND_ADDRESS`; SGLang would otherwise pick the host's NIC address). Every default yields to the
user's own flag or variable.
"""

from __future__ import annotations

import importlib.util

from k3_sglang.deployment import Deployment, coerce

PD_MODES = ("prefill", "decode")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
PD_CPU_ENV = {"SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER": "1", "SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": "0"}


def pd_mode(d: Deployment | list[str]) -> str | None:
    """prefill / decode when the deployment asks for PD disaggregation, else None."""
    mode = coerce(d).disaggregation_mode
    return mode if mode in PD_MODES else None


def pd_cpu_flags(d: Deployment | list[str]) -> list[str]:
    """SGLang flags to append for a PD server on CPU (none when not PD, or when the user set them)."""
    d = coerce(d)
    mode = pd_mode(d)
    if mode is None:
        return []
    flags = []
    if not d.sets("disaggregation_transfer_backend"):
        flags += ["--disaggregation-transfer-backend", "mooncake_tcp"]
    if mode == "decode" and not d.sets("disaggregation_decode_retraction_backup"):
        flags += ["--disaggregation-decode-retraction-backup", "cpu_tensor"]
    return flags


def pd_cpu_env(d: Deployment | list[str], host: str, env: dict[str, str]) -> dict[str, str]:
    """`env` with the PD-on-CPU variables set where unset (unchanged when not PD)."""
    if pd_mode(d) is None:
        return env
    out = dict(env)
    for name, value in PD_CPU_ENV.items():
        out.setdefault(name, value)
    if host in LOOPBACK_HOSTS:
        address = "127.0.0.1" if host == "localhost" else host
        out.setdefault("SGLANG_HOST_IP", address)
        out.setdefault("MC_TCP_BIND_ADDRESS", address)
    return out


def missing_transfer_engine(d: Deployment | list[str]) -> str:
    """Why a PD server cannot start here ('' when it can): Mooncake's transfer engine is not installed."""
    d = coerce(d)
    backend = d.disaggregation_transfer_backend or "mooncake"
    if pd_mode(d) is None or not backend.startswith("mooncake"):
        return ""
    if importlib.util.find_spec("mooncake") is not None:
        return ""
    return ("--disaggregation-mode needs Mooncake's transfer engine: pip install mooncake-transfer-engine-non-cuda "
            "(CPU) or mooncake-transfer-engine (CUDA), and the Debian libraries of scripts/system-deps.sh")
