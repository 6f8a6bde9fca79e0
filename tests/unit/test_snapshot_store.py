"""The session snapshot store (:mod:`sandbox.snapshots`) and its layers (:mod:`sandbox.mounts.layers`),
without a jail: a private copy is edited directly as a jail would, snapshotted, then seeded into a
second fresh copy of the same workspace, whose view must be the first one's."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import time
from typing import TYPE_CHECKING, Any

import pytest

from sandbox import snapshots
from sandbox.errors import Conflict, InvalidArgument, SandboxError
from sandbox.mounts import CopyTree, layers
from sandbox.mounts.stamps import walk
from tests.unit.copy_trees import copy_of

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.anyio

FILES: dict[str, str | bytes] = {
    "README.md": "# sample\n",
    "src/app.py": "print('hello')\n",
    "src/util.py": "x = 1\n",
    "old.txt": "old\n",
    "gone/a.txt": "a\n",
    "gone/b.txt": "b\n",
    "olddir/x.txt": "x\n",
    "dir2/inner.txt": "inner\n",
    "blob": b"\0\1\2",
    "keep.txt": "kept as it is\n",
    "secret-mode.txt": "mode only\n",
}
CAPS = (32, 1 << 30)


@pytest.fixture
async def tree(tmp_path: Path) -> CopyTree:
    return await copy_of(tmp_path, FILES)


async def fresh(tree: CopyTree) -> CopyTree:
    """A second private copy of ``tree``'s workspace, as a restore or a fork starts from."""
    return await CopyTree.prepare(tree.workspace, tree.root.parent)


def take(tree: CopyTree, scratch: Path | None = None, caps: tuple[int, int] = CAPS) -> snapshots.Snapshot:
    return snapshots.take(
        tree,
        scratch,
        lineage="s-line",
        session_id="s-one",
        backend="bwrap",
        mount="copy",
        parent=None,
        settings={"mode": "auto", "operating_mode": "agent"},
        caps=caps,
    )


def view(root: Path) -> dict[str, tuple[Any, ...]]:
    """What a jail sees below ``root``: each entry's kind, mode, and bytes or link target."""
    seen: dict[str, tuple[Any, ...]] = {}
    for rel, st in walk(root):
        content: bytes | str | None = None
        if st.kind == "file":
            content = (root / rel).read_bytes()
        elif st.kind == "symlink":
            content = st.target
        seen[rel] = (st.kind, st.mode, content)
    return seen


def replace_dir(path: Path) -> None:
    """``path`` deleted and made again, empty: a new inode (the old one is freed only after)."""
    path.rename(path.with_name(f"{path.name}.old"))
    path.mkdir()
    shutil.rmtree(path.with_name(f"{path.name}.old"))


def edit(tree: CopyTree) -> None:
    """What a session might do: every kind of change a delta carries."""
    root = tree.root
    (root / "src" / "app.py").write_text("print('bye')\n")  # modified
    (root / "new" / "deep").mkdir(parents=True)  # added, in new directories
    (root / "new" / "deep" / "file.txt").write_text("new\n")
    (root / "empty").mkdir()  # an empty new directory
    (root / "old.txt").unlink()  # deleted
    shutil.rmtree(root / "olddir")  # a whole directory deleted
    replace_dir(root / "gone")  # a directory deleted, then made again with other entries
    (root / "gone" / "c.txt").write_text("c\n")
    (root / "link").symlink_to("src/app.py")  # a new symlink
    (root / "README.md").unlink()  # a file replaced by a symlink
    (root / "README.md").symlink_to("../elsewhere")
    (root / "blob").unlink()  # a file replaced by a directory
    (root / "blob").mkdir()
    (root / "blob" / "inside").write_bytes(b"\xff")
    shutil.rmtree(root / "dir2")  # a directory replaced by a file
    (root / "dir2").write_text("now a file\n")
    (root / "run.sh").write_text("#!/bin/sh\n")  # a new executable
    (root / "run.sh").chmod(0o755)
    (root / "secret-mode.txt").chmod(0o600)  # the mode alone changed
    (root / "src").chmod(0o750)  # a directory's mode changed


# -- take and seed ----------------------------------------------------------------------------------


async def test_a_seeded_fresh_tree_shows_what_the_snapshot_saw(tree: CopyTree) -> None:
    edit(tree)
    snap = take(tree)
    assert snap.kind == "scan" and snap.id.startswith("snap-") and snapshots.ID.match(snap.id)
    assert "old.txt" in snap.delta.deleted and "olddir" in snap.delta.deleted
    assert "olddir/x.txt" not in snap.delta.deleted  # its directory's deletion covers it
    assert {"blob", "gone"} <= set(snap.delta.replaced) and "gone/a.txt" not in snap.delta.deleted
    assert {"src/app.py", "link", "README.md", "run.sh", "dir2", "secret-mode.txt"} <= set(snap.delta.present)
    assert "keep.txt" not in snap.delta.paths()
    second = await fresh(tree)
    assert view(second.root) != view(tree.root)
    layers.seed(second.root, snap.layer, snap.delta)
    assert view(second.root) == view(tree.root)
    seen = view(second.root)
    assert seen["gone/c.txt"][2] == b"c\n" and "gone/a.txt" not in seen and "gone/b.txt" not in seen
    assert seen["link"] == ("symlink", 0o777, "src/app.py") and seen["README.md"][2] == "../elsewhere"
    assert seen["run.sh"][1] == 0o755 and seen["secret-mode.txt"][1] == 0o600 and seen["src"][1] == 0o750
    assert seen["blob"][0] == "dir" and seen["dir2"][0] == "file" and seen["empty"][0] == "dir"
    assert "old.txt" not in seen and "olddir" not in seen
    assert (tree.workspace / "old.txt").read_text() == "old\n"  # the workspace itself is never touched


async def test_a_snapshot_is_kept_whole_and_read_back(tree: CopyTree, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "notes.txt").write_text("12345")
    (tree.root / "src" / "app.py").write_text("print('bye')\n")
    snap = take(tree, scratch)
    again = snapshots.read(snap.id)
    assert again.to_dict() == snap.to_dict() and again.path == snapshots.store() / snap.id
    assert (again.scratch / "notes.txt").read_text() == "12345" and again.scratch_bytes == 5
    described = again.describe()
    assert (described["changed"], described["deleted"], described["bytes"]) == (1, 0, len("print('bye')\n") + 5)
    assert "delta" not in described and "device" not in described
    assert [s.id for s in snapshots.listing()] == [snap.id]
    assert [s.id for s in snapshots.listing(tree.workspace)] == [snap.id]
    assert snapshots.listing(tmp_path) == []  # another workspace has none
    assert not [p for p in snapshots.store().iterdir() if p.name.startswith(snapshots.PARTIAL)]
    assert snapshots.discard(snap.id).id == snap.id and not snap.path.exists()
    with pytest.raises(InvalidArgument, match="no snapshot"):
        snapshots.read(snap.id)


async def test_a_seed_keeps_an_untouched_directorys_mode_above_a_changed_file(tmp_path: Path) -> None:
    """The scan copies a changed file's parents into the layer only to hold it: seeding must not
    give the fresh tree's directory the layer's own mode (nor, as root, its owner)."""
    (tmp_path / "ws" / "src").mkdir(parents=True)
    (tmp_path / "ws" / "src").chmod(0o750)
    tree = await copy_of(tmp_path, {"src/app.py": "print('hello')\n"})
    second = await fresh(tree)
    (tree.root / "src" / "app.py").write_text("print('bye')\n")
    snap = take(tree)
    layers.seed(second.root, snap.layer, snap.delta)
    assert stat.S_IMODE(os.stat(second.root / "src").st_mode) == 0o750
    assert view(second.root) == view(tree.root)


@pytest.mark.root
async def test_a_seed_keeps_an_untouched_directorys_owner_above_a_changed_file(tmp_path: Path) -> None:
    (tmp_path / "ws" / "d").mkdir(parents=True)
    os.chown(tmp_path / "ws" / "d", 1234, 1234)
    tree = await copy_of(tmp_path, {"d/f": "f\n"})
    assert os.stat(tree.root / "d").st_uid == 1234  # a copy keeps the owner, as root
    second = await fresh(tree)
    (tree.root / "d" / "f").write_text("changed\n")
    snap = take(tree)
    layers.seed(second.root, snap.layer, snap.delta)
    assert os.stat(second.root / "d").st_uid == 1234


# -- caps -------------------------------------------------------------------------------------------


def entries() -> list[str]:
    return sorted(p.name for p in snapshots.store().iterdir())


async def test_the_count_cap_refuses_and_keeps_nothing(tree: CopyTree) -> None:
    (tree.root / "src" / "app.py").write_text("print('bye')\n")
    first = take(tree, caps=(2, 1 << 30))
    second = take(tree, caps=(2, 1 << 30))
    before = entries()
    with pytest.raises(Conflict, match=r"limits\.snapshots") as refused:
        take(tree, caps=(2, 1 << 30))
    assert refused.value.data["cap"] == "limits.snapshots"
    assert refused.value.data["snapshots"] == [first.id, second.id]
    assert "sandbox snapshot discard" in refused.value.message
    assert entries() == before  # no third snapshot, no partial one


async def test_the_byte_cap_refuses_and_keeps_nothing(tree: CopyTree) -> None:
    (tree.root / "src" / "app.py").write_text("0123456789")
    first = take(tree, caps=(32, 15))  # 10 bytes: under the cap
    before = entries()
    with pytest.raises(Conflict, match=r"limits\.snapshot_bytes") as refused:
        take(tree, caps=(32, 15))  # 10 more: 20 in all, past it
    assert refused.value.data["cap"] == "limits.snapshot_bytes" and first.id in refused.value.data["snapshots"]
    assert entries() == before == [first.id]
    snapshots.discard(first.id)
    with pytest.raises(Conflict, match=r"limits\.snapshot_bytes"):
        take(tree, caps=(32, 5))  # one snapshot alone past the cap
    assert entries() == []


# -- what read accepts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "snap-",
        "snap-0123",
        "snap-0123456789ABCDEF",
        "snap-0123456789abcdeg",
        "../snap-0123456789abcdef",
        "snap-0123456789abcdef/..",
        "ch-0123456789ab",
        "snap-0123456789abcdef0",
        " snap-0123456789abcdef",
    ],
)
def test_read_refuses_what_is_not_a_snapshot_id(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="not a snapshot id"):
        snapshots.read(bad)


def test_read_says_when_there_is_no_such_snapshot() -> None:
    with pytest.raises(InvalidArgument, match="no snapshot snap-0123456789abcdef") as refused:
        snapshots.read("snap-0123456789abcdef")
    assert refused.value.data == {"snapshot_id": "snap-0123456789abcdef"}


@pytest.mark.parametrize(
    ("key", "path"),
    [
        ("present", "../x"),
        ("deleted", "../../etc/passwd"),
        ("replaced", "/etc"),
        ("present", "a/../../x"),
        ("host", "../x"),
        ("present", ""),
    ],
)
async def test_read_refuses_a_manifest_whose_path_leaves_the_workspace(tree: CopyTree, key: str, path: str) -> None:
    (tree.root / "src" / "app.py").write_text("print('bye')\n")
    snap = take(tree)
    manifest = snap.path / snapshots.MANIFEST
    data = json.loads(manifest.read_text())
    if key == "host":
        data["delta"]["host"][path] = None
    else:
        data["delta"][key].append(path)
    manifest.write_text(json.dumps(data))
    with pytest.raises(InvalidArgument, match="must stay inside the workspace"):
        snapshots.read(snap.id)
    assert snapshots.listing() == []  # an unreadable snapshot is never listed (nor restored)


async def test_read_refuses_a_manifest_it_cannot_read(tree: CopyTree) -> None:
    snap = take(tree)
    (snap.path / snapshots.MANIFEST).write_text("{not json")
    with pytest.raises(InvalidArgument, match="unreadable"):
        snapshots.read(snap.id)


# -- the host's edits -------------------------------------------------------------------------------


async def test_host_changed_reports_a_host_edit_of_a_snapshot_path(tree: CopyTree) -> None:
    edit(tree)
    snap = take(tree)
    assert layers.host_changed(tree.workspace, snap.delta) == []
    snap.check_host(tree.workspace)  # nothing changed: no conflict
    (tree.workspace / "src" / "app.py").write_text("the host's edit\n")  # a path of the snapshot
    os.utime(tree.workspace / "src" / "app.py", ns=(10**18, 10**18))  # whatever the clock's granularity
    (tree.workspace / "keep.txt").write_text("not the snapshot's\n")  # not one of its paths
    (tree.workspace / "run.sh").write_text("the host's own\n")  # absent when the session found it
    assert layers.host_changed(tree.workspace, snap.delta) == ["run.sh", "src/app.py"]
    with pytest.raises(Conflict, match=r"src/app\.py") as refused:
        snap.check_host(tree.workspace)
    assert refused.value.data["paths"] == ["run.sh", "src/app.py"]
    assert snap.check_host(tree.workspace, force=True) == ["run.sh", "src/app.py"]


async def test_host_changed_reports_a_deleted_path_and_a_replaced_directory(tree: CopyTree) -> None:
    edit(tree)
    snap = take(tree)
    (tree.workspace / "old.txt").unlink()  # the session deleted it; the host did too
    replace_dir(tree.workspace / "gone")  # the session replaced it; the host made another
    assert layers.host_changed(tree.workspace, snap.delta) == ["gone", "old.txt"]


async def test_check_workspace_refuses_another_workspace(tree: CopyTree, tmp_path: Path) -> None:
    snap = take(tree)
    snap.check_workspace(tree.workspace)
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(InvalidArgument, match="belongs to the workspace"):
        snap.check_workspace(other)


# -- sweep ------------------------------------------------------------------------------------------


async def test_sweep_removes_an_old_snapshot_and_a_stale_partial(tree: CopyTree) -> None:
    (tree.root / "src" / "app.py").write_text("print('bye')\n")
    old, recent = take(tree), take(tree)
    now = time.time()
    long_ago = now - snapshots.RETENTION_S - 60
    os.utime(old.path / snapshots.MANIFEST, (long_ago, long_ago))
    stale = snapshots.store() / f"{snapshots.PARTIAL}-snap-00000000000000aa"
    busy = snapshots.store() / f"{snapshots.PARTIAL}-snap-00000000000000bb"  # a snapshot being taken now
    for partial in (stale, busy):
        (partial / "layer").mkdir(parents=True)
    os.utime(stale, (now - 7200, now - 7200))
    assert sorted(snapshots.sweep(now)) == sorted([old.id, stale.name])
    assert entries() == sorted([recent.id, busy.name])
    assert [s.id for s in snapshots.listing()] == [recent.id]


async def test_touching_a_snapshot_keeps_it_from_the_sweep(tree: CopyTree) -> None:
    snap = take(tree)
    long_ago = time.time() - snapshots.RETENTION_S - 60
    os.utime(snap.path / snapshots.MANIFEST, (long_ago, long_ago))
    snap.touch()  # a restore or a fork from it
    assert snapshots.sweep() == [] and entries() == [snap.id]


# -- diff -------------------------------------------------------------------------------------------


def sha(data: bytes) -> str:
    return f"file sha256:{hashlib.sha256(data).hexdigest()}"


async def test_diff_of_two_snapshots(tree: CopyTree, tmp_path: Path) -> None:
    (tree.root / "src" / "app.py").write_text("one\n")
    (tree.root / "keep.txt").write_text("same in both\n")
    first = take(tree)
    (tree.root / "src" / "app.py").write_text("two\n")
    (tree.root / "new.txt").write_text("new\n")
    (tree.root / "old.txt").unlink()
    (tree.root / "link").symlink_to("new.txt")
    shutil.rmtree(tree.root / "olddir")
    second = take(tree)
    assert snapshots.diff(first.id, second.id) == [
        {"path": "link", "a": "host", "b": "symlink -> new.txt"},
        {"path": "new.txt", "a": "host", "b": sha(b"new\n")},
        {"path": "old.txt", "a": "host", "b": "deleted"},
        {"path": "olddir", "a": "host", "b": "deleted"},
        {"path": "src/app.py", "a": sha(b"one\n"), "b": sha(b"two\n")},
    ]
    backwards = snapshots.diff(second.id, first.id)
    assert [(d["path"], d["a"], d["b"]) for d in backwards] == [
        (d["path"], d["b"], d["a"]) for d in snapshots.diff(first.id, second.id)
    ]
    assert snapshots.diff(first.id, first.id) == []
    other = await copy_of(tmp_path / "elsewhere", {"f": "f\n"})
    with pytest.raises(InvalidArgument, match="different workspaces"):
        snapshots.diff(first.id, take(other).id)
    with pytest.raises(InvalidArgument, match="not a snapshot id"):
        snapshots.diff(first.id, "../x")


# -- seed never follows a link out of the tree (security) ------------------------------------------


def outside_dir(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("the host's own f\n")
    (outside / "g").write_text("the host's own g\n")
    return outside


def outside_state(outside: Path) -> dict[str, tuple[Any, ...]]:
    return {rel: (*values, os.lstat(outside / rel).st_mtime_ns) for rel, values in view(outside).items()}


async def snapshot_under_d(tmp_path: Path, delete_too: bool) -> tuple[CopyTree, snapshots.Snapshot]:
    tree = await copy_of(tmp_path, {"d/f": "f\n", "d/g": "g\n", "top.txt": "top\n"})
    (tree.root / "d" / "f").write_text("the session's f\n")
    if delete_too:
        (tree.root / "d" / "g").unlink()
    return tree, take(tree)


@pytest.mark.parametrize("delete_too", [False, True], ids=["changed", "changed-and-deleted"])
async def test_seed_never_follows_a_symlink_put_where_a_delta_directory_was(tmp_path: Path, delete_too: bool) -> None:
    tree, snap = await snapshot_under_d(tmp_path, delete_too)
    outside = outside_dir(tmp_path)
    before = outside_state(outside)
    target = await fresh(tree)
    shutil.rmtree(target.root / "d")
    (target.root / "d").symlink_to(outside)  # the host's link where the delta's directory was
    refused: SandboxError | None = None
    try:  # refused, or the link replaced by a directory of the tree
        layers.seed(target.root, snap.layer, snap.delta)
    except SandboxError as exc:
        refused = exc
    assert outside_state(outside) == before  # nothing written, changed or deleted through the link
    d = target.root / "d"
    assert not d.is_symlink() or os.readlink(d) == str(outside)
    if refused is None:  # seeded: the tree's own directory holds the snapshot's file
        assert not d.is_symlink() and sorted(os.listdir(d)) == ["f"]
        assert (d / "f").read_text() == "the session's f\n"


@pytest.mark.parametrize("delete_too", [False, True], ids=["changed", "changed-and-deleted"])
async def test_seed_refuses_a_symlink_put_where_a_delta_directory_was(tmp_path: Path, delete_too: bool) -> None:
    """The module's promise: the link fails the seed (a restore then keeps the session as it was)."""
    tree, snap = await snapshot_under_d(tmp_path, delete_too)
    outside = outside_dir(tmp_path)
    target = await fresh(tree)
    shutil.rmtree(target.root / "d")
    (target.root / "d").symlink_to(outside)
    with pytest.raises(SandboxError):
        layers.seed(target.root, snap.layer, snap.delta)
    assert sorted(os.listdir(outside)) == ["f", "g"] and (outside / "f").read_text() == "the host's own f\n"


# -- the delta's paths ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../x", "/abs", "a/../b", "", "..", "a/..", "/"])
def test_check_path_refuses_what_leaves_the_tree(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="must stay inside the workspace"):
        layers.check_path(bad)


@pytest.mark.parametrize("odd", ["a//b", "./a", "a/.", "a/"])
def test_check_path_refuses_a_path_that_is_not_normalised(odd: str) -> None:
    """Its promise: a path "as stored", normalised (``a/.`` would name ``a`` itself to a seed)."""
    with pytest.raises(InvalidArgument, match="must stay inside the workspace"):
        layers.check_path(odd)


@pytest.mark.parametrize("good", ["a", "a/b", ".hidden/x", "a..b", "..x"])
def test_check_path_takes_a_plain_relative_path(good: str) -> None:
    assert layers.check_path(good) == good


def test_a_delta_round_trips_through_its_dict() -> None:
    host = {"a": None, "c": ["file", 420, 1, 1, 1, 1, 1, 1, None]}
    delta = layers.Delta(["a"], ["b"], ["c", "d/e"], ["d"], host=host, bytes=3)
    assert layers.Delta.from_dict(json.loads(json.dumps(delta.to_dict()))) == delta
    assert delta.paths() == ["a", "b", "c", "d", "d/e"]
