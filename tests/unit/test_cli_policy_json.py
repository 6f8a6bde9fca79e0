"""``sandbox policy test --json``: every outcome, refusals included, is one JSON object on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from sandbox import cli

if TYPE_CHECKING:
    from pathlib import Path


def _policy_test(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["policy", "test", "--json", "--workspace", str(tmp_path), *args])
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) >= 1
    return code, json.loads(out)


def test_a_decision_carries_no_error_code(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out = _policy_test(capsys, tmp_path, "--", "ls")
    assert code == 0
    assert out["decision"] in ("allow", "confirm", "deny") and out["error_code"] is None and out["reason"]


@pytest.mark.parametrize(
    ("args", "decision", "error_code"),
    [
        (["--tool", "Nope", "--args", "{}"], "deny", "TOOL_DENIED"),
        (["--tool", "Read", "--args", '{"bogus": 1}'], "deny", "INVALID_ARGUMENT"),
        (["--tool", "Read", "--args", "[1]"], "deny", "INVALID_ARGUMENT"),
        (["--tool", "Read", "--args", "{not json"], "deny", "INVALID_ARGUMENT"),
        ([], None, "INVALID_ARGUMENT"),
        (["--tool", "Read"], None, "INVALID_ARGUMENT"),
    ],
)
def test_refusals_are_one_json_object(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], decision: str | None, error_code: str
) -> None:
    code, out = _policy_test(capsys, tmp_path, *args)
    assert code == 2
    assert (out["decision"], out["error_code"]) == (decision, error_code)
    assert out["reason"]


def test_a_bad_workspace_is_one_json_object(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli.main(["policy", "test", "--json", "--workspace", str(tmp_path / "missing"), "--", "ls"])
    out = json.loads(capsys.readouterr().out)
    assert (code, out["decision"], out["error_code"]) == (2, None, "INVALID_ARGUMENT")


def test_bad_usage_with_json_is_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["policy", "test", "--json", "--mode", "sideways", "--", "ls"])
    out = json.loads(capsys.readouterr().out)
    assert (code, out["decision"], out["error_code"]) == (2, None, "INVALID_ARGUMENT")


@pytest.mark.parametrize(
    "argv",
    [
        ["policy", "test", "--json", "--", "git push --force origin main"],
        ["policy", "test", "--", "ls -la"],
    ],
    ids=["policy-test-json", "policy-test"],
)
def test_a_reader_gone_ends_the_command_quietly_with_141(argv: list[str], tmp_path: Path) -> None:
    """``sandbox policy test … | head -1``: the reader goes first; no traceback, 141 as SIGPIPE would."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before we write a byte
    try:
        done = subprocess.run(
            [sys.executable, "-c", "from sandbox.cli import entry; entry()", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            check=False,
            timeout=60,
        )
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 141, (done.returncode, done.stderr)


def test_the_timeout_ceiling_is_the_profiles(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``policy test`` judges a Bash timeout as a session of the profile would: its timeouts.max_s."""
    bash = ["--tool", "Bash", "--args"]
    code, out = _policy_test(capsys, tmp_path, *bash, '{"command": "ls", "timeout": 500}')
    assert (code, out["decision"]) == (0, "allow")  # over the 300 s it once quoted, under default's 3600
    code, out = _policy_test(capsys, tmp_path, *bash, '{"command": "ls", "timeout": 5000}')
    assert out["error_code"] == "INVALID_ARGUMENT" and "at most 3600 seconds" in out["reason"]
    code, out = _policy_test(capsys, tmp_path, "--profile", "ci", *bash, '{"command": "ls", "timeout": 5000}')
    assert (code, out["decision"]) == (0, "allow")  # ci's ceiling is 21600 s
