"""The apply's first stage: every selected change guarded against the host and planned as steps.

Before anything is touched, each change is checked against the host: the host entry must still be
the one that was copied in (or still absent). A change that fails goes to the
:class:`~sandbox.mounts.ApplyReport`'s ``conflicts``, with the changes that depend on it (the
entries of a directory that cannot be created; a directory that cannot be deleted because an entry
in it is not deleted); the rest become steps (:class:`Step`): a rename into place (``put``, a new
directory carrying its entries as :class:`Staged`), a ``delete`` or a ``chmod``, each naming its
hidden staged and backup names and the host fingerprint expected. Apart from
:mod:`sandbox.mounts.journal`, which writes these steps down and carries them out, because the
plan touches nothing: it reads the host and decides.
"""

from __future__ import annotations

import os
import stat
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from sandbox import datadir
from sandbox.errors import Conflict
from sandbox.mounts.changeset import ApplyReport, guard_entry
from sandbox.mounts.dirfds import lstat, open_dir
from sandbox.mounts.hostfs import SPECIAL_BITS

if TYPE_CHECKING:
    from sandbox.mounts.changeset import ApplyTarget, Change
    from sandbox.vocabulary import EntryKind as Kind

Op = Literal["put", "delete", "chmod"]


@dataclass
class Staged:
    """An entry of a new directory, staged inside it: ``rel`` is relative to the step's target."""

    rel: str
    kind: Kind
    mode: int
    source: str | None = None
    link: str | None = None


@dataclass
class Step:
    """One rename (or chmod) of the apply; ``paths`` are the changes it carries, for the report."""

    op: Op
    target: str
    kind: Kind
    mode: int | None = None
    expect: dict[str, Any] | None = None  # the host entry's fingerprint; None: the host has none
    staged: str | None = None
    backup: str | None = None
    old_mode: int | None = None
    link: str | None = None
    source: str | None = None
    entries: list[Staged] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)  # a replaced directory may hold only these
    paths: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        keys = ("op", "target", "kind", "mode", "expect", "staged", "backup", "old_mode", "link", "allowed")
        return {k: getattr(self, k) for k in keys}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Step:
        return cls(**data)

    @property
    def parent(self) -> str:
        return str(PurePosixPath(self.target).parent)

    @property
    def name(self) -> str:
        return PurePosixPath(self.target).name


def fingerprint(st: os.stat_result) -> dict[str, Any]:
    """What must not change between the guard and the rename: a directory's times move with its
    entries (our staged ones included), so a directory is identified by its inode only."""
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "other"
    found: dict[str, Any] = {"kind": kind, "dev": st.st_dev, "ino": st.st_ino}
    if kind != "dir":
        found["ctime_ns"] = st.st_ctime_ns
    return found


def _hidden(name: str, what: str) -> str:
    return f".{name}.sandbox-{what}-{uuid.uuid4().hex[:8]}"


class Plan:
    """Guard every change and turn the ones that pass into steps (see the module docstring)."""

    def __init__(self, tree: ApplyTarget) -> None:
        self.tree = tree
        self.steps: list[Step] = []
        self.report = ApplyReport()
        self.new_dirs: dict[str, tuple[Step, str]] = {}  # path -> (its step, path inside it)
        self.deleted: set[str] = set()
        self.failed: set[str] = set()

    def add(self, change: Change) -> None:
        try:
            self._add(change)
        except Conflict as exc:
            self.failed.add(change.path)
            self.report.conflicts.append({"path": change.path, "reason": exc.message})
        except OSError as exc:
            self.failed.add(change.path)
            self.report.conflicts.append({"path": change.path, "reason": f"cannot check the host entry: {exc}"})

    def _add(self, change: Change) -> None:
        parts = _checked_parts(change.path)
        if any(_is_under(change.path, bad) for bad in self.failed):
            raise Conflict("a directory above it was not applied")
        parent = "/".join(parts[:-1])
        if parent in self.new_dirs or (change.status != "deleted" and self._missing(parts[:-1])):
            self._inside_new_dir(change, parent)
            return
        with open_dir(self.tree.workspace, parts[:-1]) as pfd:
            guard_entry(self.tree, change, pfd, parts[-1])
            current = lstat(pfd, parts[-1])
            step = self._step(change, pfd, current)
        step.paths.append(change.path)
        self.steps.append(step)
        if step.op == "delete":
            self.deleted.add(change.path)
        elif step.kind == "dir" and step.op == "put":
            self.new_dirs[change.path] = (step, "")

    def _step(self, change: Change, pfd: int, current: os.stat_result | None) -> Step:
        name = PurePosixPath(change.path).name
        expect = fingerprint(current) if current is not None else None
        is_dir = current is not None and stat.S_ISDIR(current.st_mode)
        if change.status == "deleted":
            return Step(
                "delete",
                change.path,
                change.kind,
                expect=expect,
                backup=_hidden(name, "old"),
                allowed=self._only_deleted(change.path, pfd, name) if is_dir else [],
            )
        mode = _mode(change)
        if change.kind == "dir" and is_dir:
            assert current is not None
            return Step("chmod", change.path, "dir", mode, expect, old_mode=stat.S_IMODE(current.st_mode))
        step = Step("put", change.path, change.kind, mode, expect, staged=_hidden(name, "new"))
        step.link, step.source = change.target, _source(self.tree.root, change.path)
        if current is not None:
            step.backup = _hidden(name, "old")
            step.allowed = self._only_deleted(change.path, pfd, name) if is_dir else []
        return step

    def _only_deleted(self, path: str, pfd: int, name: str) -> list[str]:
        """The names in a host directory about to go: all must be deletions planned already."""
        fd = os.open(name, datadir.DIR_FLAGS, dir_fd=pfd)
        try:
            names = os.listdir(fd)
        finally:
            os.close(fd)
        kept = sorted(n for n in names if f"{path}/{n}" not in self.deleted)
        if kept:
            raise Conflict(f"the host directory holds entries this apply does not delete: {', '.join(kept[:5])}")
        return names

    def _missing(self, parts: tuple[str, ...]) -> bool:
        """Whether the parent directory is missing on the host (a non-directory is a conflict)."""
        path = self.tree.workspace
        for part in parts:
            path = path / part
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                return True
            if not stat.S_ISDIR(mode):
                raise Conflict(f"parent {part!r} is not a directory inside the workspace")
        return False

    def _inside_new_dir(self, change: Change, parent: str) -> None:
        if change.status == "deleted":
            raise Conflict("its directory is new")
        if parent not in self.new_dirs:
            self._make_parents(PurePosixPath(parent).parts)
        step, inside = self.new_dirs[parent]
        rel = f"{inside}/{PurePosixPath(change.path).name}" if inside else PurePosixPath(change.path).name
        source = _source(self.tree.root, change.path)
        step.entries.append(Staged(rel, change.kind, _mode(change), source, change.target))
        step.paths.append(change.path)
        if change.kind == "dir":
            self.new_dirs[change.path] = (step, rel)

    def _make_parents(self, parts: tuple[str, ...]) -> None:
        """Directories a selected change needs that the selection does not create: 0755, as a mkdir -p."""
        for depth in range(1, len(parts) + 1):
            path = "/".join(parts[:depth])
            if path in self.new_dirs or not self._missing(parts[:depth]):
                continue
            parent = "/".join(parts[: depth - 1])
            if parent in self.new_dirs:
                step, inside = self.new_dirs[parent]
                rel = f"{inside}/{parts[depth - 1]}" if inside else parts[depth - 1]
                step.entries.append(Staged(rel, "dir", 0o755))
                self.new_dirs[path] = (step, rel)
            else:
                step = Step("put", path, "dir", 0o755, staged=_hidden(parts[depth - 1], "new"))
                self.steps.append(step)
                self.new_dirs[path] = (step, "")


def _mode(change: Change) -> int:
    default = 0o755 if change.kind == "dir" else 0o644
    return (change.mode_after if change.mode_after is not None else default) & ~SPECIAL_BITS


def _checked_parts(path: str) -> tuple[str, ...]:
    parts = PurePosixPath(path).parts
    if not parts or any(p in ("", ".", "..") for p in parts) or PurePosixPath(path).is_absolute():
        raise Conflict("not a relative path inside the workspace", path=path)
    return parts


def _is_under(path: str, root: str) -> bool:
    return path.startswith(f"{root}/")


def _source(root: Path, rel: str) -> str:
    """``root/./rel``: where our tree ends and the jail's names begin (rsync ``-R``'s mark)."""
    return f"{root}/./{rel}"
