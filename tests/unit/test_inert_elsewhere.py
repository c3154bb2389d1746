"""k3-sglang installed beside plain SGLang changes nothing there: a process with no K3 in its environment (what plain
`python -m sglang.launch_server` on another model is: SGLang's own platform, no `k3 serve`) runs SGLang's own
`load_plugins()`; every k3 plugin runs and returns, none registers a hook, and no target we hook or reach into
(k3_sglang/hook_inventory.py, k3_sglang/sglang_reaches.py) is a different object afterwards. The only mark left is
K3_CSV in SGLang's speculative-algorithm registry (a public seam, unused unless asked for). Control in the same
process: with the k3_cpu environment the same comparison sees the hooks land, every one in place (the positive
control of tests/unit/test_sglang_guard.py's sabotage test). One subprocess, 25-50 s on a loaded 2-core machine.
Serving a tiny Llama through plain `sglang.launch_server` with and without our plugins is
tests/e2e/test_plain_sglang_slow.py (slow tier)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = r'''
import json, os, pkgutil
from k3_sglang import sglang_fingerprints as fp
from k3_sglang.sglang_reaches import REACHES

def raw(path):
    owner_path, _, attr = path.rpartition(".")
    try:
        owner = pkgutil.resolve_name(owner_path)
    except (ImportError, AttributeError, ValueError):
        return pkgutil.resolve_name(path)
    if not hasattr(owner, attr):
        return pkgutil.resolve_name(path)
    return owner.__dict__.get(attr, getattr(owner, attr)) if isinstance(owner, type) else getattr(owner, attr)

paths = sorted(set(fp.watched_targets()) | {r.target for r in REACHES if r.kind in ("SETATTR", "SCOPED_SETATTR")
                                              and "<" not in r.target})

def state():
    out = {}
    for p in paths:
        obj = raw(p)
        out[p] = {k: id(v) for k, v in vars(obj).items()} if type(obj).__name__ == "module" else id(obj)
    return out, obj

before, _ = state()
keep = [raw(p) for p in paths]  # hold every object so an id is never reused
env_before = dict(os.environ)
from sglang.srt.plugins import load_plugins
from sglang.srt.speculative.spec_registry import get_spec
load_plugins()
from k3_sglang import sglang_guard
after, _ = state()
result = {"changed": [p for p in paths if before[p] != after[p]], "k3_hooks": len(sglang_guard.registered_hooks()),
          "completed": sorted(sglang_guard._completed), "expected": sglang_guard.expected_plugins(),
          "env_changed": sorted(k for k in set(env_before) | set(os.environ) if env_before.get(k) != os.environ.get(k)),
          "k3_csv_registered": get_spec("K3_CSV") is not None}
# control: the same comparison sees our hooks land once K3 is in play
os.environ.update({"SGLANG_PLATFORM": "k3_cpu", "K3_SERVE_HOOKS": "1"})
import importlib
from importlib.metadata import entry_points
for ep in entry_points(group="sglang.srt.plugins"):
    if ep.value.startswith("k3_sglang."):
        ep.load()()
from sglang.srt.plugins.hook_registry import HookRegistry
HookRegistry.apply_hooks()
control, _ = state()
result["control_changed"] = len([p for p in paths if before[p] != control[p]])
result["control_hooks"] = len(sglang_guard.registered_hooks())
result["control_unapplied"] = sglang_guard.unapplied_hooks()
print("RESULT " + json.dumps(result))
'''


def test_plain_sglang_process_with_k3_sglang_installed_is_untouched():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("K3_") and k not in ("SGLANG_PLATFORM", "SGLANG_EXTERNAL_MODEL_PACKAGE",
                                                    "SGLANG_PLUGINS")}
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["changed"] == [], "plain SGLang was changed by k3-sglang"
    assert result["k3_hooks"] == 0
    assert result["completed"] == result["expected"] and len(result["expected"]) == 7  # every plugin ran, inert
    assert result["env_changed"] == []
    assert result["k3_csv_registered"]  # the one public-registry entry, inert unless asked for
    # control: with the k3_cpu environment the same probe sees the hooks land (the detector can fail)
    assert result["control_hooks"] >= 20 and result["control_changed"] >= 10, result
    assert result["control_unapplied"] == []  # and there every hook of ours is in place (sglang_guard's check)
