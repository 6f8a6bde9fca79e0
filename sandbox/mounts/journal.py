"""The journalled apply: a changeset reaches the host workspace entirely or not at all.

Applying file by file, each file atomic, is not enough: an apply killed half-way leaves some
files new and the rest old, a state nobody reviewed and nothing can finish or undo. So the apply
goes in four stages around a journal in the data directory (``journal/<key>.json``, one per
workspace):

1. **Plan and guard.** Every selected change is checked against the host before anything is
   touched: the host entry must still be the one that was copied in (or still absent). A change
   that fails is reported in the :class:`~sandbox.mounts.ApplyReport`'s ``conflicts``, with the
   changes that depend on it (the entries of a directory that cannot be created; a directory
   that cannot be deleted because an entry in it is not deleted); the rest are applied as a unit.
2. **Prepare.** The journal is written and fsynced, naming for each step its target, the staged
   name and the backup name (both hidden names in the target's own directory, so every later
   move is a ``rename`` within one directory) and the host fingerprint expected. Then every new
   file and symlink is staged under its hidden name and fsynced; a new directory is staged whole,
   its entries inside it. Nothing the workspace had is touched yet, so a crash here leaves only
   staged files, which recovery removes: the host is the old tree, fingerprints included, and the
   same apply can be tried again. The guard is checked once more, and a host entry that changed
   meanwhile refuses the whole apply with CONFLICT, nothing applied.
3. **Commit.** The journal is rewritten with ``state: commit`` (temp file, fsync, rename, fsync of
   its directory). This write is the *commit point*: from here on the apply is rolled forward.
4. **Perform.** Step by step, a replaced or deleted entry is renamed to its backup name and the
   staged one renamed into place (a mode change of a directory is a ``chmod``); directories are
   fsynced; backups and the journal are removed. Deletions go first, deepest first, so a
   directory that goes (or becomes a file) holds only its entries' backups when it is renamed
   to its own, and its backup takes them along.

:func:`recover` finishes an apply found interrupted: before the commit point it removes the
staged names (roll back), after it it redoes the steps not yet done (roll forward: each step
shows by its names whether it was done) and removes the backups. Either way the host is entirely
the old tree or entirely the new one, without a hidden name left. Every apply runs it first, and
so should every command about to use a workspace. One case is not all or nothing, by design: a
host entry replaced by another (another inode) between the commit point and its rename keeps the
host's entry, and that step is reported as a conflict rather than clobber what the user just
wrote. An I/O error after the commit point leaves the journal for the next command to finish.

Both hold an exclusive ``flock`` on the workspace directory, so two executors never apply to
(or recover) one workspace at once.

Stage 1 is :mod:`sandbox.mounts.applyplan` (its :class:`~sandbox.mounts.applyplan.Plan` makes the
steps this module carries out); every directory is opened as in :mod:`sandbox.mounts.dirfds`.

``SANDBOX_JOURNAL_CRASH_AFTER=N`` is a test hook, read once at import: the process kills itself
with SIGKILL after its N-th durable operation (a journal write, a staged entry, a rename, a
removal), so tests can crash an apply at every point deterministically.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
import sys
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from sandbox import datadir
from sandbox.errors import Conflict, ToolFailed, map_errors
from sandbox.mounts.applyplan import Step, fingerprint
from sandbox.mounts.dirfds import Dirs, fchmod_dir, lstat, open_dir
from sandbox.mounts.hostfs import owner_for
from sandbox.mounts.stamps import CHUNK

if sys.platform != "win32":  # the journal is POSIX code; Windows applies through sandbox.mounts.winapply
    import fcntl

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sandbox.mounts.applyplan import Staged
    from sandbox.vocabulary import EntryKind as Kind

State = Literal["prepare", "commit"]
FORMAT = 1
CRASH_ENV = "SANDBOX_JOURNAL_CRASH_AFTER"


class _CrashHook:
    """The test hook: SIGKILL after the N-th durable operation (off unless the variable is set)."""

    def __init__(self, value: str | None) -> None:
        self.after = int(value) if value else 0
        self.count = 0

    def tick(self) -> None:
        self.count += 1
        if self.after and self.count >= self.after:
            os.kill(os.getpid(), signal.SIGKILL)


_hook = _CrashHook(os.environ.get(CRASH_ENV))


# -- the journal file -------------------------------------------------------------------------


def journal_path(workspace: Path) -> Path:
    key = hashlib.sha256(str(workspace.resolve()).encode()).hexdigest()[:24]
    return datadir.subdir("journal") / f"{key}.json"


def _write_journal(path: Path, workspace: Path, state: State, steps: list[Step]) -> None:
    body = {"format": FORMAT, "workspace": str(workspace.resolve()), "state": state}
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({**body, "steps": [s.to_dict() for s in steps]}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    _hook.tick()


def _read_journal(path: Path) -> tuple[State, list[Step]]:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    return data["state"], [Step.from_dict(s) for s in data["steps"]]


def _remove_journal(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    _fsync_dir(path.parent)
    _hook.tick()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, datadir.DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(workspace: Path) -> Iterator[None]:
    """One executor at a time applies to (or recovers) a workspace: an flock on its directory."""
    with map_errors(f"cannot lock the workspace {workspace}"):
        fd = os.open(workspace, datadir.DIR_FLAGS)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _remove_any(pfd: int, name: str) -> None:
    st = lstat(pfd, name)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        datadir.remove_tree_at(pfd, name)
    else:
        os.unlink(name, dir_fd=pfd)
    _hook.tick()


# -- staging ----------------------------------------------------------------------------------


def _stage(dirs: Dirs, step: Step) -> None:
    pfd = dirs.get(step.parent)
    if pfd is None or step.staged is None:
        raise Conflict("its directory is gone", path=step.target)
    owner = owner_for(pfd, step.name)
    _make(pfd, step.staged, step.kind, step.mode or 0, step.source, step.link, owner)
    if step.kind == "dir":
        with open_dir(pfd, [step.staged]) as top:
            for entry in step.entries:
                inner = PurePosixPath(entry.rel)
                with open_dir(top, inner.parent.parts) as efd:
                    _make(efd, inner.name, entry.kind, entry.mode, entry.source, entry.link, owner)
            _seal(top, step.entries)
        fchmod_dir(pfd, step.staged, step.mode or 0)


def _make(
    pfd: int, name: str, kind: Kind, mode: int, source: str | None, link: str | None, owner: tuple[int, int] | None
) -> None:
    if kind == "dir":
        os.mkdir(name, 0o700, dir_fd=pfd)
    elif kind == "symlink":
        os.symlink(link or "", name, dir_fd=pfd)
    else:
        _copy_file(pfd, name, source or "", mode)  # a str: a Path would drop the plan's /./ mark
    _hook.tick()
    if owner is not None:
        os.chown(name, *owner, dir_fd=pfd, follow_symlinks=False)


def _seal(top: int, entries: list[Staged]) -> None:
    """A staged directory's own directories: their modes set (deepest first, once filled) and
    fsynced, so their entries survive a power cut too."""
    for entry in sorted((e for e in entries if e.kind == "dir"), key=lambda e: -e.rel.count("/")):
        with open_dir(top, PurePosixPath(entry.rel).parts) as fd:
            os.fsync(fd)
            os.fchmod(fd, entry.mode)
    os.fsync(top)


def _open_source(source: str) -> int:
    """The file a change copies, no link followed below the tree's root: a warm jail may swap a
    directory of its tree for a link to a host file between the review and the apply."""
    root, mark, rel = source.partition("/./")
    if not mark:
        return os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    parts = PurePosixPath(rel).parts
    with open_dir(Path(root), parts[:-1]) as pfd:
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)


def _copy_file(pfd: int, name: str, source: str, mode: int) -> None:
    src = _open_source(source)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise ToolFailed(f"the changed entry {source} is no longer a regular file")
        dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=pfd)
        try:
            while chunk := os.read(src, CHUNK):
                os.write(dst, chunk)
            os.fchmod(dst, mode)
            os.fsync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _recheck(dirs: Dirs, steps: list[Step]) -> list[dict[str, str]]:
    """The guard once more, after staging: whatever changed meanwhile."""
    changed = []
    for step in steps:
        pfd = dirs.get(step.parent)
        current = lstat(pfd, step.name) if pfd is not None else None
        if pfd is None or not _as_expected(pfd, step, current):
            changed.append({"path": step.target, "reason": "the host entry changed during the apply"})
    return changed


def _as_expected(pfd: int, step: Step, current: os.stat_result | None, *, strict: bool = True) -> bool:
    """``current`` is the entry the guard passed and, for a directory, holds only what may go.

    Not ``strict`` (after the commit point), the ctime is not compared: renaming one of two hard
    links to its backup moves the other's ctime, and the guard itself passed before the commit.
    """
    if current is None or step.expect is None:
        return current is None and step.expect is None
    found = fingerprint(current)
    keys = found.keys() | step.expect.keys() if strict else ("kind", "dev", "ino")
    if any(found.get(k) != step.expect.get(k) for k in keys):
        return False
    if step.op == "chmod" or not stat.S_ISDIR(current.st_mode):
        return True
    fd = os.open(step.name, datadir.DIR_FLAGS, dir_fd=pfd)
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    backups = {s for s in names if ".sandbox-old-" in s}
    return set(names) - backups <= set(step.allowed)


# -- perform, roll forward, roll back ---------------------------------------------------------


def _forward(dirs: Dirs, step: Step) -> str:
    """Do ``step`` unless it is done; ``""``, or why the host's entry was kept instead."""
    pfd = dirs.get(step.parent)
    if pfd is None:
        return "" if step.op == "delete" else "its directory is gone"
    if step.op == "chmod":
        return _chmod(pfd, step)
    if step.op == "put" and (step.staged is None or lstat(pfd, step.staged) is None):
        return ""  # renamed into place already
    current = lstat(pfd, step.name)
    if current is not None and (step.backup is None or lstat(pfd, step.backup) is None):
        if not _as_expected(pfd, step, current, strict=False):
            if step.staged is not None:
                _remove_any(pfd, step.staged)
            return "the host entry changed after the commit point; the host's was kept"
        if step.backup is not None:
            os.rename(step.name, step.backup, src_dir_fd=pfd, dst_dir_fd=pfd)
            _hook.tick()
    if step.op == "put" and step.staged is not None:
        os.rename(step.staged, step.name, src_dir_fd=pfd, dst_dir_fd=pfd)
        _hook.tick()
    return ""


def _chmod(pfd: int, step: Step) -> str:
    current = lstat(pfd, step.name)
    if current is None or fingerprint(current) != step.expect:
        return "the host directory changed after the commit point"
    fchmod_dir(pfd, step.name, step.mode or 0)
    return ""


def _clean(dirs: Dirs, steps: list[Step]) -> None:
    for step in steps:
        pfd = dirs.get(step.parent)
        if pfd is not None and step.backup is not None:
            _remove_any(pfd, step.backup)


def _unstage(dirs: Dirs, steps: list[Step]) -> None:
    for step in steps:
        pfd = dirs.get(step.parent)
        if pfd is not None and step.staged is not None:
            _remove_any(pfd, step.staged)


def _roll_forward(workspace: Path, steps: list[Step]) -> list[dict[str, str]]:
    problems: list[dict[str, str]] = []
    with Dirs(workspace) as dirs:
        for step in steps:
            if reason := _forward(dirs, step):
                problems.extend({"path": p, "reason": reason} for p in step.paths or [step.target])
        dirs.sync()
        _clean(dirs, steps)
    return problems


def _roll_back(workspace: Path, steps: list[Step]) -> None:
    with Dirs(workspace) as dirs:
        _unstage(dirs, steps)
        dirs.sync()


# -- the public calls -------------------------------------------------------------------------


def execute(workspace: Path, steps: list[Step]) -> list[dict[str, str]]:
    """Apply the planned ``steps`` as a unit (the caller holds :func:`locked`).

    Returns the steps kept back after the commit point (their host entry changed in between).
    Raises CONFLICT, nothing applied, when a host entry changed before it.
    """
    if not steps:
        return []
    journal = journal_path(workspace)
    with map_errors("cannot write the apply's journal"):
        _write_journal(journal, workspace, "prepare", steps)
    try:
        with map_errors("cannot stage the changes in the workspace"), Dirs(workspace) as dirs:
            for step in steps:
                if step.op == "put":
                    _stage(dirs, step)
            dirs.sync()
            if changed := _recheck(dirs, steps):
                raise Conflict("the host changed during the apply; nothing applied", conflicts=changed)
            _write_journal(journal, workspace, "commit", steps)
    except BaseException:
        _undo(journal, workspace, steps)
        raise
    with map_errors("the apply stopped after its commit point; the next sandbox command finishes it"):
        problems = _roll_forward(workspace, steps)
        _remove_journal(journal)
    return problems


def _undo(journal: Path, workspace: Path, steps: list[Step]) -> None:
    """Before the commit point: remove what was staged; should that fail too, the journal stays
    and the next command's :func:`recover` tries again."""
    with contextlib.suppress(OSError):
        _roll_back(workspace, steps)
        _remove_journal(journal)


@dataclass
class RecoverReport:
    """What :func:`recover` found and did; ``action`` is ``none``, ``rolled-back`` or ``rolled-forward``."""

    workspace: str
    action: Literal["none", "rolled-back", "rolled-forward"] = "none"
    steps: int = 0
    problems: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def recover(workspace: Path) -> RecoverReport:
    """Finish or undo an apply to ``workspace`` that was interrupted (a no-op when none was).

    Every jail open calls this, so the common case (no journal, nothing torn) takes no lock: a
    ``stat`` and a directory listing, and a command that holds an flock on the workspace (it
    can: the jail shows the same directory) cannot stall the next open.
    """
    journal = journal_path(workspace)
    if not journal.exists() and not any(journal.parent.glob(f".{journal.name}.*")):
        return RecoverReport(str(workspace.resolve()))
    with locked(workspace):
        return recover_locked(workspace)


def recover_locked(workspace: Path) -> RecoverReport:
    report = RecoverReport(str(workspace.resolve()))
    journal = journal_path(workspace)
    for torn in journal.parent.glob(f".{journal.name}.*"):  # a journal write killed before its rename
        torn.unlink(missing_ok=True)
    if not journal.exists():
        return report
    with map_errors(f"cannot recover the interrupted apply to {workspace}"):
        state, steps = _read_journal(journal)
        report.steps = len(steps)
        if state == "commit":
            report.action, report.problems = "rolled-forward", _roll_forward(workspace, steps)
        else:
            report.action = "rolled-back"
            _roll_back(workspace, steps)
        _remove_journal(journal)
    return report


def pending() -> list[Path]:
    """The workspaces with an interrupted apply (for ``sandbox changes recover`` without a workspace)."""
    found = []
    for path in sorted(datadir.subdir("journal").glob("*.json")):
        with contextlib.suppress(OSError, ValueError, KeyError):
            found.append(Path(json.loads(path.read_text(encoding="utf-8"))["workspace"]))
    return found
