"""The review record (seed 003 §4c): its fields, its status, and a diff of standard unified hunks.

A client shows the hunks and may hand them to a patch tool, so their headers follow the unified
format: an empty side is ``0,0`` (``@@ -0,0 +1,2 @@`` for a new file), never ``1,0``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from typing import TYPE_CHECKING, Any

import pytest

from sandbox import review

if TYPE_CHECKING:
    from pathlib import Path

PATH = "pkg/app.py"
SEED_FIELDS = {  # seed 003 §4c's ReviewChange, in the protocol's snake_case
    "version",
    "snapshot_id",
    "message_id",
    "path",
    "operation",
    "status",
    "state",
    "additions",
    "deletions",
    "hunks",
    "binary",
    "truncated",
    "reversible",
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _store(tmp_path: Path) -> review.SnapshotStore:
    return review.SnapshotStore("s1", root=tmp_path / "snapshots")


def _record(tmp_path: Path, before: str | None, after: str | None, turn_id: str = "") -> dict[str, Any]:
    """The review record of a tool that turned ``before`` into ``after`` (``None``: no file)."""
    details = {
        "existed": before is not None,
        "before": None if before is None else base64.b64encode(before.encode()).decode(),
        "after": after,
        "after_sha256": None if after is None else _sha(after),
    }
    return review.record(_store(tmp_path), "call-1", "write", PATH, details, turn_id=turn_id)


def _patch_text(record: dict[str, Any], before: str | None, after: str | None) -> str:
    """The record's hunks under the file headers a patch tool wants."""
    old = "/dev/null" if before is None else f"a/{PATH}"
    new = "/dev/null" if after is None else f"b/{PATH}"
    return "\n".join([f"--- {old}", f"+++ {new}", *record["hunks"]]) + "\n"


def test_the_record_has_the_seeds_fields_and_names_its_message(tmp_path: Path) -> None:
    record = _record(tmp_path, "one\n", "two\n", turn_id="turn-3")
    assert SEED_FIELDS - record.keys() == set()
    assert record["version"] == review.REVIEW_VERSION == 1
    assert (record["message_id"], record["tool_call_id"], record["turn_id"]) == ("call-1", "call-1", "turn-3")
    assert (record["operation"], record["state"], record["reversible"]) == ("write", "active", True)


def test_the_stored_snapshot_is_the_record(tmp_path: Path) -> None:
    record = _record(tmp_path, "one\n", "two\n", turn_id="turn-3")
    snap, before = _store(tmp_path).load(record["snapshot_id"])
    assert before == b"one\n"
    assert (snap.version, snap.turn_id, snap.status, snap.path) == (1, "turn-3", "modified", PATH)


def test_a_snapshot_kept_before_version_and_turn_existed_still_loads(tmp_path: Path) -> None:
    record = _record(tmp_path, "one\n", "two\n")
    meta = tmp_path / "snapshots" / "s1" / record["snapshot_id"] / "meta.json"
    old = {k: v for k, v in json.loads(meta.read_text()).items() if k not in ("version", "turn_id")}
    meta.write_text(json.dumps(old))
    snap, _ = _store(tmp_path).load(record["snapshot_id"])
    assert (snap.version, snap.turn_id, snap.after_sha256) == (1, "", _sha("two\n"))


def test_a_file_the_tool_removed_is_deleted_to_0_0(tmp_path: Path) -> None:
    record = _record(tmp_path, "one\ntwo\n", None)
    # Its rollback cannot restore an absent file (the runner's restore expects one): not reversible.
    assert (record["status"], record["reversible"]) == ("deleted", False)
    assert (record["additions"], record["deletions"]) == (0, 2)
    assert record["hunks"] == ["@@ -1,2 +0,0 @@\n-one\n-two"]
    snap, before = _store(tmp_path).load(record["snapshot_id"])
    assert (snap.after_sha256, before) == (None, b"one\ntwo\n")


def test_a_deleted_file_too_large_to_keep_is_not_reversible(tmp_path: Path) -> None:
    details = {"existed": True, "before": None, "before_kept": False, "after": None, "after_sha256": None}
    record = review.record(_store(tmp_path), "call-1", "edit", PATH, details)
    assert (record["status"], record["reversible"], record["truncated"]) == ("deleted", False, True)


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


CASES: dict[str, tuple[str | None, str | None]] = {
    "added": (None, "one\ntwo\n"),
    "deleted": ("one\ntwo\nthree\n", None),
    "emptied": ("one\ntwo\nthree\n", ""),
    "modified": (
        "".join(f"{n}\n" for n in range(40)),
        "".join(f"{n}\n" for n in range(40) if n not in (3, 30)) + "x\n",
    ),
    # Shared lines at both ends are left out of the comparison: the line numbers must still be right.
    "repeated": ("x\n" * 300, "x\n" * 150 + "y\n" + "x\n" * 149 + "z\n"),
}


def test_an_unchanged_file_has_no_hunks(tmp_path: Path) -> None:
    text = "same\n" * 500
    record = _record(tmp_path, text, text)
    assert (record["additions"], record["deletions"], record["hunks"]) == (0, 0, [])


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("tool", ["patch", "git"])
def test_the_hunks_apply_with_patch_tools(tmp_path: Path, case: str, tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    before, after = CASES[case]
    record = _record(tmp_path, before, after)
    root = _tree(tmp_path / "tree", before)
    (tmp_path / "change.diff").write_text(_patch_text(record, before, after))
    argv = ["patch", "-p1", "--batch", "-i"] if tool == "patch" else ["git", "apply", "--unsafe-paths", "-p1"]
    done = subprocess.run([*argv, str(tmp_path / "change.diff")], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    if after is None:
        assert not (root / PATH).exists()
    else:
        assert (root / PATH).read_text() == after


@pytest.mark.parametrize(
    ("path", "root", "shown"),
    [
        ("/work/ws/src/a.py", "/work/ws", "src/a.py"),
        ("/work/ws/a.py", "/work/ws/", "a.py"),
        ("/elsewhere/a.py", "/work/ws", "/elsewhere/a.py"),  # not under the root: as it is
        ("C:\\Users\\me\\ws\\src\\a.py", "C:\\Users\\me\\ws", "src/a.py"),
        ("c:\\users\\me\\ws\\a.py", "C:\\Users\\Me\\WS", "a.py"),  # Windows paths compare without case
    ],
)
def test_a_records_path_is_relative_to_its_root(path: str, root: str, shown: str) -> None:
    assert review.relative(path, root) == shown


def test_the_record_names_its_path_relative_and_the_snapshot_keeps_it_whole(tmp_path: Path) -> None:
    details = {"existed": False, "before": None, "after": "x\n", "after_sha256": _sha("x\n")}
    store = _store(tmp_path)
    record = review.record(store, "call-1", "write", "/work/ws/src/new.py", details, workspace="/work/ws")
    assert record["path"] == "src/new.py"
    snap, _ = store.load(record["snapshot_id"])
    assert snap.path == "/work/ws/src/new.py"  # what rollback restores
