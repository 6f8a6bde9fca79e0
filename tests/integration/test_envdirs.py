"""Environment directories end to end on bubblewrap: ``sandbox run --apply`` and ``sandbox changes apply``.

A copy run that fills ``.venv`` and changes a source file applies the work and holds the
environment back as one line; ``--only .venv`` or ``--include-environment`` applies all of it,
reported as one line too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.bwrap
PROFILE = """
description = "copy, with environment directories"
backend = "bwrap"
[mount]
strategy = "copy"
environment = [".venv", "node_modules"]
"""
FILL = "mkdir -p .venv/bin node_modules/a && for i in 1 2 3; do echo $i > .venv/f$i; done; "
FILL += "echo '{}' > node_modules/a/package.json; echo work > src/new.py"


def _cli(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDBOX_DATA_DIR": str(data_dir)}
    argv = [sys.executable, "-m", "sandbox.cli", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=120)


def _run(workspace: Path, data_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    profile = workspace.parent / "env.toml"
    profile.write_text(PROFILE)
    args = ("run", "--profile", str(profile), "--workspace", str(workspace), *flags, "--", "sh", "-c", FILL)
    return _cli(*args, data_dir=data_dir)


def _kept_id(stderr: str) -> str:
    return next(word for word in stderr.split() if word.startswith("ch-")).rstrip(";,")


def test_run_apply_holds_environment_back_in_one_line(workspace: Path, data_dir: Path) -> None:
    done = _run(workspace, data_dir, "--apply")
    assert done.returncode == 0, done.stderr
    assert (workspace / "src" / "new.py").exists()
    assert not (workspace / ".venv").exists() and not (workspace / "node_modules").exists()
    changeset = _kept_id(done.stderr)
    shown = _cli("changes", "apply", changeset, data_dir=data_dir)
    assert shown.returncode == 1
    held = [line for line in shown.stdout.splitlines() if line.startswith("held back")]
    assert held == [
        "held back .venv: 3 files, 6 B -- environment, not applied unless asked "
        "(--only .venv or --include-environment)",
        "held back node_modules: 1 package, 1 file, 3 B -- environment, not applied unless asked "
        "(--only node_modules or --include-environment)",
    ]
    assert "--include-environment" in shown.stderr
    only = _cli("changes", "apply", changeset, "--only", ".venv", data_dir=data_dir)
    assert only.returncode == 0, only.stdout + only.stderr
    assert "applied .venv (environment, 5 entries)" in only.stdout.splitlines()
    assert (workspace / ".venv" / "f3").read_text() == "3\n"
    assert not (workspace / "node_modules").exists()


def test_run_apply_include_environment(workspace: Path, data_dir: Path) -> None:
    done = _run(workspace, data_dir, "--apply", "--include-environment")
    assert done.returncode == 0, done.stderr
    assert (workspace / ".venv" / "f1").read_text() == "1\n"
    assert (workspace / "node_modules" / "a" / "package.json").exists()
