"""``sandbox run --backend winjob`` and ``sandbox changes`` under the Windows CPython: the
``--json`` contract and the exit codes, with a copy mount kept, reviewed and applied."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from tests.wine.conftest import PROFILE_TOML

if TYPE_CHECKING:
    from pathlib import Path

PY = sys.executable
CMD = os.environ.get("COMSPEC", "cmd.exe")


@pytest.fixture
def cli(tmp_path: Path, workspace: Path) -> Any:
    prof = tmp_path / "windows.toml"
    prof.write_text(PROFILE_TOML)
    env = {**os.environ, "SANDBOX_DATA_DIR": str(tmp_path / "data")}  # a store of this test's own

    def run(*args: str) -> tuple[int, dict[str, Any]]:
        argv = [PY, "-m", "sandbox.cli", *args]
        if args[0] == "run":
            argv[4:4] = ["--backend", "winjob", "--profile", str(prof), "--workspace", str(workspace), "--json"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=env)
        assert done.stdout.strip(), done
        return done.returncode, json.loads(done.stdout)

    return run


def test_copy_run_keeps_the_changeset_then_applies_it(cli: Any, workspace: Path) -> None:
    (workspace / "a.txt").write_text("host\n")
    code, out = cli("run", "--mount", "copy", "--", CMD, "/d", "/c", "echo made>new.txt")
    assert code == 0 and out["exit_code"] == 0 and out["mount"] == "copy" and out["backend"] == "winjob", out
    assert [(c["path"], c["status"]) for c in out["changes"]] == [("new.txt", "added")]
    assert out["changeset_id"] and not (workspace / "new.txt").exists()  # kept, not applied
    code, shown = cli("changes", "show", out["changeset_id"], "--json")
    assert code == 0 and "new.txt" in shown["diff"]
    code, applied = cli("changes", "apply", out["changeset_id"], "--json")
    assert code == 0 and applied["applied"] == ["new.txt"] and applied["state"] == "applied", applied
    assert (workspace / "new.txt").read_bytes() == b"made\r\n"


def test_copy_run_with_apply_and_a_conflict(cli: Any, workspace: Path) -> None:
    (workspace / "a.txt").write_text("host\n")
    code, out = cli("run", "--mount", "copy", "--apply", "--", CMD, "/d", "/c", "echo jail>a.txt")
    assert code == 0 and out["changeset_id"], out
    assert (workspace / "a.txt").read_bytes() == b"jail\r\n"
    code, out = cli("run", "--mount", "copy", "--", CMD, "/d", "/c", "echo again>a.txt")
    (workspace / "a.txt").write_text("the user's\n")  # the host moves on before the apply
    code, applied = cli("changes", "apply", out["changeset_id"], "--json")
    assert [c["path"] for c in applied["conflicts"]] == ["a.txt"] and not applied["applied"], applied
    assert code != 0 and (workspace / "a.txt").read_text() == "the user's\n"


def test_exit_codes(cli: Any) -> None:
    code, out = cli("run", "--", "no-such-command-here")
    assert code == 127 and out["exit_code"] == 127
    code, out = cli("run", "--", CMD, "/d", "/c", "exit 3")
    assert code == 3 and out["exit_code"] == 3
    code, out = cli("run", "--mount", "overlay", "--", CMD, "/d", "/c", "exit 0")
    assert code == 125 and out["error"]["code"] == "GUARANTEE_UNAVAILABLE", out
