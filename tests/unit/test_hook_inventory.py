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


def test_every_private_replace_or_around_says_why_no_public_seam_serves():
    from k3_sglang import hook_seams

    hooks = hook_inventory.all_hooks()
    missing = sorted({h.target for h in hooks if h.kind in ("REPLACE", "AROUND") and len(h.no_seam.strip()) < 40})
    assert missing == [], "REPLACE/AROUND hooks without a reason in k3_sglang/hook_seams.py:\n" + "\n".join(missing)
    by_reason: dict[str, set[str]] = {}
    for h in hooks:
        if h.no_seam:
            by_reason.setdefault(" ".join(h.no_seam.lower().split()), set()).add(h.target)
    shared = {r: t for r, t in by_reason.items() if len(t) > 1}
    assert shared == {}, f"one boilerplate reason for several targets: {shared}"
    stale = sorted(set(hook_seams.NO_PUBLIC_SEAM) - {h.target for h in hooks})
    assert stale == [], f"reasons for targets no longer hooked (delete them): {stale}"
    rendered = hook_inventory.markdown()
    assert all(h.no_seam in rendered for h in hooks if h.no_seam)


def test_a_reasonless_or_boilerplate_row_fails(monkeypatch):
    """The check above bites: a REPLACE row with an empty reason, and two targets sharing one, are both caught."""
    from k3_sglang import hook_seams

    hooks = hook_inventory.all_hooks()
    first, second = hooks[0].target, next(h.target for h in hooks if h.target != hooks[0].target and h.no_seam)
    monkeypatch.setitem(hook_seams.NO_PUBLIC_SEAM, first, "")
    with __import__("pytest").raises(AssertionError, match="without a reason"):
        test_every_private_replace_or_around_says_why_no_public_seam_serves()
    monkeypatch.setitem(hook_seams.NO_PUBLIC_SEAM, first, hook_seams.NO_PUBLIC_SEAM[second])
    with __import__("pytest").raises(AssertionError, match="boilerplate"):
        test_every_private_replace_or_around_says_why_no_public_seam_serves()


def test_the_counts_line_states_the_hooked_targets_against_issue_38s_goal():
    c = hook_inventory.counts()
    assert c["hooked_targets"] == len({h.target for h in hook_inventory.all_hooks()})
    line = hook_inventory.counts_line()
    assert f"Hooked targets: {c['hooked_targets']} (issue 38's goal: at most 40)" in line
    assert "portable" not in hook_inventory.markdown()  # the portable model and its rows have retired


def _fake_args(**flags):
    from types import SimpleNamespace

    args = SimpleNamespace(host="127.0.0.1", port=30123, model_path="/m", resolved=0, **flags)
    args.resolve_once = lambda: setattr(args, "resolved", args.resolved + 1)
    return args


def test_the_ready_line_comes_from_sglangs_launch_callback(monkeypatch, capsys):
    """`k3 serve` replaces nothing for its ready line: the default HTTP mode calls SGLang's launch_server with the
    public launch_callback (printing the line only when SGLang calls it); every other run_server mode goes to
    run_server untouched."""
    from sglang.srt.arg_groups import overrides

    from k3_sglang.serving import launch

    monkeypatch.setattr(overrides, "resolving_view", lambda args: args)
    calls = []
    args = _fake_args()
    launch.serve(args, run_server=lambda a: calls.append(("run_server", a)),
                 launch_server=lambda a, launch_callback: calls.append(("launch_server", a, launch_callback)))
    assert [c[0] for c in calls] == ["launch_server"] and args.resolved == 1
    assert "k3 serve: ready" not in capsys.readouterr().out  # not before SGLang reports ready
    calls[0][2]()
    assert "k3 serve: ready at http://127.0.0.1:30123 (model /m" in capsys.readouterr().out
    for flag in launch.OTHER_MODE_FLAGS:
        calls.clear()
        other = _fake_args(**{flag: True})
        launch.serve(other, run_server=lambda a: calls.append(("run_server", a)),
                     launch_server=lambda *a, **k: calls.append(("launch_server",)))
        assert calls == [("run_server", other)] and other.resolved == 0, flag  # run_server resolves it itself


def test_run_servers_mode_dispatch_is_the_one_serve_mirrors():
    """serve() sends exactly run_server's non-default modes to run_server: its source dispatches on these flags and
    ends in http_server.launch_server(server_args) (a new mode there fails here, as does its fingerprint)."""
    from sglang import launch_server as sglang_launch

    from k3_sglang.serving import launch

    source = inspect.getsource(sglang_launch.run_server)
    dispatched = set(re.findall(r"\bcfg\.(\w+)", source))
    assert dispatched <= set(launch.OTHER_MODE_FLAGS), dispatched
    assert {"encoder_only", "smg_grpc_mode", "use_ray"} <= dispatched
    assert "from sglang.srt.entrypoints.http_server import launch_server" in source
    assert "server_args.resolve_once()" in source
