"""docs/serving.md's refusal lists are the limits tables (serving/limits_table.py), regenerated with
`python -m k3_sglang.serving.limits_table --write`; and every table row is a refusal the engine makes."""
from __future__ import annotations

import dataclasses

import pytest

from k3_sglang.serving import limits_table
from k3_sglang.deployment import parse_sglang_argv


def test_serving_md_carries_every_limits_table():
    text = limits_table.DOC.read_text()
    assert limits_table.rendered_doc(text) == text, (
        "docs/serving.md's limits lists are stale: run `python -m k3_sglang.serving.limits_table --write`")
    for table in limits_table.tables():
        begin, _ = limits_table.markers(table)
        assert text.count(begin) == 1


def test_a_missing_marker_is_an_error():
    with pytest.raises(ValueError, match="limits:"):
        limits_table.rendered_doc("no markers here")


@pytest.mark.parametrize("table", limits_table.tables(), ids=lambda t: t.key)
def test_every_row_refuses_its_flag(table):
    """One past each parallel limit, a value outside each closed set, each must-be-off switch on: each refused with
    a reason that names the flag; editing the table changes the refusal (data, not code)."""
    base = ["--model-path", "x"]
    for name, limit in table.parallel.items():
        args = parse_sglang_argv([*base, limit.flag, str(limit.supported + 1)])
        assert [r for r in limits_table.table_refusals(table, args) if r.startswith(f"{limit.flag} ")], name
        lifted = dataclasses.replace(table, parallel={**table.parallel,
                                                      name: dataclasses.replace(limit, supported=limit.supported + 1)})
        assert not [r for r in limits_table.table_refusals(lifted, args) if r.startswith(f"{limit.flag} ")], name
    for name, flag_why in table.must_be_off.items():
        args = parse_sglang_argv([*base, flag_why[0]])
        assert f"{flag_why[0]}: {flag_why[1]}" in limits_table.table_refusals(table, args)
    for name, allowed in table.allowed.items():
        args = parse_sglang_argv(base)
        setattr(args, name, "not-a-served-value")
        assert [r for r in limits_table.table_refusals(table, args)
                if r.startswith(f"{allowed.flag} not-a-served-value")], name
