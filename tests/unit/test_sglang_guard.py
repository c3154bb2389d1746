"""A mismatched SGLang fails loudly (k3_sglang/sglang_guard.py): the version pin, equal to pyproject.toml's, refused
with exit 2 naming both versions unless K3_ALLOW_SGLANG_VERSION names the installed one; and, in a fresh process
that runs SGLang's own `load_plugins` as every server process does, a renamed target and a plugin that raises make
startup refuse with exit 2 naming each (the untouched k3_cpu process, every hook in place, is the control in
tests/unit/test_inert_elsewhere.py). One subprocess that imports SGLang: 20-30 s on a loaded 2-core machine."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from k3_sglang import sglang_guard

REPO = Path(__file__).resolve().parents[2]
K3_CPU_ENV = dict(sglang_guard.IN_PLAY_ENV)


def test_the_pin_is_pyprojects_pin():
    text = (REPO / "pyproject.toml").read_text()
    pins = re.findall(r'"sglang==([^"]+)"', text)
    assert pins == [sglang_guard.SGLANG_PIN]
    import sglang

    assert sglang.__version__ == sglang_guard.SGLANG_PIN  # the environment the tests run in is the pinned one


def test_a_mismatched_version_exits_2_naming_both(monkeypatch, capsys):
    import sglang

    monkeypatch.setattr(sglang, "__version__", "0.5.99")
    monkeypatch.delenv("K3_ALLOW_SGLANG_VERSION", raising=False)
    with pytest.raises(SystemExit) as exc:
        sglang_guard.check_sglang_version("k3 serve")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("k3 serve: error: SGLang 0.5.99 is installed") and sglang_guard.SGLANG_PIN in err
    assert "K3_ALLOW_SGLANG_VERSION=0.5.99" in err
    monkeypatch.setenv("K3_ALLOW_SGLANG_VERSION", "0.5.98")  # another version allowed: still refused
    with pytest.raises(SystemExit):
        sglang_guard.check_sglang_version()
    assert "K3_ALLOW_SGLANG_VERSION=0.5.98 does not name it" in capsys.readouterr().err
    monkeypatch.setenv("K3_ALLOW_SGLANG_VERSION", "0.5.99")
    sglang_guard.check_sglang_version()  # allowed: no exit
    monkeypatch.setattr(sglang, "__version__", sglang_guard.SGLANG_PIN)
    monkeypatch.delenv("K3_ALLOW_SGLANG_VERSION")
    sglang_guard.check_sglang_version()


def test_the_launch_module_refuses_a_mismatched_sglang_before_anything_starts(monkeypatch, capsys):
    import sglang

    from k3_sglang.serving import launch

    monkeypatch.setattr(sglang, "__version__", "0.6.0")
    monkeypatch.delenv("K3_ALLOW_SGLANG_VERSION", raising=False)
    monkeypatch.setattr("sglang.srt.plugins.load_plugins", lambda: pytest.fail("plugins loaded before the check"))
    with pytest.raises(SystemExit) as exc:
        launch.main(["--model-path", "/nonexistent"])
    assert exc.value.code == 2 and "SGLang 0.6.0 is installed" in capsys.readouterr().err


def test_k3_serve_refuses_a_mismatched_sglang_with_exit_2(monkeypatch, capsys):
    import sglang

    from k3_sglang.cli import main

    monkeypatch.setattr(sglang, "__version__", "0.4.0")
    monkeypatch.delenv("K3_ALLOW_SGLANG_VERSION", raising=False)
    assert main(["serve", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "k3 serve: error: SGLang 0.4.0 is installed" in err and sglang_guard.SGLANG_PIN in err


def test_hook_wrappers_are_recognised():
    from sglang.srt.plugins.hook_registry import HookType, _wrap_fn

    def original(x):
        return x

    def ours(fn, x):
        return fn(x)

    def other(fn, x):
        return fn(x)

    chain = _wrap_fn(_wrap_fn(original, ours, HookType.AROUND), other, HookType.AROUND)
    assert sglang_guard._holds(chain, ours) and sglang_guard._holds(chain, other)
    assert not sglang_guard._holds(_wrap_fn(original, other, HookType.AROUND), ours)


def test_plugins_are_inert_without_k3(monkeypatch):
    for name in ("K3_SERVE_HOOKS", "SGLANG_PLATFORM", "SGLANG_EXTERNAL_MODEL_PACKAGE", "K3_STEP_TIMING"):
        monkeypatch.delenv(name, raising=False)
    assert not sglang_guard.in_play_by_env()
    for name, value in K3_CPU_ENV.items():
        assert sglang_guard.in_play_by_env({name: value})


def _load_plugins(sabotage: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    code = (f"{sabotage}\n"
            "from sglang.srt.plugins import load_plugins\n"
            "load_plugins()\n"
            "from k3_sglang import sglang_guard\n"
            "print('STARTED', len(sglang_guard.registered_hooks()), len(sglang_guard._completed))\n")
    env = {**os.environ, **K3_CPU_ENV, **(extra_env or {})}
    env.pop("SGLANG_PLUGINS", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)


def test_a_renamed_target_and_a_raising_plugin_refuse_startup_with_exit_2():
    sabotage = ("from sglang.srt.managers import schedule_batch as m\n"
                "m.ScheduleBatch.prepare_for_decode_v2 = m.ScheduleBatch.prepare_for_decode\n"
                "del m.ScheduleBatch.prepare_for_decode\n")
    run = _load_plugins(sabotage, {"K3_HICACHE_FAULT": "not-a-fault"})  # the hicache plugin raises reading it
    assert run.returncode == 2, (run.returncode, run.stdout[-2000:], run.stderr[-3000:])
    assert "STARTED" not in run.stdout
    err = run.stderr
    assert "refusing to start unpatched" in err
    assert ("hook sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode (AROUND "
            "k3_sglang.platform_hooks.prepare_for_decode_pageable)") in err
    assert "plugin k3_sglang.hicache.hooks:register did not complete" in err
    named = [line for line in err.splitlines() if line.startswith("  - ")]
    assert len(named) == 2, named  # exactly the two sabotaged things, nothing else


def test_the_apply_time_check_wraps_sglangs_apply_hooks_once(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    from k3_sglang import sglang_fingerprints

    current = HookRegistry.__dict__["apply_hooks"].__func__
    # an earlier test in this process may have guarded it already: start from SGLang's own function
    sglangs = current.__wrapped__ if getattr(current, "_k3_guard", False) else current
    monkeypatch.setattr(HookRegistry, "apply_hooks", classmethod(sglangs))  # restored after the test
    sglang_guard.guard_process()
    sglang_guard.guard_process()
    wrapper = HookRegistry.__dict__["apply_hooks"].__func__
    assert wrapper._k3_guard and wrapper.__wrapped__ is sglangs  # once, around SGLang's own
    target = "sglang.srt.plugins.hook_registry.HookRegistry.apply_hooks"
    assert sglang_fingerprints.resolve(target) is sglangs  # the fingerprint still reads SGLang's
