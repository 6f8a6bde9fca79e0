"""`sandbox policy mode`: the global default mode sits below the session's and the profile's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sandbox.policy.rules import RuleStore

SANDBOX = str(Path(sys.executable).with_name("sandbox"))


def _decision(workspace: Path, *extra: str) -> str:
    out = subprocess.run(
        [SANDBOX, "policy", "test", "--workspace", str(workspace), *extra, "--", "touch x"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split(":")[0]


def test_global_mode_is_stored_and_applied(tmp_path: Path) -> None:
    assert RuleStore().mode() is None
    assert _decision(tmp_path) == "confirm"
    subprocess.run([SANDBOX, "policy", "mode", "auto"], check=True, capture_output=True)
    assert RuleStore().mode() == "auto"
    assert _decision(tmp_path) == "allow"
    assert _decision(tmp_path, "--mode", "ask") == "confirm"  # the session's own setting wins
    subprocess.run([SANDBOX, "policy", "mode", "unset"], check=True, capture_output=True)
    assert RuleStore().mode() is None and _decision(tmp_path) == "confirm"
