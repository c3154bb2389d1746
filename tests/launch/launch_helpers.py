"""Shared helpers for the launch tests: rendering presets and pulling `k3 serve` commands out of scripts."""

from __future__ import annotations

import shlex
import shutil

import pytest

from k3_sglang.launch.golden import EXAMPLE_PRESETS, render_example

RENDERED = {preset: render_example(preset) for preset in EXAMPLE_PRESETS}


def scripts() -> list[tuple[str, str]]:
    """(file name, text) of every rendered shell/batch script."""
    return [(name, text) for files in RENDERED.values() for name, text in files.items()
            if name.endswith((".sh", ".sbatch"))]


def serve_commands(text: str) -> list[list[str]]:
    """Every `k3 serve ...` in a script, as words (shell variables left as written)."""
    commands = []
    for line in text.splitlines():
        line = line.strip()
        for prefix in ("start_on ", "start "):
            if line.startswith(prefix) and " k3 serve " in f" {line} ":
                words = shlex.split(line[len(prefix):], posix=True)
                commands.append(words[words.index("serve") - 1:])
    return commands


def require_shellcheck() -> str:
    """Path to shellcheck; FAIL (not skip) if missing: scripts/system-deps.sh installs it."""
    path = shutil.which("shellcheck")
    if path is None:
        pytest.fail("shellcheck is not installed; run `bash scripts/system-deps.sh` (apt-get install shellcheck)")
    return path
