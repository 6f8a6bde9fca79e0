"""A session's file state as a layer: what its private tree holds that the workspace does not.

:func:`capture` writes a tree's delta into a directory of ours: the entries the session added or
changed, copied (mode, times and, as root, owner kept; never following a link), and a
:class:`Delta` naming the paths it deleted and the directories it replaced (their host content
hidden), with the host's stamp of each path as the session found it. An overlay's delta is its
upper directory (work proportional to what changed); a copy's is a scan of the copy against its
baseline (proportional to the workspace's entries). :func:`seed` applies a delta to a fresh
tree through its view (a copy, or an overlay's merged directory, where overlayfs makes the
whiteouts), one directory at a time with ``O_NOFOLLOW``: a link the host put where a directory
of the delta was fails the seed instead of leading it out of the tree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from sandbox import datadir
from sandbox.errors import Conflict, InvalidArgument, map_errors
from sandbox.mounts.dirfds import Dirs, lstat
from sandbox.mounts.hostfs import is_opaque, is_whiteout
from sandbox.mounts.stamps import Stamp, open_unfollowed, under, walk

if TYPE_CHECKING:
    from collections.abc import Callable

    from sandbox.mounts.trees import CopyTree


@dataclass
class Delta:
    """What a layer changes over the workspace; ``host``: each path's host stamp as the session found it."""

    deleted: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)  # the layer's non-directory entries
    dirs: list[str] = field(default_factory=list)  # its directories the session made or changed (mode)
    host: dict[str, list[Any] | None] = field(default_factory=dict)
    bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Delta:
        return cls(
            deleted=list(data["deleted"]),
            replaced=list(data["replaced"]),
            present=list(data["present"]),
            dirs=list(data["dirs"]),
            host=dict(data["host"]),
            bytes=int(data["bytes"]),
        )

    def paths(self) -> list[str]:
        return sorted({*self.deleted, *self.replaced, *self.present, *self.dirs})


def kind(tree: CopyTree) -> str:
    """``"layers"`` where the tree's delta is read from an overlay's upper directory, else ``"scan"``."""
    return "layers" if getattr(tree, "upper", None) is not None else "scan"


def capture(tree: CopyTree, dest: Path, leave_out: Callable[[str], bool] = lambda _rel: False) -> Delta:
    """Write ``tree``'s delta over its workspace into ``dest`` (a new directory of ours), without the
    paths ``leave_out`` names (what the jail's seal masks: a snapshot never holds a masked secret)."""
    with map_errors("cannot snapshot the session's private tree"):
        dest.mkdir(mode=0o700)
        upper = getattr(tree, "upper", None)
        delta = _from_upper(tree, upper, dest, leave_out) if upper is not None else _from_copy(tree, dest, leave_out)
    # Each path the layer shows, its directories too: a host that made one of them something else
    # since (a link, say) changed what a restore would hide.
    shown = [rel for rel, st in walk(dest) if st.kind == "dir"]
    for rel in (*delta.deleted, *delta.replaced, *delta.present, *shown):
        delta.host[rel] = _host_stamp(tree.workspace, rel)
    return delta


def _from_upper(tree: CopyTree, upper: Path, dest: Path, leave_out: Callable[[str], bool]) -> Delta:
    delta = Delta()
    for rel, st in walk(upper, set(tree.untracked)):
        if under(rel, tree.untracked) or leave_out(rel):
            continue
        path = upper / rel
        if st.kind == "special":
            if is_whiteout(path):
                delta.deleted.append(rel)
            continue  # FIFOs, sockets and devices never leave the jail
        if st.kind == "dir":
            _mkdir(dest, rel, path)
            if is_opaque(path):
                delta.replaced.append(rel)
                delta.dirs.append(rel)
            elif _made_or_changed(tree.workspace / rel, st):
                delta.dirs.append(rel)
        else:
            delta.bytes += _copy_entry(path, dest / rel, st)
            delta.present.append(rel)
    return delta


def _from_copy(tree: CopyTree, dest: Path, leave_out: Callable[[str], bool]) -> Delta:
    delta = Delta()
    skip = {*tree.untracked, *tree.seeded}
    now = dict(walk(tree.root, skip))
    gone_dirs: list[str] = []
    for rel in sorted(now):
        st, before = now[rel], tree.copy.get(rel)
        if (before is not None and before.same_version(st)) or st.kind == "special" or leave_out(rel):
            continue
        if st.kind == "dir":
            if before is not None and before.kind == "dir" and (before.ino, before.mode) == (st.ino, st.mode):
                continue  # only its entries changed: they are listed themselves
            _mkdir(dest, rel, tree.root / rel)
            delta.dirs.append(rel)
            if before is not None and (before.kind != "dir" or before.ino != st.ino):
                delta.replaced.append(rel)
                gone_dirs.append(rel)
            continue
        if before is not None and before.kind == "file" and st.kind == "file" and _same_bytes(tree, rel, before, st):
            continue
        delta.bytes += _copy_entry(tree.root / rel, dest / rel, st)
        delta.present.append(rel)
    for rel in sorted(set(tree.copy) - set(now)):
        if not under(rel, (*skip, *gone_dirs)) and not leave_out(rel):
            delta.deleted.append(rel)
            gone_dirs.append(rel)
    return delta


def _same_bytes(tree: CopyTree, rel: str, before: Stamp, st: Stamp) -> bool:
    """A file rewritten with the bytes it had (a touch, an editor's save) is not a change."""
    if before.size != st.size or before.mode != st.mode:
        return False
    from sandbox.mounts.stamps import same_content

    return same_content(tree.root / rel, tree.workspace / rel)


def seed(root: Path, layer: Path, delta: Delta) -> None:
    """Make the fresh tree at ``root`` show ``layer`` over its workspace (see the module's doc)."""
    owner = os.geteuid() == 0
    with map_errors("cannot start the tree from the snapshot"), Dirs(root) as dirs:
        for rel in sorted({*delta.deleted, *delta.replaced}, key=lambda r: r.count("/")):
            pfd, name = _parent(dirs, rel)
            if pfd is not None:
                _remove(pfd, name, lstat(pfd, name))
        made = set(delta.dirs)
        for rel, st in walk_sorted(layer):
            pfd, name = _parent(dirs, rel)
            if pfd is None:
                raise Conflict(f"the workspace has no directory for {rel} any more", path=rel)
            if st.kind == "dir" and rel not in made:  # only holds what changed: the tree's own stays as it is
                there = lstat(pfd, name)
                if there is not None and not stat.S_ISDIR(there.st_mode):
                    raise Conflict(f"{rel} is no longer a directory in the workspace", path=rel)
                if there is not None:
                    continue
            _place(pfd, name, layer / rel, st, owner=owner)


def walk_sorted(root: Path) -> list[tuple[str, Stamp]]:
    """Every entry of ``root``, each directory before what it holds."""
    return sorted(walk(root), key=lambda item: PurePosixPath(item[0]).parts)


def _parent(dirs: Dirs, rel: str) -> tuple[int | None, str]:
    parent, name = os.path.split(rel)
    return dirs.get(parent or "."), name


def _place(pfd: int, name: str, source: Path, st: Stamp, *, owner: bool) -> None:
    there = lstat(pfd, name)
    if st.kind == "dir":
        if there is not None and not stat.S_ISDIR(there.st_mode):
            _remove(pfd, name, there)
            there = None
        if there is None:
            os.mkdir(name, st.mode, dir_fd=pfd)
        fd = os.open(name, datadir.DIR_FLAGS, dir_fd=pfd)
        try:
            os.fchmod(fd, st.mode)
            if owner:
                src = os.stat(source, follow_symlinks=False)
                os.fchown(fd, src.st_uid, src.st_gid)
        finally:
            os.close(fd)
        return
    if there is not None:
        _remove(pfd, name, there)
    if st.kind == "symlink":
        assert st.target is not None
        os.symlink(st.target, name, dir_fd=pfd)
        if owner:
            src = os.stat(source, follow_symlinks=False)
            os.chown(name, src.st_uid, src.st_gid, dir_fd=pfd, follow_symlinks=False)
    else:
        _copy_into(source, pfd, name, st.mode, owner=owner)


def _copy_into(source: Path, pfd: int, name: str, mode: int, *, owner: bool) -> None:
    """A new file ``name`` in ``pfd`` with ``source``'s content, ``mode``, times and (``owner``:
    as root) owner, all set through the descriptors (no lookup by name through an overlay's view
    for each). The mode before the owner, as ``chmod`` then ``chown`` did."""
    src = open_unfollowed(source)
    try:
        dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd)
        try:
            st = os.fstat(src)
            _copy_fd(src, dst, st.st_size)
            os.fchmod(dst, mode)
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
            if owner:
                os.fchown(dst, st.st_uid, st.st_gid)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _copy_fd(src: int, dst: int, size: int) -> None:
    copied = 0
    with contextlib.suppress(OSError):  # another filesystem (an overlay's view): EXDEV, copied below
        while copied < size and (n := os.copy_file_range(src, dst, size - copied)):
            copied += n
    if copied < size:
        if copied:
            os.lseek(src, copied, os.SEEK_SET)
            os.lseek(dst, copied, os.SEEK_SET)
        while chunk := os.read(src, 1 << 20):
            os.write(dst, chunk)


def _remove(pfd: int, name: str, st: os.stat_result | None) -> None:
    """Remove what ``name`` is (``st``: its ``lstat``, ``None`` when there is nothing)."""
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        datadir.remove_tree_at(pfd, name)  # by descriptors, no link followed, closed directories opened
    else:
        os.unlink(name, dir_fd=pfd)


def _mkdir(dest: Path, rel: str, source: Path) -> None:
    target = dest / rel
    target.mkdir(parents=True, exist_ok=True)
    st = os.stat(source, follow_symlinks=False)
    os.chmod(target, stat.S_IMODE(st.st_mode))
    if os.geteuid() == 0:
        os.chown(target, st.st_uid, st.st_gid)


def _copy_entry(source: Path, target: Path, st: Stamp) -> int:
    """Copy one file or link of the jail's tree into the layer, never following it; its size."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if st.kind == "symlink":
        assert st.target is not None
        os.symlink(st.target, target)
        if os.geteuid() == 0:
            src = os.stat(source, follow_symlinks=False)
            os.chown(target, src.st_uid, src.st_gid, follow_symlinks=False)
    else:
        pfd = os.open(target.parent, datadir.DIR_FLAGS)
        try:
            _copy_into(source, pfd, target.name, st.mode, owner=os.geteuid() == 0)
        finally:
            os.close(pfd)
    return st.size if st.kind == "file" else 0


def _made_or_changed(host: Path, st: Stamp) -> bool:
    """Whether the upper directory ``st`` is one the session made or changed (not a copy-up's)."""
    try:
        before = os.stat(host, follow_symlinks=False)
    except OSError:
        return True
    return not stat.S_ISDIR(before.st_mode) or stat.S_IMODE(before.st_mode) != st.mode


def _host_stamp(workspace: Path, rel: str) -> list[Any] | None:
    try:
        return Stamp.of(workspace / rel).values()
    except (FileNotFoundError, NotADirectoryError):
        return None


def host_changed(workspace: Path, delta: Delta) -> list[str]:
    """The delta's paths the host changed since the session found them (a restore would hide the host's edit)."""
    changed = []
    for rel, values in delta.host.items():
        now = _host_stamp(workspace, rel)
        if values is None or now is None:
            if (values is None) != (now is None):
                changed.append(rel)
            continue
        before, after = Stamp(*values), Stamp(*now)
        if before.kind != after.kind:  # an inode number is soon reused: the kind first
            changed.append(rel)
        elif before.kind == "dir":
            if (before.dev, before.ino) != (after.dev, after.ino):
                changed.append(rel)
        elif not before.same_version(after) or before.mtime_ns != after.mtime_ns:
            changed.append(rel)
    return sorted(changed)


def check_path(rel: str) -> str:
    """A delta's path as stored: relative, normalised, never leaving the tree."""
    parts = rel.split("/")
    if not rel or any(p in ("..", ".", "") for p in parts):
        raise InvalidArgument(f"a snapshot's path must stay inside the workspace: {rel!r}")
    return rel
