"""Keeping a changeset: the changed entries of a private tree copied (or moved) into the store,
within the store's cap, and the work of a killed executor recovered the same way.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from sandbox import datadir, owners
from sandbox.errors import Conflict, ToolFailed, map_errors
from sandbox.mounts import gitreview
from sandbox.mounts.stamps import WINDOWS, open_unfollowed
from sandbox.mounts.trees import CopyTree, OverlayTree
from sandbox.threads import off_loop

if sys.platform != "win32":
    import fcntl

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandbox.mounts.changeset import Change, Changeset
    from sandbox.vocabulary import ChangesetSource
from sandbox.mounts.kept import STORE_LIMIT, Entry, Kept, Pruned, has_content, remove_tree_dir, store, write_manifest
from sandbox.mounts.store import all_kept, pruned_entry, remove_unless_busy, sweep

CHUNK = 1 << 20


async def keep(
    tree: CopyTree,
    changeset: Changeset,
    *,
    source: ChangesetSource,
    profile: str,
    backend: str,
    limit: int = STORE_LIMIT,
    environment: Sequence[str] = (),
    giving_up: bool = False,
) -> Kept:
    """Keep ``changeset`` (read from ``tree``, still present) under a new id; returns it.

    ``giving_up``: the caller removes ``tree`` right after, nothing running in it (``sandbox
    run``): its files are moved into the store instead of copied (a file with other links is
    still copied), so a keep costs a rename per file, not a copy.

    ``limit`` bounds every kept changeset's content together (``limits.kept_changes``): a keep
    that would pass it is refused whole with TOOL_FAILED (``errno`` ENOSPC), and nothing is kept.
    """
    return await off_loop(_keep, tree, changeset, source, profile, backend, limit, tuple(environment), giving_up)


def recover(root: Path) -> Kept | None:
    """Keep the work in ``root``, the private copy of an executor that is gone (killed), as a
    changeset of source ``recovered``; ``None`` when there is none to keep (no baseline was saved:
    no jail ran on it; nothing changed; another sweeper holds it). The copy is left for the caller
    to remove. Its files are moved, as ``sandbox run`` does: nothing runs in it any more."""
    if WINDOWS:
        return None
    baseline = CopyTree.baseline_file(root)
    try:
        fd = os.open(baseline, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # one sweeper at a time (gc, a session opening)
        except BlockingIOError:
            return None
        tree = CopyTree.recovered(root)
        if tree is None or not root.is_dir() or not os.path.exists(baseline):
            return None  # removed by a sweeper that held it before us
        changeset = tree._untracked_out(tree._changes())
        if not changeset.changes:
            return None
        env = tree.environment
        return _keep(tree, changeset, "recovered", "(unknown)", "(unknown)", STORE_LIMIT, env, giving_up=True)
    finally:
        os.close(fd)


def _keep(
    tree: CopyTree,
    changeset: Changeset,
    source: ChangesetSource,
    profile: str,
    backend: str,
    limit: int,
    environment: tuple[str, ...] = (),
    giving_up: bool = False,
) -> Kept:
    sweep()
    budget = _Budget.of_store(limit, changeset)
    changeset_id = f"ch-{uuid.uuid4().hex[:12]}"
    partial = store() / f".partial-{owners.owner_tag()}-{changeset_id[3:]}"
    created = datetime.now(UTC)
    with map_errors(f"cannot keep the changeset in {store()}"):
        partial.mkdir(mode=0o700)
        try:
            (partial / "tree").mkdir(mode=0o700)
            with _SourceDirs(tree, giving_up=giving_up) as sources:
                entries = [_keep_entry(sources, partial / "tree", change, budget) for change in changeset.changes]
            git = gitreview.summarise(tree.workspace, partial / "tree", [e.change for e in entries])
            kept = Kept(
                changeset_id,
                tree.workspace,
                created,
                source,
                profile,
                backend,
                entries,
                untracked=changeset.untracked,
                git=git,
                environment=list(environment),
                pruned=budget.pruned,
            )
            write_manifest(partial, kept)
            os.rename(partial, store() / changeset_id)
        except BaseException:
            remove_tree_dir(partial)
            raise
    return kept


@dataclass
class _Budget:
    """What the store may still take of one keep, so the data directory never fills past ``limit``."""

    limit: int
    used: int
    left: int

    pruned: list[Pruned] = field(default_factory=list)

    @classmethod
    def of_store(cls, limit: int, changeset: Changeset) -> _Budget:
        needed = sum(c.size or 0 for c in changeset.changes if has_content(c) and c.applicable)
        used = _store_bytes()  # a walk of the whole store: once a keep
        pruned = _make_room(limit, needed, used) if needed <= limit else []
        used -= sum(p.bytes for p in pruned)
        budget = cls(limit, used, limit - used, pruned)
        budget.take(needed)
        budget.left = limit - used  # the copy takes it again, byte by byte, as it writes
        return budget

    def take(self, size: int) -> None:
        if size > self.left:
            raise ToolFailed(
                f"the changeset is not kept: with it, kept changesets would pass limits.kept_changes "
                f"({self.limit} bytes; {self.used} already kept). Apply or discard kept changesets "
                "(sandbox changes), or raise the limit",
                errno="ENOSPC",
                limit=self.limit,
                used=self.used,
                needed=size,
                bound="limits.kept_changes",
            )
        self.left -= size


def _store_bytes() -> int:
    """The bytes of every file in the store: kept changesets and keeps under way."""
    return datadir.tree_bytes(store())


def _make_room(limit: int, needed: int, used: int) -> list[Pruned]:
    """Prune until ``needed`` more bytes fit under ``limit``: applied changesets first, then the
    oldest kept ones (a new changeset is worth more than one two weeks old nobody looked at).
    ``used``: the store's bytes now."""
    pruned: list[Pruned] = []
    if used + needed <= limit:
        return pruned
    ranked = sorted(all_kept(), key=lambda k: (k.state != "applied", k.created))
    for kept in ranked:
        found = pruned_entry(
            kept, "applied; the store was full" if kept.state == "applied" else "oldest; the store was full"
        )
        if remove_unless_busy(kept.path):
            pruned.append(found)
            used -= found.bytes
        if used + needed <= limit:
            break
    return pruned


def _keep_entry(sources: _SourceDirs, kept_root: Path, change: Change, budget: _Budget) -> Entry:
    entry = Entry(replace(change, flags=list(change.flags)), sources.host.get(change.path))
    if not (has_content(change) and change.applicable):
        return entry
    try:
        digest = _copy_out(sources, kept_root, change.path, budget)
    except (OSError, Conflict) as exc:
        reason = exc.message if isinstance(exc, Conflict) else exc.strerror or str(exc)
        entry.change.applicable, entry.change.reason = False, f"could not be kept: {reason}"
        return entry
    if change.sha256 is not None and digest != change.sha256:
        raise Conflict(f"{change.path} changed in the private tree after its changeset was read", path=change.path)
    entry.change.sha256 = digest
    return entry


def _copy_out(sources: _SourceDirs, kept_root: Path, rel: str, budget: _Budget) -> str:
    """Copy the private tree's file ``rel`` (no link followed) to ``kept_root/rel``; its hash."""
    parts = PurePosixPath(rel).parts
    target = kept_root.joinpath(*parts)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    digest = hashlib.sha256()
    taken = sources.take(parts, target)
    if taken is not None:
        return _hash(taken, digest, budget)
    src = sources.open(parts)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise OSError(0, "no longer a regular file")
        dst = os.open(target, _new_file_flags(), 0o600)
        try:
            while chunk := os.read(src, CHUNK):
                budget.take(len(chunk))  # the file may have grown since its changeset was read
                digest.update(chunk)
                os.write(dst, chunk)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    return digest.hexdigest()


def _hash(fd: int, digest: Any, budget: _Budget) -> str:
    """The SHA-256 of the file open as ``fd`` (closed here), counted against the store's budget."""
    try:
        while chunk := os.read(fd, CHUNK):
            budget.take(len(chunk))
            digest.update(chunk)
    finally:
        os.close(fd)
    return str(digest.hexdigest())


class _SourceDirs:
    """The private tree's files, each opened without following a link at any component (POSIX: a
    directory fd at a time). The directory fds along the last file's path are kept for the next
    (a changeset lists a directory's files together): a keep of 2,000 files in a deep ``.venv``
    opens each directory once, not each component of each file's path again.

    ``giving_up``: the tree is removed right after the keep (``sandbox run``: its call is over, its
    tree killed): a file is moved into the store rather than copied (:meth:`take`)."""

    def __init__(self, tree: CopyTree, *, giving_up: bool = False) -> None:
        self.root, self.host = tree.root, tree.host
        self.giving_up = giving_up and not WINDOWS and not isinstance(tree, OverlayTree)
        self._names: list[str] = []
        self._fds: list[int] = []

    def take(self, parts: tuple[str, ...], target: Path) -> int | None:
        """Move the file ``parts`` to ``target`` in the store and return an fd of it there (ours,
        ``0600``); ``None`` when it must be copied instead: the tree is kept, the file has other
        links (one of them could still change it), another filesystem, or not ours to make private."""
        if not self.giving_up:
            return None
        pfd = self._parent(parts[:-1])
        try:
            st = os.stat(parts[-1], dir_fd=pfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                return None
            if st.st_uid != os.geteuid() and os.geteuid() != 0:
                return None  # not ours to make private (a rootless engine's subordinate uid)
            os.rename(parts[-1], target, src_dir_fd=pfd)
        except OSError:
            return None  # EXDEV, a vanished file: the copy says what is wrong
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise OSError(0, "it gained another link while it was kept")
            if st.st_uid != os.geteuid():
                os.fchown(fd, os.geteuid(), os.getegid())  # root: a Docker jail's file becomes ours
            os.fchmod(fd, 0o600)
        except OSError:
            os.close(fd)
            raise
        return fd

    def open(self, parts: tuple[str, ...]) -> int:
        """An fd of the file ``parts``, read-only."""
        if WINDOWS:
            return _open_windows_source(self.root, parts)
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._parent(parts[:-1]))

    def _parent(self, parts: tuple[str, ...]) -> int:
        if not self._fds:
            self._fds.append(os.open(self.root, datadir.DIR_FLAGS))
        common = 0
        while common < min(len(parts), len(self._names)) and parts[common] == self._names[common]:
            common += 1
        for fd in self._fds[common + 1 :]:
            os.close(fd)
        del self._fds[common + 1 :], self._names[common:]
        for part in parts[common:]:
            try:
                fd = os.open(part, datadir.DIR_FLAGS, dir_fd=self._fds[-1])
            except OSError as exc:
                raise Conflict(f"parent {part!r} is not a directory inside the private tree") from exc
            self._fds.append(fd)
            self._names.append(part)
        return self._fds[-1]

    def __enter__(self) -> _SourceDirs:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        self._names.clear()


def _open_windows_source(root: Path, parts: tuple[str, ...]) -> int:
    path = root
    for part in parts[:-1]:
        path = path / part
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or getattr(st, "st_file_attributes", 0) & 0x400:
            raise Conflict(f"parent {part!r} is not a directory inside the private tree")
    return open_unfollowed(path / parts[-1])


def _new_file_flags() -> int:
    if WINDOWS:
        return os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    return os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
