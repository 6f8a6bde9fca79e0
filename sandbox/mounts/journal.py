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

``SANDBOX_JOURNAL_CRASH_AFTER=N`` is a test hook, read once at import: the process kills itself
with SIGKILL after its N-th durable operation (a journal write, a staged entry, a rename, a
removal), so tests can crash an apply at every point deterministically.
"""

from __future__ import annotations

import contextlib
import errno
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
from sandbox.mounts.changeset import ApplyReport, guard_entry
from sandbox.mounts.hostfs import SPECIAL_BITS, owner_for
from sandbox.mounts.stamps import CHUNK

if sys.platform != "win32":  # the journal is POSIX code; Windows applies through sandbox.mounts.winapply
    import fcntl

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from sandbox.mounts.changeset import ApplyTarget, Change
    from sandbox.vocabulary import EntryKind as Kind

Op = Literal["put", "delete", "chmod"]
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


# -- steps and plans --------------------------------------------------------------------------


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
        with _open_dir(self.tree.workspace, parts[:-1]) as pfd:
            guard_entry(self.tree, change, pfd, parts[-1])
            current = _lstat(pfd, parts[-1])
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


# -- directories, opened without following symlinks -------------------------------------------


@contextlib.contextmanager
def _open_dir(root: Path | int, parts: Iterable[str]) -> Iterator[int]:
    """A new fd of ``root/parts`` (``root`` a path or a directory fd), one component at a time."""
    fd = os.open(".", datadir.DIR_FLAGS, dir_fd=root) if isinstance(root, int) else os.open(root, datadir.DIR_FLAGS)
    try:
        for part in parts:
            nxt = os.open(part, datadir.DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


class _Dirs:
    """The steps' parent directories, each opened once; a missing one is ``None``."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.stack = contextlib.ExitStack()
        self.fds: dict[str, int | None] = {}

    def get(self, rel: str) -> int | None:
        if rel not in self.fds:
            parts = () if rel == "." else PurePosixPath(rel).parts
            try:
                self.fds[rel] = self.stack.enter_context(_open_dir(self.workspace, parts))
            except (FileNotFoundError, NotADirectoryError):
                self.fds[rel] = None
            except OSError as exc:
                if exc.errno != errno.ELOOP:  # a symlink where a directory was
                    raise
                self.fds[rel] = None
        return self.fds[rel]

    def sync(self) -> None:
        for fd in self.fds.values():
            if fd is not None:
                os.fsync(fd)

    def __enter__(self) -> _Dirs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()


def _lstat(pfd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove_any(pfd: int, name: str) -> None:
    st = _lstat(pfd, name)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        datadir.remove_tree_at(pfd, name)
    else:
        os.unlink(name, dir_fd=pfd)
    _hook.tick()


def _fchmod_dir(pfd: int, name: str, mode: int) -> None:
    fd = os.open(name, datadir.DIR_FLAGS, dir_fd=pfd)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


# -- staging ----------------------------------------------------------------------------------


def _stage(dirs: _Dirs, step: Step) -> None:
    pfd = dirs.get(step.parent)
    if pfd is None or step.staged is None:
        raise Conflict("its directory is gone", path=step.target)
    owner = owner_for(pfd, step.name)
    _make(pfd, step.staged, step.kind, step.mode or 0, step.source, step.link, owner)
    if step.kind == "dir":
        with _open_dir(pfd, [step.staged]) as top:
            for entry in step.entries:
                inner = PurePosixPath(entry.rel)
                with _open_dir(top, inner.parent.parts) as efd:
                    _make(efd, inner.name, entry.kind, entry.mode, entry.source, entry.link, owner)
            _seal(top, step.entries)
        _fchmod_dir(pfd, step.staged, step.mode or 0)


def _make(
    pfd: int, name: str, kind: Kind, mode: int, source: str | None, link: str | None, owner: tuple[int, int] | None
) -> None:
    if kind == "dir":
        os.mkdir(name, 0o700, dir_fd=pfd)
    elif kind == "symlink":
        os.symlink(link or "", name, dir_fd=pfd)
    else:
        _copy_file(pfd, name, source or "", mode)  # a str: a Path would drop _source's mark
    _hook.tick()
    if owner is not None:
        os.chown(name, *owner, dir_fd=pfd, follow_symlinks=False)


def _seal(top: int, entries: list[Staged]) -> None:
    """A staged directory's own directories: their modes set (deepest first, once filled) and
    fsynced, so their entries survive a power cut too."""
    for entry in sorted((e for e in entries if e.kind == "dir"), key=lambda e: -e.rel.count("/")):
        with _open_dir(top, PurePosixPath(entry.rel).parts) as fd:
            os.fsync(fd)
            os.fchmod(fd, entry.mode)
    os.fsync(top)


def _source(root: Path, rel: str) -> str:
    """``root/./rel``: where our tree ends and the jail's names begin (rsync ``-R``'s mark)."""
    return f"{root}/./{rel}"


def _open_source(source: str) -> int:
    """The file a change copies, no link followed below the tree's root: a warm jail may swap a
    directory of its tree for a link to a host file between the review and the apply."""
    root, mark, rel = source.partition("/./")
    if not mark:
        return os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    parts = PurePosixPath(rel).parts
    with _open_dir(Path(root), parts[:-1]) as pfd:
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


def _recheck(dirs: _Dirs, steps: list[Step]) -> list[dict[str, str]]:
    """The guard once more, after staging: whatever changed meanwhile."""
    changed = []
    for step in steps:
        pfd = dirs.get(step.parent)
        current = _lstat(pfd, step.name) if pfd is not None else None
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


def _forward(dirs: _Dirs, step: Step) -> str:
    """Do ``step`` unless it is done; ``""``, or why the host's entry was kept instead."""
    pfd = dirs.get(step.parent)
    if pfd is None:
        return "" if step.op == "delete" else "its directory is gone"
    if step.op == "chmod":
        return _chmod(pfd, step)
    if step.op == "put" and (step.staged is None or _lstat(pfd, step.staged) is None):
        return ""  # renamed into place already
    current = _lstat(pfd, step.name)
    if current is not None and (step.backup is None or _lstat(pfd, step.backup) is None):
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
    current = _lstat(pfd, step.name)
    if current is None or fingerprint(current) != step.expect:
        return "the host directory changed after the commit point"
    _fchmod_dir(pfd, step.name, step.mode or 0)
    return ""


def _clean(dirs: _Dirs, steps: list[Step]) -> None:
    for step in steps:
        pfd = dirs.get(step.parent)
        if pfd is not None and step.backup is not None:
            _remove_any(pfd, step.backup)


def _unstage(dirs: _Dirs, steps: list[Step]) -> None:
    for step in steps:
        pfd = dirs.get(step.parent)
        if pfd is not None and step.staged is not None:
            _remove_any(pfd, step.staged)


def _roll_forward(workspace: Path, steps: list[Step]) -> list[dict[str, str]]:
    problems: list[dict[str, str]] = []
    with _Dirs(workspace) as dirs:
        for step in steps:
            if reason := _forward(dirs, step):
                problems.extend({"path": p, "reason": reason} for p in step.paths or [step.target])
        dirs.sync()
        _clean(dirs, steps)
    return problems


def _roll_back(workspace: Path, steps: list[Step]) -> None:
    with _Dirs(workspace) as dirs:
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
        with map_errors("cannot stage the changes in the workspace"), _Dirs(workspace) as dirs:
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
