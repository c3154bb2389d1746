"""A mismatched SGLang fails loudly: the version pin checked when a K3 process starts, every hook proven applied.

SGLang swallows failures where we plug in: `load_plugins` logs a plugin that raises (or fails to import) and goes on,
`HookRegistry.apply_hooks` logs a target it cannot patch and goes on. A server would then start unpatched. So:

1. Version pin. `SGLANG_PIN` is the one version we are written against (pyproject.toml pins the same; a test keeps
   them equal). `check_sglang_version` exits 2 naming both versions unless `K3_ALLOW_SGLANG_VERSION` names the
   installed one. It runs in `k3 serve`, in its launch process, and in every SGLang process (scheduler, detokenizer,
   worker ranks, PD servers) where one of our plugins takes part (the `sglang_plugin` decorator below). The router
   imports no SGLang.
2. Hooks applied. Every plugin entry point of ours is wrapped by `sglang_plugin`: where K3 is in play it installs,
   once per process, a wrapper around `HookRegistry.apply_hooks` (which `load_plugins` calls after the plugins ran)
   that then checks every hook a k3_sglang function registered: its target patched and our function inside the
   wrapper SGLang put there; and every k3-sglang plugin entry point completed. Otherwise exit 2 naming each missing
   hook and plugin (tests/unit/test_sglang_guard.py sabotages both).

"K3 in play": `k3 serve` started the process (K3_SERVE_HOOKS=1), or SGLang runs on our k3_cpu platform, or K3_STEP_TIMING is set, or one of our plugins registered a hook. Anywhere
else (plain `sglang.launch_server` on another model) the plugins register nothing and nothing here runs.
"""
from __future__ import annotations

import functools
import os
import pkgutil
import sys
from typing import Callable

from k3_sglang.env_settings import EnvModel

SGLANG_PIN = "0.5.23"
DIST_NAMES = ("k3-sglang", "k3_sglang")
PLUGIN_GROUP = "sglang.srt.plugins"
IN_PLAY_ENV = (("K3_SERVE_HOOKS", "1"), ("SGLANG_PLATFORM", "k3_cpu"))

_completed: set[str] = set()  # "module:function" of every plugin entry point of ours that returned in this process


class GuardSettings(EnvModel):
    """K3_ALLOW_SGLANG_VERSION: an SGLang version other than the pin to try (the hook check then names what fails)."""

    allow_sglang_version: str | None = None


def installed_sglang_version() -> str:
    """`sglang.__version__` when SGLang is imported, else the installed distribution's version (no heavy import)."""
    module = sys.modules.get("sglang")
    if module is not None and getattr(module, "__version__", None):
        return module.__version__
    from importlib.metadata import version

    return version("sglang")


def version_refusal(installed: str, allowed: str | None) -> str | None:
    """The error for `installed` against the pin, or None when it is the pin or the allowed version."""
    if installed == SGLANG_PIN or (allowed and allowed.strip() == installed):
        return None
    hint = (f"K3_ALLOW_SGLANG_VERSION={allowed} does not name it; " if allowed else "")
    return (f"SGLang {installed} is installed but k3-sglang is written against SGLang {SGLANG_PIN} "
            f"(pip install sglang=={SGLANG_PIN}); {hint}set K3_ALLOW_SGLANG_VERSION={installed} to try it anyway "
            "(startup then names every hook that does not apply; `k3 hooks check` names what changed)")


def check_sglang_version(who: str = "k3-sglang") -> None:
    """Exit 2 with both versions named when the installed SGLang is not the pin (nor K3_ALLOW_SGLANG_VERSION)."""
    try:
        allowed = GuardSettings.from_env().allow_sglang_version
    except ValueError as exc:
        _refuse(who, str(exc))
    message = version_refusal(installed_sglang_version(), allowed)
    if message:
        _refuse(who, message)


def _refuse(who: str, message: str) -> None:
    print(f"{who}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def in_play_by_env(environ=None) -> bool:
    env = os.environ if environ is None else environ
    return any(env.get(k) == v for k, v in IN_PLAY_ENV) or bool(env.get("K3_STEP_TIMING", "").strip())


def _ours(fn: object) -> bool:
    return (getattr(fn, "__module__", None) or "").startswith("k3_sglang")


def registered_hooks() -> list[tuple[str, str, Callable]]:
    """(target, hook type name, hook) of every hook a k3_sglang function registered with SGLang's HookRegistry."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    return [(target, kind.name, hook) for target, hooks in HookRegistry._hooks.items()
            for kind, hook, _source in hooks if _ours(hook)]


def sglang_plugin(register: Callable[[], None]) -> Callable[[], None]:
    """Decorator of every `sglang.srt.plugins` entry point of ours: the version check and the apply-time check where
    K3 is in play, and the record that this plugin completed."""
    name = f"{register.__module__}:{register.__name__}"

    @functools.wraps(register)
    def entry() -> None:
        if in_play_by_env():
            guard_process()
        before = len(registered_hooks())
        register()
        if len(registered_hooks()) > before:
            guard_process()
        _completed.add(name)

    return entry


def guard_process() -> None:
    """Once per process: the version check, and the check after SGLang applies the hooks."""
    check_sglang_version()
    from sglang.srt.plugins.hook_registry import HookRegistry

    if getattr(HookRegistry.apply_hooks, "_k3_guard", False):
        return
    apply = HookRegistry.apply_hooks  # bound to the class

    @functools.wraps(apply.__func__)  # __wrapped__: SGLang's own, what `k3 hooks check` fingerprints
    def apply_hooks_then_verify(cls):
        apply()
        verify_or_exit()

    apply_hooks_then_verify._k3_guard = True
    HookRegistry.apply_hooks = classmethod(apply_hooks_then_verify)


def _holds(fn: object, hook: object, depth: int = 0) -> bool:
    """Whether `fn` is `hook` or one of SGLang's hook wrappers (functools.wraps, closure over the hook) around it."""
    if fn is hook:
        return True
    if depth > 32:
        return False
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            if cell.cell_contents is hook:
                return True
        except ValueError:
            continue
    inner = getattr(fn, "__wrapped__", None)
    return inner is not None and _holds(inner, hook, depth + 1)


def _current(target: str) -> object:
    owner_path, attr = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else None
    if isinstance(raw, (classmethod, staticmethod)):
        return raw.__func__
    return getattr(owner, attr)


def unapplied_hooks() -> list[str]:
    """'target (TYPE hook module.function): why' for every registered hook of ours SGLang did not put in place."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    missing = []
    for target, kind, hook in registered_hooks():
        what = f"{target} ({kind} {hook.__module__}.{getattr(hook, '__qualname__', hook)})"
        if target not in HookRegistry._patched:
            missing.append(f"{what}: not patched (SGLang logged why above)")
            continue
        try:
            current = _current(target)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{what}: target gone ({exc})")
            continue
        if not _holds(current, hook):
            missing.append(f"{what}: our hook is not in what the target now holds")
    return missing


def expected_plugins() -> list[str]:
    """'module:function' of every k3-sglang entry point SGLang's load_plugins runs here (SGLANG_PLUGINS honoured)."""
    from importlib.metadata import entry_points

    allowed = {x.strip() for x in os.environ.get("SGLANG_PLUGINS", "").split(",") if x.strip()}
    return sorted(ep.value for ep in entry_points(group=PLUGIN_GROUP)
                  if ep.dist is not None and ep.dist.name in DIST_NAMES and (not allowed or ep.name in allowed))


def failed_plugins() -> list[str]:
    """Our entry points that did not complete, once SGLang's load_plugins ran them ([] before: a test's own
    `apply_hooks` call checks the hooks only)."""
    from sglang.srt import plugins

    if not plugins._plugins_loaded:
        return []
    return [name for name in expected_plugins() if name not in _completed]


def verify_or_exit() -> None:
    """After SGLang applied the hooks: exit 2 naming every hook of ours not in place and every plugin that failed."""
    plugins = failed_plugins()
    hooks = unapplied_hooks()
    installed = installed_sglang_version()
    if not plugins and not hooks:
        if installed != SGLANG_PIN:
            print(f"k3-sglang: warning: SGLang {installed} allowed by K3_ALLOW_SGLANG_VERSION (pinned "
                  f"{SGLANG_PIN}); `k3 hooks check` names changed targets", file=sys.stderr, flush=True)
        print(f"k3-sglang: {len(registered_hooks())} hooks in place, {len(_completed)} plugins completed "
              f"(SGLang {installed}, pid {os.getpid()})", file=sys.stderr, flush=True)
        return
    lines = [f"k3-sglang: error: SGLang {installed} (pinned {SGLANG_PIN}) did not take every k3-sglang change; "
             "refusing to start unpatched:"]
    lines += [f"  - plugin {name} did not complete (SGLang logged its exception above)" for name in plugins]
    lines += [f"  - hook {line}" for line in hooks]
    print("\n".join(lines), file=sys.stderr, flush=True)
    sys.exit(2)
