"""The journalled apply without a jail: guards, the commit point, recovery (crashes: tests/integration)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from sandbox.errors import Conflict
from sandbox.mounts import CopyTree, applyplan, dirfds, journal, walk
from tests.unit.copy_trees import copy_of

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.anyio


@pytest.fixture
async def tree(tmp_path: Path) -> CopyTree:
    return await copy_of(tmp_path, {"dir/a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n"})


def contents(root: Path) -> dict[str, str]:
    return {rel: (root / rel).read_text() if st.kind == "file" else st.kind for rel, st in walk(root)}


def hidden(root: Path) -> list[str]:
    return [rel for rel, _ in walk(root) if ".sandbox-" in rel]


async def test_a_conflict_found_before_the_commit_point_changes_nothing(
    tree: CopyTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tree.root / "b.txt").write_text("jail\n")
    (tree.root / "c.txt").write_text("jail\n")
    (tree.root / "new" / "deep").mkdir(parents=True)
    (tree.root / "new" / "deep" / "n.txt").write_text("n\n")
    (tree.root / "dir" / "a.txt").unlink()
    changes = await tree.changes()
    stage = journal._stage

    def user_edits_meanwhile(dirs: dirfds.Dirs, step: applyplan.Step) -> None:
        stage(dirs, step)
        (tree.workspace / "c.txt").write_text("the user was faster\n")

    monkeypatch.setattr(journal, "_stage", user_edits_meanwhile)
    before = contents(tree.workspace)
    with pytest.raises(Conflict) as info:
        await tree.apply(changes)
    assert [c["path"] for c in info.value.data["conflicts"]] == ["c.txt"]
    assert contents(tree.workspace) == {**before, "c.txt": "the user was faster\n"}
    assert hidden(tree.workspace) == [] and not journal.journal_path(tree.workspace).exists()


async def test_guard_conflicts_are_reported_and_the_rest_applied_as_a_unit(tree: CopyTree) -> None:
    (tree.root / "b.txt").write_text("jail\n")
    (tree.root / "c.txt").write_text("jail\n")
    (tree.root / "new").mkdir()
    (tree.root / "new" / "n.txt").write_text("n\n")
    (tree.workspace / "c.txt").write_text("user\n")
    (tree.workspace / "new").write_text("the user made a file here\n")
    report = await tree.apply(await tree.changes())
    assert report.applied == ["b.txt"]
    assert [c["path"] for c in report.conflicts] == ["c.txt", "new", "new/n.txt"]
    assert (tree.workspace / "b.txt").read_text() == "jail\n"
    assert (tree.workspace / "c.txt").read_text() == "user\n"
    assert hidden(tree.workspace) == []


async def test_a_directory_the_host_added_to_is_not_deleted(tree: CopyTree) -> None:
    (tree.root / "dir" / "a.txt").unlink()
    (tree.root / "dir").rmdir()
    (tree.workspace / "dir" / "mine.txt").write_text("keep\n")
    report = await tree.apply(await tree.changes())
    assert report.applied == ["dir/a.txt"]
    assert [c["path"] for c in report.conflicts] == ["dir"]
    assert sorted(p.name for p in (tree.workspace / "dir").iterdir()) == ["mine.txt"]


async def test_a_file_chosen_deep_in_a_new_directory_gets_its_parents(tree: CopyTree) -> None:
    (tree.root / "x" / "y").mkdir(parents=True, mode=0o700)
    (tree.root / "x" / "y" / "f.txt").write_text("f\n")
    report = await tree.apply(await tree.changes(), paths=["x/y/f.txt"])
    assert report.applied == ["x/y/f.txt"]
    assert (tree.workspace / "x" / "y" / "f.txt").read_text() == "f\n"
    assert (tree.workspace / "x" / "y").stat().st_mode & 0o777 == 0o755


async def test_an_apply_stopped_after_the_commit_point_is_rolled_forward(
    tree: CopyTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tree.root / "b.txt").write_text("jail\n")
    (tree.root / "dir" / "a.txt").unlink()
    changes = await tree.changes()
    with monkeypatch.context() as patched:
        patched.setattr(journal, "_roll_forward", _stop)
        with pytest.raises(KeyboardInterrupt):
            await tree.apply(changes)
    assert journal.pending() == [tree.workspace.resolve()]
    assert (tree.workspace / "b.txt").read_text() == "b\n" and hidden(tree.workspace)
    report = journal.recover(tree.workspace)
    assert (report.action, report.steps, report.problems) == ("rolled-forward", 2, [])
    assert contents(tree.workspace) == {"dir": "dir", "b.txt": "jail\n", "c.txt": "c\n"}
    assert hidden(tree.workspace) == [] and journal.pending() == []


def _stop(*_args: object) -> list[dict[str, str]]:
    raise KeyboardInterrupt


async def test_two_hard_links_to_one_changed_file_are_both_applied(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("old\n")
    os.link(ws / "a.txt", ws / "b.txt")
    tree = await CopyTree.prepare(ws, tmp_path)
    (tree.root / "a.txt").write_text("new\n")  # in place: the copy's b.txt is the same inode
    report = await tree.apply(await tree.changes(), include_flagged=True)  # both are flagged "hardlink"
    assert (sorted(report.applied), report.conflicts) == (["a.txt", "b.txt"], [])
    assert (ws / "a.txt").read_text() == (ws / "b.txt").read_text() == "new\n"


async def test_an_apply_stopped_before_the_commit_point_leaves_nothing(
    tree: CopyTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even a staged directory its own mode makes read-only (as an ordinary user, rmtree needs help)."""
    (tree.root / "new" / "sub").mkdir(parents=True)
    (tree.root / "new" / "sub" / "f.txt").write_text("f\n")
    (tree.root / "b.txt").write_text("jail\n")
    for path in (tree.root / "new" / "sub", tree.root / "new"):
        path.chmod(0o555)
    changes = await tree.changes()
    before = contents(tree.workspace)
    with monkeypatch.context() as patched:
        patched.setattr(journal, "_recheck", _stop)
        with pytest.raises(KeyboardInterrupt):
            await tree.apply(changes)
    assert contents(tree.workspace) == before and hidden(tree.workspace) == []
    assert journal.pending() == []
    report = await tree.apply(changes)
    assert sorted(report.applied) == ["b.txt", "new", "new/sub", "new/sub/f.txt"]
    assert (tree.workspace / "new" / "sub").stat().st_mode & 0o777 == 0o555
    for path in (tree.root / "new", tree.root / "new" / "sub", tree.workspace / "new", tree.workspace / "new" / "sub"):
        path.chmod(0o755)  # so that tmp_path can be removed as an ordinary user


async def test_recover_without_a_journal_does_nothing(tree: CopyTree) -> None:
    report = journal.recover(tree.workspace)
    assert report.to_dict() == {
        "workspace": str(tree.workspace.resolve()),
        "action": "none",
        "steps": 0,
        "problems": [],
    }


def test_a_lock_held_on_the_workspace_cannot_stall_a_jail_open(tmp_path: Path) -> None:
    """A command in a jail can flock the workspace it is shown; with no journal, ``recover`` (run
    at every jail open) must not wait for that lock."""
    import fcntl
    import threading

    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        done: list[str] = []
        worker = threading.Thread(target=lambda: done.append(journal.recover(tmp_path).action), daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert done == ["none"], "recover waited for a lock it did not need"
    finally:
        os.close(fd)
