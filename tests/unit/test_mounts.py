"""Copy-out safety, without a jail: the private copy is edited directly as a jail would."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from sandbox.calls import check_workspace
from sandbox.errors import InvalidArgument
from tests.unit.copy_trees import copy_of

if TYPE_CHECKING:
    from sandbox.mounts import CopyTree

pytestmark = pytest.mark.anyio


@pytest.fixture
async def tree(tmp_path: Path) -> CopyTree:
    return await copy_of(tmp_path, {"dir/a.txt": "a\n", "b.txt": "b\n"})


async def test_untouched_copy_has_no_changes(tree: CopyTree) -> None:
    assert (await tree.changes()).changes == []


async def test_touch_without_content_change_is_not_a_change(tree: CopyTree) -> None:
    os.utime(tree.root / "b.txt", None)
    assert (await tree.changes()).changes == []


async def test_same_size_rewrite_with_old_mtime_is_detected(tree: CopyTree) -> None:
    st = os.stat(tree.root / "b.txt")
    (tree.root / "b.txt").write_text("X\n")
    os.utime(tree.root / "b.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    changes = (await tree.changes()).changes
    assert [(c.path, c.status) for c in changes] == [("b.txt", "modified")]


async def test_apply_does_not_follow_a_symlink_swapped_in_on_the_host(tree: CopyTree, tmp_path: Path) -> None:
    (tree.root / "dir" / "a.txt").write_text("from jail\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(tree.workspace / "dir")
    (tree.workspace / "dir").symlink_to(outside)
    report = await tree.apply(await tree.changes())
    assert [c["path"] for c in report.conflicts] == ["dir/a.txt"]
    assert list(outside.iterdir()) == []


async def test_apply_replaces_a_host_symlink_instead_of_writing_through_it(tree: CopyTree, tmp_path: Path) -> None:
    (tree.root / "new.txt").write_text("jail\n")
    target = tmp_path / "target.txt"
    target.write_text("keep\n")
    (tree.workspace / "new.txt").symlink_to(target)  # planted after copy-in
    report = await tree.apply(await tree.changes())
    assert [c["path"] for c in report.conflicts] == ["new.txt"]
    assert target.read_text() == "keep\n"


async def test_apply_is_atomic_per_file_and_strips_setuid(tree: CopyTree) -> None:
    path = tree.root / "tool"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o4755)
    changes = await tree.changes()
    assert {"setuid", "new-executable"} <= set(changes.changes[0].flags)
    held = await tree.apply(changes)
    assert held.applied == [] and held.held_back == [{"path": "tool", "flags": changes.changes[0].flags}]
    assert not (tree.workspace / "tool").exists()
    report = await tree.apply(changes, paths=["tool"])  # named: consented
    assert report.applied == ["tool"]
    assert (tree.workspace / "tool").stat().st_mode & 0o7777 == 0o755
    assert not [p for p in tree.workspace.iterdir() if ".sandbox-" in p.name]


async def test_apply_rejects_paths_that_escape(tree: CopyTree) -> None:
    changes = await tree.changes()
    from sandbox.mounts import Change

    changes.changes = [Change("../evil", "added", "file"), Change("/etc/evil", "added", "file")]
    report = await tree.apply(changes)
    assert len(report.conflicts) == 2 and report.applied == []


async def test_remove_cleans_even_unwritable_dirs(tree: CopyTree) -> None:
    (tree.root / "locked").mkdir()
    (tree.root / "locked" / "f").write_text("x")
    (tree.root / "locked").chmod(0o500)
    await anyio.to_thread.run_sync(tree.remove)
    assert not tree.root.exists()


@pytest.mark.parametrize("path", ["/", "/usr", "/etc", "/tmp"])
def test_system_workspaces_are_refused(path: str) -> None:
    with pytest.raises(InvalidArgument):
        check_workspace(Path(path))


def test_missing_workspace(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="does not exist"):
        check_workspace(tmp_path / "nope")
