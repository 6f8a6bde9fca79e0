"""The guarded apply of a ``copy`` changeset on Windows (the winjob backend's half of
:meth:`sandbox.mounts.ApplyTarget.apply`).

The same promises as on POSIX, kept by Windows' means:

- **Paths read by Windows' rules** (:mod:`sandbox.mounts.winpaths`): a change whose path
  holds a ``\\``, a drive, a ``:`` (an alternate data stream), a reserved device name or a
  trailing dot or space is refused with CONFLICT, and so are changes whose paths differ only by
  case (one file on Windows). A case-only rename (``README`` deleted, ``readme`` added) is
  allowed: the addition finds the very file the deletion removes.
- **Guarded**: every selected change is checked against the host entry recorded at copy-in
  (volume, file index, size, mtime) before anything is written, and again once everything is
  staged; a host entry changed meanwhile refuses the whole apply, nothing applied.
- **No link followed**: every directory on the way to a target must be a real directory, not a
  symlink, junction or other reparse point; a symlink change is skipped (creating one needs a
  privilege on Windows), a special entry never leaves the jail.
- **Staged, then renamed**: each file's new content is written (main stream only) and fsynced in
  a hidden staging directory at the workspace's root (``.sandbox-apply-<hex>``: same volume, so
  each ``os.replace`` is one atomic ``MoveFileEx``), then renamed into place.
- **One apply at a time** per workspace: a lock file in the data directory, ``msvcrt.locking``.

What POSIX has and this has not (a known limit, said in ``sandbox check``'s table): no crash
journal. An apply killed while renaming leaves some files new and the rest old, each file whole,
and its staging directory behind; on POSIX :mod:`sandbox.mounts.journal` would finish it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import sys
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox import datadir
from sandbox.errors import Conflict, map_errors
from sandbox.mounts import winpaths
from sandbox.mounts.changeset import ApplyReport, selected
from sandbox.mounts.hostfs import copy_file_bytes
from sandbox.mounts.stamps import Stamp

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from sandbox.mounts.changeset import ApplyTarget, Change, Changeset

STAGING_PREFIX = ".sandbox-apply-"


@dataclass
class Step:
    change: Change
    target: Path
    current: Stamp | None  # the host entry the guard passed (None: absent)
    twin: Stamp | None = None  # a case-only rename's: the entry its deletion removes first
    staged: Path | None = None


def apply(tree: ApplyTarget, changeset: Changeset, only: set[str] | None, include_flagged: bool) -> ApplyReport:
    """Guard, stage and rename the selected changes of ``changeset`` into ``tree.workspace``."""
    report = ApplyReport()
    chosen = selected(changeset, only, include_flagged, report)
    with locked(tree.workspace):
        steps = Planner(tree, report).plan(chosen)
        if steps:
            execute(tree, steps, report)
    return report


class Planner:
    """Each change checked (path, parents, guard) and turned into a :class:`Step`, or a conflict."""

    def __init__(self, tree: ApplyTarget, report: ApplyReport) -> None:
        self.tree = tree
        self.report = report
        self.failed: list[str] = []  # folded paths: what lies below them is not applied either
        self.deleted: dict[str, Stamp] = {}  # folded path -> the host entry a planned deletion removes
        self.made: set[str] = set()  # folded paths of directories this apply creates

    def plan(self, chosen: list[Change]) -> list[Step]:
        collisions = winpaths.case_collisions(
            c.path for c in chosen if c.status != "deleted" or c.path not in self._deleted_twins(chosen)
        )
        steps = []
        for change in chosen:
            try:
                if change.path in collisions:
                    raise Conflict("another change names the same file but for case (one file on Windows)")
                step = self._step(change)
            except Conflict as exc:
                self.failed.append(winpaths.fold(change.path))
                self.report.conflicts.append({"path": change.path, "reason": exc.message})
                continue
            except OSError as exc:
                self.failed.append(winpaths.fold(change.path))
                self.report.conflicts.append({"path": change.path, "reason": f"cannot check the host entry: {exc}"})
                continue
            if step is not None:
                steps.append(step)
        return steps

    @staticmethod
    def _deleted_twins(chosen: list[Change]) -> set[str]:
        """Deletions whose path another (added) change repeats but for case: a case-only rename."""
        added = {winpaths.fold(c.path): c.path for c in chosen if c.status != "deleted"}
        return {c.path for c in chosen if c.status == "deleted" and added.get(winpaths.fold(c.path), c.path) != c.path}

    def _step(self, change: Change) -> Step | None:
        parts = winpaths.checked_parts(change.path, "windows")
        folded = winpaths.fold(change.path)
        if any(folded.startswith(f"{bad}/") for bad in self.failed):
            raise Conflict("a directory above it was not applied")
        if change.kind == "symlink":
            self.report.skipped.append({"path": change.path, "reason": "symlinks are not applied on Windows"})
            return None
        workspace = self.tree.workspace
        if not self._parents_ok(workspace, parts[:-1], creating=change.status != "deleted"):
            raise Conflict("its directory is gone from the host")
        target = workspace.joinpath(*parts)
        current = _lstamp(target)
        twin = self.deleted.get(folded) if change.status != "deleted" else None
        if current is not None and twin is not None and twin.same_version(current):
            current = None  # a case-only rename: the deletion planned before removes this very entry
        else:
            twin = None
        self.tree.guard_stamp(change, current)
        if current is not None and current.kind == "dir" and (change.status == "deleted" or change.kind != "dir"):
            self._only_deleted(change.path, target)  # it goes (or becomes a file): nothing may stay in it
        if change.status == "deleted" and current is not None:
            self.deleted[folded] = current
        elif change.kind == "dir":
            self.made.add(folded)
        return Step(change, target, current, twin)

    def _parents_ok(self, workspace: Path, parents: tuple[str, ...], *, creating: bool) -> bool:
        """Every existing directory on the way is a real one (no link, junction or reparse point);
        a missing one is fine for an addition (made as ``mkdir -p`` would), else the change fails."""
        path = workspace
        for depth, part in enumerate(parents, 1):
            path = path / part
            current = _lstamp(path)
            if current is None:
                rel = winpaths.fold("/".join(parents[:depth]))
                return creating or rel in self.made
            if current.kind != "dir":
                raise Conflict(f"parent {part!r} is not a directory inside the workspace")
        return True

    def _only_deleted(self, path: str, target: Path) -> None:
        gone = {winpaths.fold(p) for p in self.deleted}
        kept = sorted(n for n in os.listdir(target) if winpaths.fold(f"{path}/{n}") not in gone)
        if kept:
            raise Conflict(f"the host directory holds entries this apply does not delete: {', '.join(kept[:5])}")


def _lstamp(path: Path) -> Stamp | None:
    try:
        return Stamp.of(path)
    except FileNotFoundError:
        return None


def execute(tree: ApplyTarget, steps: list[Step], report: ApplyReport) -> None:
    """Stage every new file, check every guard again, then rename (see the module docstring)."""
    staging = tree.workspace / f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}"
    with map_errors("cannot stage the changes in the workspace"):
        staging.mkdir(mode=0o700)
    try:
        with map_errors("cannot stage the changes in the workspace"):
            for number, step in enumerate(steps):
                if step.change.status != "deleted" and step.change.kind == "file":
                    step.staged = staging / f"new-{number}"
                    copy_file_bytes(tree.root / step.change.path, step.staged)
        if changed := [s.change.path for s in steps if not _unchanged(s)]:
            conflicts = [{"path": p, "reason": "the host entry changed during the apply"} for p in changed]
            raise Conflict("the host changed during the apply; nothing applied", conflicts=conflicts)
        for number, step in enumerate(steps):
            try:
                _perform(step, staging / f"old-{number}")
            except OSError as exc:
                report.conflicts.append({"path": step.change.path, "reason": f"not applied: {exc}"})
            else:
                report.applied.append(step.change.path)
    finally:
        _remove(staging)


def _unchanged(step: Step) -> bool:
    now = _lstamp(step.target)
    expected = step.current or step.twin  # a case-only rename's addition still finds its twin
    if expected is None or now is None:
        return expected is None and now is None
    return expected.same_version(now)


def _perform(step: Step, backup: Path) -> None:
    change, target = step.change, step.target
    if change.status == "deleted":
        if step.current is None:
            return
        if step.current.kind == "dir":
            os.rmdir(target)
        else:
            _writable(target)
            os.replace(target, backup)
        return
    if step.current is not None and step.current.kind != change.kind:  # a file became a directory, or back
        if step.current.kind == "dir":
            os.rmdir(target)  # its entries' deletions went first
        else:
            _writable(target)
            os.replace(target, backup)
    if change.kind == "dir":
        target.mkdir(parents=True, exist_ok=True)
        return
    assert step.staged is not None
    target.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(target):
        _writable(target)
    os.replace(step.staged, target)
    if change.mode_after is not None:
        os.chmod(target, stat.S_IMODE(change.mode_after))  # Windows keeps only the read-only bit of it


def _writable(path: Path) -> None:
    """A read-only file can be neither replaced nor removed on Windows."""
    mode = os.lstat(path).st_mode
    if not mode & stat.S_IWRITE:
        os.chmod(path, stat.S_IMODE(mode) | stat.S_IWRITE)


def _remove(staging: Path) -> None:
    for dirpath, _dirs, files in os.walk(staging):
        for name in files:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(dirpath, name), stat.S_IWRITE | stat.S_IREAD)
    shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def locked(workspace: Path) -> Iterator[None]:
    """One apply to ``workspace`` at a time: a byte lock on a file named for it in the data directory."""
    key = hashlib.sha256(str(workspace.resolve()).lower().encode()).hexdigest()[:24]
    path = datadir.subdir("journal") / f"{key}.lock"
    with map_errors(f"cannot lock the workspace {workspace}"):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if sys.platform == "win32":
            import msvcrt

            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            except OSError:
                raise Conflict(f"another apply to {workspace} is running", workspace=str(workspace)) from None
        yield
    finally:
        os.close(fd)  # closing the file releases its byte lock
