"""The one hook inventory (k3_sglang/hook_inventory.py) against the installed SGLang and the docs: every target
exists, every module that registers a hook is in the inventory, docs/architecture.md carries the same table."""
from __future__ import annotations

import inspect
import pkgutil
import re
from pathlib import Path

from k3_sglang import hook_inventory

REPO = Path(__file__).resolve().parents[2]


def test_every_target_exists_in_the_installed_sglang():
    hooks = hook_inventory.all_hooks()
    assert len(hooks) >= 20
    for h in hooks:
        module, attr = h.target.rsplit(".", 1)
        assert callable(getattr(pkgutil.resolve_name(module), attr)), h.target
        assert h.kind in ("AROUND", "REPLACE", "AFTER", "BEFORE"), h
        assert (REPO / h.drift_test).is_file(), h.drift_test
        assert h.why and len(h.why) > 20, h


def test_every_module_that_hooks_sglang_is_in_the_inventory():
    owners = {s.owner for s in hook_inventory.HOOK_SETS}
    for path in (REPO / "k3_sglang").rglob("*.py"):
        text = path.read_text()
        if "HookRegistry.register(" in text or re.search(r"^\s*http_server\.\w+ = ", text, re.M):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            assert module in owners or module.replace(".hooks", ".hooks") in owners, f"{module} hooks SGLang " \
                "but is not in k3_sglang/hook_inventory.py"


def test_docs_carry_the_inventory_verbatim():
    text = (REPO / "docs" / "architecture.md").read_text()
    begin, end = "<!-- hook-inventory:begin -->", "<!-- hook-inventory:end -->"
    assert begin in text and end in text
    block = text.split(begin, 1)[1].split(end, 1)[0].strip()
    assert block == hook_inventory.markdown().strip(), \
        "docs/architecture.md's hook table is stale: paste `python -m k3_sglang.hook_inventory` between the markers"


def test_sglangs_launch_server_still_takes_a_launch_callback():
    from sglang.srt.entrypoints import http_server

    assert "launch_callback" in inspect.signature(http_server.launch_server).parameters
