"""The review record's diff: standard unified hunks that ``patch`` and ``git apply`` accept.

A client shows the hunks and may hand them to a patch tool, so their headers follow the unified
format: an empty side is ``0,0`` (``@@ -0,0 +1,2 @@`` for a new file), never ``1,0``.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
from typing import TYPE_CHECKING, Any

import pytest

from sandbox import review

if TYPE_CHECKING:
    from pathlib import Path

PATH = "pkg/app.py"


def _record(tmp_path: Path, before: str | None, after: str) -> dict[str, Any]:
    """The review record of a Write that turned ``before`` (``None``: no file) into ``after``."""
    store = review.SnapshotStore("s1", root=tmp_path / "snapshots")
    details = {
        "existed": before is not None,
        "before": None if before is None else base64.b64encode(before.encode()).decode(),
        "after": after,
        "after_sha256": hashlib.sha256(after.encode()).hexdigest(),
    }
    return review.record(store, "call-1", "write", PATH, details)


def _patch_text(record: dict[str, Any], created: bool) -> str:
    """The record's hunks under the file headers a patch tool wants."""
    old = "/dev/null" if created else f"a/{PATH}"
    return "\n".join([f"--- {old}", f"+++ b/{PATH}", *record["hunks"]]) + "\n"


def _tree(root: Path, before: str | None) -> Path:
    root.mkdir()
    (root / "pkg").mkdir()
    if before is not None:
        (root / PATH).write_text(before)
    return root


def test_a_new_file_is_added_from_0_0(tmp_path: Path) -> None:
    record = _record(tmp_path, None, "one\ntwo\n")
    assert record["status"] == "added" and (record["additions"], record["deletions"]) == (2, 0)
    assert record["hunks"] == ["@@ -0,0 +1,2 @@\n+one\n+two"]


def test_an_emptied_file_is_removed_to_0_0(tmp_path: Path) -> None:
    record = _record(tmp_path, "one\ntwo\nthree\n", "")
    assert record["status"] == "modified" and (record["additions"], record["deletions"]) == (0, 3)
    assert record["hunks"] == ["@@ -1,3 +0,0 @@\n-one\n-two\n-three"]


def test_a_modified_file_keeps_three_lines_of_context(tmp_path: Path) -> None:
    before = "".join(f"line {n}\n" for n in range(1, 21))
    after = before.replace("line 10\n", "line ten\n")
    record = _record(tmp_path, before, after)
    assert (record["additions"], record["deletions"]) == (1, 1)
    [hunk] = record["hunks"]
    assert hunk.splitlines() == [
        "@@ -7,7 +7,7 @@",
        *(f" line {n}" for n in range(7, 10)),
        "-line 10",
        "+line ten",
        *(f" line {n}" for n in range(11, 14)),
    ]


CASES = {
    "added": (None, "one\ntwo\n"),
    "emptied": ("one\ntwo\nthree\n", ""),
    "modified": (
        "".join(f"{n}\n" for n in range(40)),
        "".join(f"{n}\n" for n in range(40) if n not in (3, 30)) + "x\n",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("tool", ["patch", "git"])
def test_the_hunks_apply_with_patch_tools(tmp_path: Path, case: str, tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    before, after = CASES[case]
    record = _record(tmp_path, before, after)
    root = _tree(tmp_path / "tree", before)
    (tmp_path / "change.diff").write_text(_patch_text(record, created=before is None))
    argv = ["patch", "-p1", "--batch", "-i"] if tool == "patch" else ["git", "apply", "--unsafe-paths", "-p1"]
    done = subprocess.run([*argv, str(tmp_path / "change.diff")], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (root / PATH).read_text() == after
