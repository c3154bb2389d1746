"""The one inventory of every hook k3-sglang installs into SGLang internals, and of the SGLang registries it uses.

A hook replaces or wraps a function SGLang did not offer as an extension point (SGLang's HookRegistry applies it,
or one attribute is swapped); a registry entry uses an extension point SGLang does offer. Each hook module keeps its
own `installed_hooks()`; this module only collects them with when they apply and the test that catches drift when
the pinned SGLang changes under them. docs/architecture.md carries the same table (`python -m
k3_sglang.hook_inventory` prints it; tests/unit/test_hook_inventory.py keeps the two equal and checks that every
target still exists in the installed SGLang). The other reaches into SGLang (attributes swapped, private names,
subclasses, environment variables; k3_sglang/sglang_reaches.py) and the SGLang registries used are rendered after the
hooks, each marked public seam or private internal, with the counts (`counts_line`).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class HookSet:
    """The hooks one module registers: owner module, when they are active, and their drift test."""

    owner: str
    when: str
    hooks: Callable[[], list[tuple[str, Callable, str]]]
    drift_test: str


@dataclass(frozen=True)
class Hook:
    target: str
    kind: str
    why: str
    owner: str
    when: str
    drift_test: str
    no_seam: str = ""  # why no public SGLang seam serves it (k3_sglang/hook_seams.py; required for REPLACE/AROUND)


def _spec_hooks():
    from k3_sglang.spec import plugin

    return [(plugin.ASSIGN_TARGET, plugin.assign_req_to_token_pool_torch, "REPLACE")]


def _contract_hooks():
    from k3_sglang.spec import contract, plugin, pp_hooks

    own = {t for t, _, _ in pp_hooks.installed_hooks() + _spec_hooks()}
    hooks = [h for h in plugin.installed_hooks() if h[0] not in own]
    assert [t for t, _, _ in hooks] == [contract.SCATTER_TARGET], hooks  # a new spec hook needs its own row here
    return hooks


def _platform_hooks():
    from k3_sglang import platform_hooks

    return platform_hooks.installed_hooks()


def _plain_path_hooks():
    from k3_sglang.spec import plain_path

    return plain_path.installed_hooks()


def _pp_hooks():
    from k3_sglang.spec import pp_hooks

    return pp_hooks.installed_hooks()


def _hicache_hooks():
    from k3_sglang.hicache import hooks

    return hooks.installed_hooks()


def _hicache_fault_hooks():
    from k3_sglang.hicache import hooks

    always = {t for t, _, _ in _hicache_hooks()}
    return [h for h in hooks.installed_hooks(fault="corrupt-restored-kda") if h[0] not in always]


def _sglang_cpu_hooks():
    from k3_sglang.sglang_cpu import hooks

    return hooks.installed_hooks()


def _dcp_mla_hooks():
    from k3_sglang.dcp_mla import plugin

    return plugin.installed_hooks()


def _step_timing_hooks():
    from k3_sglang.serving import step_timing

    return step_timing.installed_hooks()


HOOK_SETS = (
    HookSet("k3_sglang.platform_hooks", "k3_cpu platform", _platform_hooks, "tests/unit/test_platform_hooks.py"),
    HookSet("k3_sglang.spec.plugin", "k3_cpu platform", _spec_hooks, "tests/spec/test_spec_worker_parts.py"),
    HookSet("k3_sglang.spec.contract", "k3_cpu platform", _contract_hooks, "tests/spec/test_contract.py"),
    HookSet("k3_sglang.spec.pp_hooks", "k3_cpu platform (inert but for K3_CSV)", _pp_hooks,
            "tests/spec/test_pp_hooks.py"),
    HookSet("k3_sglang.spec.plain_path", "every platform where K3 is in play (`k3 serve`, the k3_cpu platform; inert "
            "until a K3_CSV worker of a TP1/PP1 server takes it)", _plain_path_hooks, "tests/spec/test_plain_path.py"),
    HookSet("k3_sglang.sglang_cpu.hooks", "k3_cpu platform", _sglang_cpu_hooks,
            "tests/unit/test_sglang_cpu_hooks.py"),
    HookSet("k3_sglang.dcp_mla.plugin", "GPU host, SGLang's own K3 under --dcp-size > 1", _dcp_mla_hooks,
            "tests/unit/test_dcp_mla_hooks.py"),
    HookSet("k3_sglang.hicache.hooks", "k3_cpu platform", _hicache_hooks,
            "tests/unit/test_hicache_hooks.py"),
    HookSet("k3_sglang.hicache.hooks", "as above, only with K3_HICACHE_FAULT=corrupt-restored-kda (tests' sabotage)",
            _hicache_fault_hooks, "tests/unit/test_hicache_hooks.py"),
    HookSet("k3_sglang.serving.step_timing", "any process with K3_STEP_TIMING set (`k3 bench plain-decode`)",
            _step_timing_hooks, "tests/unit/test_step_timing.py"),
)

# SGLang extension points used (registries SGLang offers): (what, where, owner).
REGISTRIES = (
    ("platform `k3_cpu`", "entry-point group sglang.srt.platforms", "k3_sglang.platform"),
    ("general plugins `k3_platform_hooks`, `k3_spec`, `k3_sglang_k3_cpu`, `k3_session_cache`, `k3_dcp_mla`, "
     "`k3_hicache_cpu`, `k3_step_timing`",
     "entry-point group sglang.srt.plugins",
     "pyproject.toml"),
    ("speculative algorithm `K3_CSV`", "SpeculativeAlgorithm.register", "k3_sglang.spec.plugin"),
    ("attention backend `k3_cpu_mla`", "attention_registry.ATTENTION_BACKENDS, add_attention_backend_choices, "
     "deepseek AttentionBackendRegistry", "k3_sglang.sglang_cpu.mla_backend"),
    ("attention backend `k3_dcp_mla`", "attention_registry.ATTENTION_BACKENDS, add_attention_backend_choices, "
     "deepseek AttentionBackendRegistry and FORWARD_ABSORB_CORE_ATTENTION_BACKENDS", "k3_sglang.dcp_mla.backend"),
    ("MoE runner core for the `triton` runner name", "moe_runner.runner.register_moe_runner_core",
     "k3_sglang.sglang_cpu.moe_runner"),
    ("KV events publisher (`--kv-events-config`)", "SGLang's KVEventsConfig / ZMQ publisher",
     "k3_sglang.serving.kv_events_config"),
    ("KV events publisher `k3_zmq_curve` (CURVE off loopback)", "EventPublisherFactory.register_publisher",
     "k3_sglang.serving.kv_events_curve"),
    ("request guard middleware", "http_server.app.add_middleware (FastAPI)", "k3_sglang.serving.launch"),
    ("ready line", "http_server.launch_server(..., launch_callback=...)", "k3_sglang.serving.launch"),
    ("MLA KV pool reading CPU rows in torch", "SRTPlatform.get_kv_pool_cls(kind='mla')", "k3_sglang.platform_cpu"),
    ("compressed-tensors config accepting float32", "SRTPlatform.get_quantization_config", "k3_sglang.platform_cpu"),
    ("CPU forms of the unquantized linear method and the gated RMSNorm", "SRTPlatform.post_load_model",
     "k3_sglang.platform_cpu"),
    ("radix-cache backend `k3` (KDA checkpoint events, retention, session eviction; `--radix-cache-backend k3`)",
     "mem_cache.registry.register_radix_cache_backend, create_unified_radix_cache(cache_class=...)",
     "k3_sglang.serving.radix_cache"),
    ("TreeCore `k3_sessions` (the host tier's session eviction, one cache's own core)",
     "tree_core_registry.register_tree_core_backend, CacheInitParams.tree_core_backend",
     "k3_sglang.serving.radix_cache"),
)


def _why(fn: Callable) -> str:
    doc = inspect.getdoc(fn) or ""
    first = doc.split("\n\n")[0].replace("\n", " ").strip()
    return first or fn.__name__


def all_hooks() -> list[Hook]:
    """Every hook of every set, in registration order within a set."""
    from k3_sglang.hook_seams import reason

    return [Hook(target, kind, _why(fn), s.owner, s.when, s.drift_test, reason(target))
            for s in HOOK_SETS for target, fn, kind in s.hooks()]


def _short(target: str) -> str:
    return ".".join(target.split(".")[-2:])


def markdown() -> str:
    """The hook table and the why of each hook, as docs/architecture.md carries them."""
    rows = ["| # | target (SGLang 0.5.23) | kind | owner | when | drift test | no public seam because |",
            "|---|---|---|---|---|---|---|"]
    hooks = all_hooks()
    for i, h in enumerate(hooks, 1):
        rows.append(f"| {i} | `{h.target}` | {h.kind} | `{h.owner}` | {h.when} | `{h.drift_test}` | {h.no_seam or '-'} |")
    rows += ["", "Why each one:", ""]
    rows += [f"{i}. `{_short(h.target)}`: {h.why}" for i, h in enumerate(hooks, 1)]
    return "\n".join(rows + [""] + _reach_rows() + [""] + _registry_rows() + [""] + [counts_line()])


def reaches():
    """The reaches into SGLang that are not HookRegistry hooks (k3_sglang/sglang_reaches.py)."""
    from k3_sglang.sglang_reaches import REACHES

    return REACHES


def _reach_rows() -> list[str]:
    rows = ["Other reaches into SGLang (attributes swapped or bound, private names, subclasses, environment, "
            "arguments bound by name):", "", "| # | target | kind | seam | owner | test | why |",
            "|---|---|---|---|---|---|---|"]
    rows += [f"| R{i} | `{r.target}` | {r.kind} | {r.seam} | `{r.owner}` | `{r.test}` | {r.why} |"
             for i, r in enumerate(reaches(), 1)]
    return rows


def _registry_rows() -> list[str]:
    rows = ["SGLang extension points used (public seams):", "", "| # | what | where | owner |", "|---|---|---|---|"]
    rows += [f"| S{i} | {what} | {where} | `{owner}` |" for i, (what, where, owner) in enumerate(REGISTRIES, 1)]
    return rows


TARGET_GOAL = 40  # issue 38: at most this many distinct hooked targets


def counts() -> dict[str, int]:
    """Rows by seam: every HookRegistry hook patches a private internal; reaches carry their own seam; every registry
    row is a public seam."""
    hooks = all_hooks()
    rs = reaches()
    return {"hooks": len(hooks), "hooked_targets": len({h.target for h in hooks}),
            "reaches_public": sum(r.seam == "public" for r in rs),
            "reaches_private": sum(r.seam == "private" for r in rs), "registries": len(REGISTRIES)}


def counts_line() -> str:
    c = counts()
    public = c["reaches_public"] + c["registries"]
    private = c["hooks"] + c["reaches_private"]
    return (f"Counts: {public} public seams ({c['registries']} extension points, {c['reaches_public']} reaches) and "
            f"{private} private internals ({c['hooks']} hooks on {c['hooked_targets']} distinct targets, "
            f"{c['reaches_private']} reaches). Hooked targets: {c['hooked_targets']} (issue 38's goal: at most "
            f"{TARGET_GOAL}).")


if __name__ == "__main__":
    print(markdown())
