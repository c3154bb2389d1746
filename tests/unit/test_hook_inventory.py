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


def _hook_targets() -> set[str]:
    return {h.target for h in hook_inventory.all_hooks()}


def _row_for(use, reaches, hook_targets) -> bool:
    """Whether an inventory row covers one reach the static scan found."""
    kinds = {"SETATTR": ("SETATTR", "SCOPED_SETATTR"), "PRIVATE_READ": ("PRIVATE_READ", "PRIVATE_EDIT"),
             "SUBCLASS": ("SUBCLASS",), "ENV": ("ENV",)}[use.kind]
    if use.kind == "SETATTR" and use.target in hook_targets:
        return True  # an attribute swapped as a listed hook (the ready line's launch_server)
    anonymous = use.target.startswith("<object>")  # setattr on an object the scan cannot name: a row of its module
    return any(r.kind in kinds and use.module in r.owners and (anonymous or r.target == use.target) for r in reaches)


def test_every_reach_into_sglang_in_our_source_has_a_row():
    from k3_sglang import sglang_uses

    uses = sglang_uses.scan()
    assert {u.kind for u in uses} == {"SETATTR", "PRIVATE_READ", "SUBCLASS", "ENV"}  # the scan sees every kind
    reaches, targets = hook_inventory.reaches(), _hook_targets()
    missing = sorted({f"{u.kind} {u.target} in {u.module} (line {u.line})" for u in uses
                      if not _row_for(u, reaches, targets)})
    assert missing == [], "reaches into SGLang without a row in k3_sglang/sglang_reaches.py:\n" + "\n".join(missing)


def test_the_scan_catches_each_kind_of_new_reach(tmp_path):
    from k3_sglang import sglang_uses

    source = tmp_path / "k3_sglang" / "newcomer.py"
    source.parent.mkdir()
    source.write_text(
        "import os\nfrom sglang.srt.managers import scheduler as s\nfrom sglang.srt.layers import attn_residual\n"
        "s.Scheduler.brand_new = print\nsetattr(s.Scheduler, 'step', print)\nos.environ['SGLANG_NEW_ONE'] = '1'\n"
        "env = {'SGLANG_OTHER': '1'}\nclass Mine(s.Scheduler):\n    pass\nwidth = attn_residual._BLOCK_H\n")
    uses = sglang_uses.scan_file(source, tmp_path)
    found = {(u.kind, u.target) for u in uses}
    assert found == {("SETATTR", "sglang.srt.managers.scheduler.Scheduler.brand_new"),
                     ("SETATTR", "sglang.srt.managers.scheduler.Scheduler.step"),
                     ("ENV", "SGLANG_NEW_ONE"), ("ENV", "SGLANG_OTHER"),
                     ("SUBCLASS", "sglang.srt.managers.scheduler.Scheduler"),
                     ("PRIVATE_READ", "sglang.srt.layers.attn_residual._BLOCK_H")}
    assert not any(_row_for(u, hook_inventory.reaches(), _hook_targets()) for u in uses
                   if u.target != "sglang.srt.layers.attn_residual._BLOCK_H")  # none of them listed


def test_every_reach_row_is_well_formed():
    import importlib.util

    from k3_sglang.sglang_reaches import KINDS

    rows = hook_inventory.reaches()
    assert len(rows) >= 40
    for r in rows:
        assert r.kind in KINDS and r.seam in ("public", "private") and len(r.why) > 20, r
        assert (REPO / r.test).is_file(), r.test
        for owner in r.owners:
            assert importlib.util.find_spec(owner) is not None, owner
    assert len({(r.target, r.kind) for r in rows}) == len(rows)


def test_an_environment_row_is_public_exactly_when_sglang_declares_the_variable():
    import sglang.srt.environ as environ

    declared = Path(environ.__file__).read_text()
    for r in hook_inventory.reaches():
        if r.kind == "ENV":
            assert (re.search(rf"\b{r.target}\b", declared) is not None) == (r.seam == "public"), r


def test_counts_add_up():
    c = hook_inventory.counts()
    assert c["hooks"] == len(hook_inventory.all_hooks()) and c["registries"] == len(hook_inventory.REGISTRIES)
    assert c["reaches_public"] + c["reaches_private"] == len(hook_inventory.reaches())
    assert hook_inventory.counts_line() in hook_inventory.markdown()
