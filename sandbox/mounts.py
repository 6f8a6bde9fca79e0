"""Mount strategies and the copy-in/copy-out changeset.

``ro`` and ``rw`` bind the workspace itself. ``copy`` copies it into a private tree the jail
writes to; :meth:`CopyTree.changes` then reports what the jail did, and :meth:`CopyTree.apply`
brings approved changes back as one unit through a journal (:mod:`sandbox.journal`: all of them
or none, across a crash), without following symlinks, and only where the host file is still the
one that was copied in.

Change detection costs a ``stat`` per file, not a read: the kernel updates a file's ctime on
every write, chmod or rename and nobody can set it back, so an entry whose (inode, ctime) in the
private tree is unchanged since copy-in is unchanged. The same fingerprint of the host file
(device, inode, size, mtime, ctime) guards ``apply``: any write to the host file since copy-in
changes it, and that file is refused with CONFLICT. Content hashes (SHA-256) of changed files
are in the changeset for review.

On Windows (the winjob backend) the same code runs with three differences, each where it is made:
``st_ctime`` there is the creation time, so a version is (volume, file index, size, mtime); the
copy-in is Python's (no ``cp``), copies each file's main stream only (never an alternate data
stream) and never enters a junction or another reparse point; and the apply is
:mod:`sandbox.backends.winjob_apply`, which reads changeset paths by Windows' rules.

A symlink is judged by where it leads when followed (:func:`link_verdict`), in the host's view
and the private tree's: inside the workspace it is applied like a file; into the read-only system
tree the jail was given (:data:`SYSTEM_TREES`: a venv's ``bin/python3 -> /usr/bin/python3``) it is
carried as a link and flagged ``system-link``, listed but not held back for consent (it can only
name a host file the user can run already); anywhere else it is ``symlink-outside``, never applied.

A profile's ``mount.exclude`` (``.venv``, ``node_modules``) keeps paths out of the private tree:
the jail binds the host's own read-only at the same place, so it can use them without their
being copied, cannot change them, and the changeset lists them as ``untracked``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import posixpath
import shutil
import stat
import uuid
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio

from sandbox import datadir, envdirs, gitreview, owners
from sandbox.errors import Conflict, InvalidArgument, ToolFailed, map_errors
from sandbox.threads import off_loop

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Iterator

    from sandbox.vocabulary import ChangeStatus as Status
    from sandbox.vocabulary import EntryKind as Kind

_T = TypeVar("_T", bound="CopyTree")
WINDOWS = os.name == "nt"
FILE_ATTRIBUTE_REPARSE_POINT = 0x400
_SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX
_CHUNK = 1 << 20


def _kind(mode: int, attributes: int = 0) -> Kind:
    if attributes & FILE_ATTRIBUTE_REPARSE_POINT and not stat.S_ISLNK(mode):
        return "special"  # a junction or another reparse point (Windows): never entered, never applied
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "special"


@dataclass(frozen=True)
class Stamp:
    """What identifies one version of a directory entry without reading it."""

    kind: Kind
    mode: int
    size: int
    dev: int
    ino: int
    mtime_ns: int
    ctime_ns: int
    nlink: int
    target: str | None = None

    def values(self) -> list[Any]:
        """The fields in order, for ``Stamp(*values)`` (a flat copy: no ``astuple`` deep copy)."""
        return [
            self.kind,
            self.mode,
            self.size,
            self.dev,
            self.ino,
            self.mtime_ns,
            self.ctime_ns,
            self.nlink,
            self.target,
        ]

    @classmethod
    def of(cls, path: str | Path, st: os.stat_result | None = None, dir_fd: int | None = None) -> Stamp:
        """``path`` is read with ``lstat``/``readlink``, relative to ``dir_fd`` when given."""
        st = st or os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
        kind = _kind(st.st_mode, getattr(st, "st_file_attributes", 0))
        target = os.readlink(path, dir_fd=dir_fd) if kind == "symlink" else None
        return cls(
            kind,
            stat.S_IMODE(st.st_mode),
            st.st_size,
            st.st_dev,
            st.st_ino,
            st.st_mtime_ns,
            st.st_ctime_ns,
            st.st_nlink,
            target,
        )

    def same_version(self, other: Stamp) -> bool:
        if WINDOWS:  # st_ctime is the creation time there: a write moves only the size and mtime
            mine = (self.kind, self.dev, self.ino, self.size, self.mtime_ns)
            return mine == (other.kind, other.dev, other.ino, other.size, other.mtime_ns)
        return (self.kind, self.dev, self.ino, self.ctime_ns) == (other.kind, other.dev, other.ino, other.ctime_ns)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Stamp:
        return cls(**data)


def walk(root: Path, skip: Collection[str] = ()) -> Iterator[tuple[str, Stamp]]:
    """Every entry below ``root`` as (posix relative path, Stamp), never following symlinks.

    Entries in ``skip`` (relative paths) are neither reported nor entered.
    """
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(root / rel if rel else root) as it:
            for entry in it:
                path = f"{rel}/{entry.name}" if rel else entry.name
                if path in skip:
                    continue
                # Windows' DirEntry.stat leaves st_ino and st_dev zero: an lstat of its own there,
                # by the \\?\ name (``con`` or ``x.`` would otherwise be a device or another file).
                st = os.lstat(verbatim(entry.path)) if WINDOWS else entry.stat(follow_symlinks=False)
                stamp = Stamp.of(entry.path, st)
                yield path, stamp
                if stamp.kind == "dir":
                    stack.append(path)


def verbatim(path: str) -> str:
    """A Windows path as the filesystem names it, past the Win32 rules (``\\\\?\\`` + the full path).

    A full path (``C:\\…``, UNC) is taken as it is: ``abspath`` (GetFullPathName) would drop the
    very trailing dots and spaces this is for. Any other is made full by ``abspath`` first.
    """
    path = path.replace("/", "\\")
    if path.startswith("\\\\?\\"):
        return path
    if path.startswith("\\\\"):
        return "\\\\?\\UNC\\" + path[2:]
    if path[1:3] != ":\\":
        path = os.path.abspath(path)
    return "\\\\?\\" + path


def untracked_paths(workspace: Path, exclude: Iterable[str]) -> list[str]:
    """The profile's ``mount.exclude`` entries this workspace has, as the jail will bind them.

    An entry counts when it is a directory or a regular file reached through real directories
    only: one behind a symlink, or a symlink itself, would bind whatever the link names, so it is
    copied like any other entry instead. A missing entry is skipped; one inside another is
    covered by it already.
    """
    found: list[str] = []
    for rel in sorted(set(exclude)):
        if any(rel.startswith(f"{outer}/") for outer in found):
            continue
        if _plain_entry(workspace, PurePosixPath(rel).parts):
            found.append(rel)
    return found


def _plain_entry(workspace: Path, parts: tuple[str, ...]) -> bool:
    path = workspace
    for depth, part in enumerate(parts, 1):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return False
        last = depth == len(parts)
        if not (stat.S_ISDIR(mode) or (last and stat.S_ISREG(mode))):
            return False
    return True


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(f"{root}/") for root in roots)


def _mount_point(entry: os.DirEntry[str], target: Path) -> None:
    """An empty stand-in for an untracked entry, of its kind (a bind needs a directory for a directory)."""
    if entry.is_dir(follow_symlinks=False):
        target.mkdir(mode=0o755)
    else:
        target.touch(mode=0o644)


def _copy_attributes(source: Path, target: Path) -> None:
    """What ``cp -a`` keeps of a directory it did not copy itself: mode, times, xattrs, owner (as root)."""
    shutil.copystat(source, target, follow_symlinks=False)
    if os.geteuid() == 0:
        st = os.lstat(source)
        os.lchown(target, st.st_uid, st.st_gid)


RISKY_FLAGS = (
    "git-hook",
    "git-config",
    "dotfile",
    "new-executable",
    "setuid",
    "symlink-outside",
    "special-file",
    "hardlink",
    "tool-config",
    "system-link",
)
# Listed in the review but needing no consent: a link into the read-only system tree the jail was
# given (``.venv/bin/python3 -> /usr/bin/python3``) can only name a host file the user can run already.
NOTICE_FLAGS = frozenset({"system-link"})


@dataclass
class Change:
    path: str
    status: Status
    kind: Kind
    flags: list[str] = field(default_factory=list)
    mode_before: int | None = None
    mode_after: int | None = None
    size: int | None = None
    sha256: str | None = None
    target: str | None = None
    applicable: bool = True
    reason: str = ""
    note: str = ""  # for the reviewer: a system link to a file this host lacks

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}  # not asdict: no deep copy of plain values
        data["flags"] = list(self.flags)
        for key in ("mode_before", "mode_after"):
            if data[key] is not None:
                data[key] = oct(data[key])
        return {k: v for k, v in data.items() if v not in (None, "")}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Change:
        """The inverse of :meth:`to_dict` (keys it does not know are refused by the constructor)."""
        values = dict(data)
        for key in ("mode_before", "mode_after"):
            if isinstance(values.get(key), str):
                values[key] = int(values[key], 8)
        return cls(**values)


@dataclass
class Changeset:
    """What the jail changed in its private tree; ``untracked``: paths kept out of it (bound read-only)."""

    changes: list[Change] = field(default_factory=list)
    untracked: list[str] = field(default_factory=list)

    @property
    def risky(self) -> list[Change]:
        return [c for c in self.changes if set(c.flags) - NOTICE_FLAGS]

    def summary(self) -> dict[str, int]:
        counts = {"added": 0, "modified": 0, "deleted": 0, "flagged": len(self.risky)}
        for change in self.changes:
            counts[change.status] += 1
        return counts

    def to_list(self) -> list[dict[str, Any]]:
        return [c.to_dict() for c in self.changes]


@dataclass
class ApplyReport:
    applied: list[str] = field(default_factory=list)
    conflicts: list[dict[str, str]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    held_back: list[dict[str, Any]] = field(default_factory=list)  # flagged, not consented: path, flags

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def needs_consent(change: Change, named: Collection[str] | None, include_flagged: bool) -> bool:
    """Whether a flagged change waits for consent: it is applied only when named or when flagged
    changes are included explicitly (``--include-flagged``)."""
    named_it = named is not None and change.path in named
    return bool(set(change.flags) - NOTICE_FLAGS) and change.applicable and not include_flagged and not named_it


def with_contents(named: Collection[str], paths: Iterable[str]) -> set[str]:
    """The entries of ``paths`` that ``named`` names: a directory names every entry below it, so
    ``--only .venv`` applies its content, not only its own entry (an empty directory). A directory
    that has no entry of its own is replaced by those below it; an unknown name stays, for the
    caller to refuse."""
    named = {n.rstrip("/") or n for n in named}
    entries = set(paths)
    dirs = {a for p in entries for a in _ancestors(p)}
    below = {p for p in entries if any(a in named for a in _ancestors(p))}
    return {n for n in named if n in entries or n not in dirs} | below


def _ancestors(path: str) -> Iterator[str]:
    at = path.rfind("/")
    while at > 0:
        path = path[:at]
        yield path
        at = path.rfind("/")


def _flags(rel: str, kind: Kind, before: Stamp | None, after: Stamp | None, workspace: Path) -> list[str]:
    parts = PurePosixPath(rel).parts
    if parts[0] == ".git" and gitreview.is_repository(workspace):
        # A repository's own data files form one consent group (sandbox.gitreview), not dotfiles.
        return gitreview.internal_flags(rel) + _mode_flags(rel, kind, before, after, workspace)
    flags: list[str] = []
    if parts[:2] == (".git", "hooks") and len(parts) > 2:
        flags.append("git-hook")
    if parts[:2] == (".git", "config"):
        flags.append("git-config")
    if not flags and gitreview.is_repository(workspace) and gitreview.obeyed_in_worktree(workspace, rel):
        flags.append("git-hook")  # core.hooksPath's directory, .husky, lefthook.yml, a file the config includes
    if rel in gitreview.HOST_TOOL_FILES:
        flags.append("tool-config")  # mise runs its hooks at the next prompt
    if any(p.startswith(".") for p in parts) and not flags:
        flags.append("dotfile")
    return flags + _mode_flags(rel, kind, before, after, workspace)


def _mode_flags(rel: str, kind: Kind, before: Stamp | None, after: Stamp | None, workspace: Path) -> list[str]:
    flags: list[str] = []
    if after is None:
        return flags
    was_exec = before is not None and before.kind == "file" and before.mode & 0o111
    if kind == "file" and after.mode & 0o111 and not was_exec:
        flags.append("new-executable")
    if after.mode & (stat.S_ISUID | stat.S_ISGID):
        flags.append("setuid")
    if kind == "special":
        flags.append("special-file")
    if kind == "file" and after.nlink > 1:
        flags.append("hardlink")
    if kind == "symlink" and after.target is not None:
        flags += _LINK_FLAGS[link_verdict(rel, after.target, workspace)]  # the host's view; the tree's: _change
    return flags


_LINK_FLAGS: dict[LinkVerdict, list[str]] = {"inside": [], "system": ["system-link"], "outside": ["symlink-outside"]}


def _windows_unsafe(rel: str, before: Stamp | None, after: Stamp | None) -> Change | None:
    """A change whose name Windows reads as another file or a device (``x.``, ``con``): listed,
    never read (its content could be a console's) and never applied."""
    from sandbox.backends.winjob_paths import windows_name_problem

    problems = [p for part in rel.split("/") if (p := windows_name_problem(part))]
    if not problems:
        return None
    now = after or before
    assert now is not None
    status: Status = "deleted" if after is None else "added" if before is None else "modified"
    change = Change(rel, status, now.kind, [], before.mode if before else None, after.mode if after else None)
    change.applicable, change.reason = False, f"not applied on Windows: {problems[0]}"
    return change


_LINK_HOPS = 40  # links followed in one resolution: the kernel's own bound (ELOOP past it)
_LINK_STEPS = 4096  # components walked in one resolution: past it, undecided

# The read-only system tree a jail is given: bubblewrap binds the host's own (bwrap_argv.SYSTEM_DIRS,
# the same names), Docker has the image's under the same names. /etc is not part of it: it holds
# the host's secrets (shadow, keys), masked in a jail but not on the host a link is applied to.
SYSTEM_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
LinkVerdict = Literal["inside", "system", "outside"]


def link_verdict(rel: str, target: str, workspace: Path, view: Path | None = None) -> LinkVerdict:
    """Where the symlink ``rel`` (-> ``target``) leads when followed: ``inside`` the workspace,
    into the ``system`` tree, or ``outside`` (anywhere else, or undecided).

    Never lexical (issue 31, category 8): the target is walked one component at a time as the
    kernel would, following every link on the way, the workspace's entries read from ``view``
    (a private tree after the run; default: the host workspace itself) and anything outside it
    from the host. ``a -> d/up/../x`` with ``d/up -> ..`` leaves, as does a link through a host
    link to ``/etc``. A resolution that cannot be decided (a loop, too many links, too long) is
    outside. A component that does not exist ends the links: the rest is walked as names.

    ``system`` (issue 32: ``.venv/bin/python3 -> /usr/bin/python3``) is a resolution that ends
    under :data:`SYSTEM_TREES` on a regular file, or on nothing this host has (an image's
    ``/usr/local/bin/python3``), and met links only in the workspace and the system tree: never a
    directory (a host tool writing through it would write there) and never through ``/proc``'s
    magic links or ``/etc``.
    """
    return _judge(rel, target, workspace, view)[0]


def _judge(rel: str, target: str, workspace: Path, view: Path | None = None) -> tuple[LinkVerdict, str]:
    """:func:`link_verdict` and, for a system link to nothing on this host, the path it names."""
    if WINDOWS:  # its links name drives and junctions; winjob_apply never writes a link there
        return ("inside" if _lexically_inside(rel, target, workspace) else "outside"), ""
    ws = PurePosixPath(os.path.realpath(workspace)).parts
    try:
        end, elsewhere = _resolve(rel, target, ws, view)
    except _Undecided:
        return "outside", ""
    if tuple(end[: len(ws)]) == ws:
        return "inside", ""
    found = _system_file(end) if not elsewhere else None
    if found is None:
        return "outside", ""
    return "system", "" if found else str(PurePosixPath(*end))


def _resolve(rel: str, target: str, ws: tuple[str, ...], view: Path | None) -> tuple[list[str], bool]:
    """The link-free path ``target`` leads to, and whether a link was met outside the workspace
    and the system tree on the way."""
    reader = _ViewReader(ws, view or Path(*ws))
    here = [*ws, *PurePosixPath(rel).parent.parts]
    pending = _components(target)[::-1]  # a stack: the next component last
    hops = steps = 0
    elsewhere = False
    if target.startswith("/"):
        here = ["/"]
    while pending:
        steps += 1
        part = pending.pop()
        if steps > _LINK_STEPS:
            raise _Undecided
        if part == "..":
            here = here[:-1] if len(here) > 1 else here
            continue
        link = reader.readlink([*here, part])
        if link is None:
            here.append(part)
            continue
        hops += 1
        if hops > _LINK_HOPS:
            raise _Undecided
        at = (*here, part)
        elsewhere = elsewhere or not (at[: len(ws)] == ws or _in_system_tree(at))
        if link.startswith("/"):
            here = ["/"]
        pending += _components(link)[::-1]
    return here, elsewhere


@cache
def _system_roots() -> frozenset[tuple[str, ...]]:
    """The system trees by their names and, where a name is a link (merged /usr), by where it leads."""
    roots = {PurePosixPath(d).parts for d in SYSTEM_TREES}
    return frozenset(roots | {PurePosixPath(os.path.realpath(d)).parts for d in SYSTEM_TREES})


def _in_system_tree(parts: tuple[str, ...] | list[str]) -> bool:
    return any(tuple(parts[: len(root)]) == root for root in _system_roots())


def in_system_tree_lexically(path: str) -> bool:
    """Whether the absolute ``path``, normalised by its names alone, is in :data:`SYSTEM_TREES`
    (for a jail's word before anything is written: :func:`link_verdict` judges it afterwards)."""
    return path.startswith("/") and _in_system_tree(PurePosixPath(posixpath.normpath(path)).parts)


def _system_file(end: list[str]) -> bool | None:
    """For a link-free path: ``True`` when it is a regular file in the system tree, ``False`` when it
    is in the system tree but this host has nothing there, ``None`` otherwise."""
    if not _in_system_tree(end) or len(end) < 3:
        return None
    try:
        return True if stat.S_ISREG(os.lstat(Path(*end)).st_mode) else None
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return None


def _lexically_inside(rel: str, target: str, workspace: Path) -> bool:
    if os.path.isabs(target):
        resolved = os.path.normpath(target)
    else:
        resolved = os.path.normpath(os.path.join(str(workspace), os.path.dirname(rel), target))
    return Path(resolved).is_relative_to(workspace)


class _Undecided(Exception):
    """A link's resolution that cannot be decided: a loop, too many links, a directory we cannot read."""


def _components(target: str) -> list[str]:
    return [p for p in target.split("/") if p not in ("", ".")]


class _ViewReader:
    """Reads links as a resolution meets them: inside the workspace from a view of it, else the host's."""

    def __init__(self, workspace: tuple[str, ...], view: Path) -> None:
        self.workspace = workspace
        self.view = view

    def readlink(self, parts: list[str]) -> str | None:
        """The target of the link at ``parts`` (an absolute path free of links up to its last
        component); ``None`` when it is no link (or nothing, or unreadable as one)."""
        if tuple(parts[: len(self.workspace)]) == self.workspace:
            path = self.view.joinpath(*parts[len(self.workspace) :])
        else:
            path = Path(*parts)
        try:
            return os.readlink(path)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):
                return None  # not a link, or nothing there: a name like any other
            raise _Undecided from exc  # EACCES, ELOOP, ENAMETOOLONG: we cannot tell where it leads


def open_unfollowed(path: str | Path) -> int:
    """An fd reading the file ``path`` names, its last component never followed.

    Windows has no ``O_NOFOLLOW``: a reparse point (symlink, junction) is refused by an lstat
    first, and ``O_BINARY`` keeps the C runtime from translating line ends.
    """
    if not WINDOWS:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or getattr(st, "st_file_attributes", 0) & FILE_ATTRIBUTE_REPARSE_POINT:
        raise OSError(errno.ELOOP, "a symlink or reparse point is not followed", str(path))
    return os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))


def sha256_file(path: Path) -> str:
    """The SHA-256 of the file ``path`` names, never following a symlink."""
    digest = hashlib.sha256()
    fd = open_unfollowed(path)
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


_sha256 = sha256_file


def _same_content(a: Path, b: Path) -> bool:
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                ca, cb = fa.read(_CHUNK), fb.read(_CHUNK)
                if ca != cb:
                    return False
                if not ca:
                    return True
    except OSError:
        return False


class CopyTree:
    """A private copy of a workspace that a jail writes to instead of the workspace.

    Its baselines (the workspace's and the copy's stamps as copied in) are also written to the data
    directory (:meth:`baseline_file`, outside the copy: no jail reaches it), so the work of an executor that
    was killed can still be read as a changeset (:meth:`recovered`, ``sandbox gc``)."""

    recoverable = True  # a copy whose tree here is what the jail wrote (not a remote engine's)

    def __init__(self, workspace: Path, root: Path, exclude: Iterable[str] = ()) -> None:
        self.workspace = workspace
        self.root = root
        self.exclude = tuple(exclude)
        self.untracked: list[str] = []  # the excluded paths found: the jail binds them read-only
        self.host: dict[str, Stamp] = {}
        self.copy: dict[str, Stamp] = {}
        self.bytes_copied = 0
        self.environment_cache = False  # seed environment directories from sandbox.envdirs' cache
        self.seeded: list[str] = []  # the directories seeded: not in the baseline (the host has none)
        self.environment: tuple[str, ...] = ()  # the profile's mount.environment, for a recovered changeset

    @classmethod
    async def prepare(
        cls,
        workspace: Path,
        parent: Path | None = None,
        exclude: Iterable[str] = (),
        *,
        environment_cache: bool = False,
        environment: Iterable[str] = (),
    ) -> CopyTree:
        base = parent or datadir.subdir("copies")
        tree = cls(workspace, base / private_tree_name("copy"), exclude)
        tree.environment_cache = environment_cache
        tree.environment = tuple(environment)
        return await _set_up(tree, "_copy_in")

    def _copy_in(self) -> None:
        with map_errors(f"cannot copy the workspace {self.workspace}"):
            self.untracked = untracked_paths(self.workspace, self.exclude)
            self.host = dict(walk(self.workspace, set(self.untracked)))
            self.root.mkdir(mode=0o700)
            result = self._copy_level("", set(self.untracked))
            if result:
                raise ToolFailed(f"copying the workspace failed: {result}", workspace=str(self.workspace))
            os.chmod(self.root, 0o700)  # cp -a gave it the workspace's mode: the private tree stays ours
            self.copy = dict(walk(self.root))
            self.bytes_copied = sum(s.size for s in self.copy.values() if s.kind == "file")
            if self.environment_cache:  # after the baseline: what is seeded is added, as the host sees it
                self.seeded = envdirs.seed(self.workspace, self.root)
            self._save_baseline()

    @staticmethod
    def baseline_file(root: Path) -> Path:
        """Where the baselines of the copy ``root`` are kept: ``baselines/<its name>.json`` in the
        data directory (the names are unique), where no jail reaches and no sweep of copies looks."""
        return datadir.subdir("baselines") / f"{root.name}.json"

    def _save_baseline(self) -> None:
        if not self.recoverable:
            return
        data = {
            "workspace": str(self.workspace),
            "exclude": list(self.exclude),
            "untracked": self.untracked,
            "seeded": self.seeded,
            "environment": list(self.environment),
            "host": {rel: st.values() for rel, st in self.host.items()},
            "copy": {rel: st.values() for rel, st in self.copy.items()},
        }
        path = self.baseline_file(self.root)
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        temp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(temp, path)

    @classmethod
    def recovered(cls, root: Path) -> CopyTree | None:
        """The copy at ``root`` with its saved baselines; ``None`` when there are none."""
        try:
            data = json.loads(cls.baseline_file(root).read_text(encoding="utf-8"))
            tree = cls(Path(data["workspace"]), root, data["exclude"])
            tree.untracked, tree.seeded = list(data["untracked"]), list(data["seeded"])
            tree.environment = tuple(data["environment"])
            tree.host = {rel: Stamp(*values) for rel, values in data["host"].items()}
            tree.copy = {rel: Stamp(*values) for rel, values in data["copy"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return tree

    def _copy_level(self, rel: str, untracked: set[str]) -> str:
        """Copy ``rel``'s entries; ``""`` when done, else why not.

        cp -a keeps modes, times, symlinks (unfollowed) and hardlinks; --reflink makes the copy
        O(1) per file on filesystems that share extents. Only a directory holding an untracked
        path is copied entry by entry, and the untracked path itself becomes an empty mount point
        (made now, so the changeset's baseline has it and the jail's bind creates nothing).
        """
        source, target = self.workspace / rel, self.root / rel
        if WINDOWS:  # no cp there; and no bind for an untracked path: winjob copies them all
            copy_tree_windows(source, target)
            return ""
        if not untracked:
            return _run(["cp", "-a", "--reflink=auto", f"{source}/.", str(target)])
        whole: list[str] = []
        for entry in sorted(os.scandir(source), key=lambda e: e.name):
            path = f"{rel}/{entry.name}" if rel else entry.name
            if path in untracked:
                _mount_point(entry, target / entry.name)
            elif any(u.startswith(f"{path}/") for u in untracked):
                (target / entry.name).mkdir(mode=0o700)
                inner = {u for u in untracked if u.startswith(f"{path}/")}
                if failed := self._copy_level(path, inner):
                    return failed
            else:
                whole.append(entry.path)
        failed = _run(["cp", "-a", "--reflink=auto", "--", *whole, str(target)]) if whole else ""
        _copy_attributes(source, target)
        return failed

    def hand_to(self, uid: int, gid: int) -> None:
        """Give the private copy to the jail's uid (we are root, it is not) and re-baseline.

        chown moves every entry's ctime, so the snapshot the changeset compares against is taken
        again afterwards: the chown is ours, not the jail's.
        """
        if os.geteuid() != 0 or (self.root.stat().st_uid, self.root.stat().st_gid) == (uid, gid):
            return
        with map_errors("cannot hand the private copy to the jail's user"):
            os.chown(self.root, uid, gid)
            for rel, _stamp in walk(self.root):
                os.chown(self.root / rel, uid, gid, follow_symlinks=False)
            self.copy = {rel: st for rel, st in walk(self.root) if not _under(rel, self.seeded)}
            self._save_baseline()

    async def changes(self) -> Changeset:
        return self._untracked_out(await off_loop(self._changes))

    def _untracked_out(self, changeset: Changeset) -> Changeset:
        """No change under an untracked path is the jail's to report (their mount points included)."""
        changeset.changes = [c for c in changeset.changes if not _under(c.path, self.untracked)]
        changeset.untracked = list(self.untracked)
        return changeset

    def _changes(self) -> Changeset:
        with map_errors("cannot read the private copy"):
            now = dict(walk(self.root))
        result = Changeset()
        for rel in sorted(set(now) | set(self.copy)):
            change = self._compare(rel, self.copy.get(rel), now.get(rel))
            if change is not None:
                result.changes.append(change)
        return result

    def _compare(self, rel: str, before: Stamp | None, after: Stamp | None) -> Change | None:
        if before is not None and after is not None and before.same_version(after):
            return None
        if WINDOWS and (unsafe := _windows_unsafe(rel, before, after)) is not None:
            return unsafe
        if after is None:
            assert before is not None
            return self._change(rel, "deleted", before.kind, before, None)
        if before is None or before.kind != after.kind:
            return self._change(rel, "added" if before is None else "modified", after.kind, before, after)
        if after.kind == "dir" and after.mode == before.mode:
            return None
        if after.kind == "symlink" and after.target == before.target:
            return None
        if (
            after.kind == "file"
            and after.mode == before.mode
            and after.size == before.size
            and _same_content(self.root / rel, self.workspace / rel)
        ):
            return None
        return self._change(rel, "modified", after.kind, before, after)

    def _change(self, rel: str, status: Status, kind: Kind, before: Stamp | None, after: Stamp | None) -> Change:
        flags = _flags(rel, kind, before, after, self.workspace)
        change = Change(rel, status, kind, flags, before.mode if before else None, after.mode if after else None)
        if after is not None:
            change.size = after.size
            change.target = after.target
            if kind == "file":
                with contextlib.suppress(OSError):
                    change.sha256 = _sha256(self.root / rel)
        if after is not None and after.kind == "symlink" and after.target is not None:
            self._judge_link(change, after.target)
        if "special-file" in flags:
            change.applicable, change.reason = False, "FIFOs, sockets and devices never leave the jail"
        elif "symlink-outside" in flags:
            change.applicable, change.reason = False, "the symlink points outside the workspace"
        return change

    def _judge_link(self, change: Change, target: str) -> None:
        """The link judged again in the private tree's view, through the tree's own links as the jail
        left them (the host's view is :func:`_mode_flags`'s): outside in either view is outside, and
        a system link in both may name a file this host lacks (an image's), which the review says."""
        verdict, missing = _judge(change.path, target, self.workspace, self.root)
        if verdict == "outside" or "symlink-outside" in change.flags:
            change.flags[:] = [f for f in change.flags if f != "system-link"]
            if "symlink-outside" not in change.flags:
                change.flags.append("symlink-outside")
        elif verdict == "system" and "system-link" not in change.flags:
            change.flags.append("system-link")
        if "system-link" in change.flags and missing:
            change.note = f"points to {missing}, which this host does not have"

    async def apply(
        self, changeset: Changeset, paths: Iterable[str] | None = None, *, include_flagged: bool = False
    ) -> ApplyReport:
        named = set(paths) if paths is not None else None
        return await off_loop(self._apply, changeset, named, include_flagged)

    def _apply(self, changeset: Changeset, only: set[str] | None, include_flagged: bool) -> ApplyReport:
        """Guard every change, then apply those that pass as one unit through a journal.

        A flagged change is held back unless named in ``only`` or ``include_flagged`` (consent).
        An interrupted apply to this workspace is recovered first. See :mod:`sandbox.journal`.
        """
        if WINDOWS:
            from sandbox.backends import winjob_apply

            return winjob_apply.apply(self, changeset, only, include_flagged)
        from sandbox import journal  # it builds on this module: imported here, not at the top

        with journal.locked(self.workspace):
            journal.recover_locked(self.workspace)
            plan = journal.Plan(self)
            for change in selected(changeset, only, include_flagged, plan.report):
                plan.add(change)
            kept_back = journal.execute(self.workspace, plan.steps)
        report = plan.report
        lost = {p["path"] for p in kept_back}
        report.applied += [p for step in plan.steps for p in step.paths if p not in lost]
        report.conflicts += kept_back
        return report

    def _guard(self, change: Change, pfd: int, name: str) -> None:
        """The host entry must still be what was copied in (or still absent for an addition)."""
        try:
            current: Stamp | None = Stamp.of(name, dir_fd=pfd)
        except FileNotFoundError:
            current = None
        except OSError as exc:
            raise Conflict(f"cannot check the host file: {exc.strerror}") from exc
        self.guard_stamp(change, current)

    def guard_stamp(self, change: Change, current: Stamp | None) -> None:
        """:meth:`_guard` once the host entry is read: ``current`` (``None``: absent) against copy-in."""
        original = self.host.get(change.path)
        if original is None:
            if current is not None and not (change.kind == "dir" and current.kind == "dir"):
                raise Conflict("the host created this path since copy-in")
            return
        if current is None or current.kind != original.kind:
            raise Conflict("the host entry changed since copy-in")
        if original.kind == "dir":
            # A directory's times move whenever an entry in it does (our own applies included).
            if (current.dev, current.ino) != (original.dev, original.ino):
                raise Conflict("the host directory was replaced since copy-in")
            return
        if not original.same_version(current) or current.mtime_ns != original.mtime_ns:
            raise Conflict("the host file changed since copy-in")

    def remove(self) -> None:
        remove_private_tree(self.root)


def selected(changeset: Changeset, only: set[str] | None, include_flagged: bool, report: ApplyReport) -> list[Change]:
    """The changes an apply tries, in apply order: named (when ``only``), applicable and consented;
    the others go to ``report`` as skipped or held back."""
    chosen = []
    if only is not None:
        only = with_contents(only, (c.path for c in changeset.changes))
    for change in sorted(changeset.changes, key=_apply_order):
        if only is not None and change.path not in only:
            continue
        if not change.applicable:
            report.skipped.append({"path": change.path, "reason": change.reason})
            continue
        if needs_consent(change, only, include_flagged):
            report.held_back.append({"path": change.path, "flags": list(change.flags)})
            continue
        chosen.append(change)
    return chosen


def private_tree_name(kind: str) -> str:
    """``<kind>-<pid>-<starttime>-<id>``: ``sandbox gc`` removes it once this executor is gone."""
    return f"{kind}-{owners.owner_tag()}-{uuid.uuid4().hex[:12]}"


def remove_private_tree(path: Path) -> str | None:
    """Remove a private copy or overlay directory; ``None`` when it is gone, else why not.

    An overlay still mounted (its executor was killed) is unmounted first, and nothing is removed
    below a mount point that stays: ``rmtree`` must never walk into a workspace.
    """
    with contextlib.suppress(OSError):
        CopyTree.baseline_file(path).unlink()
    merged = path / "merged"
    if os.path.ismount(merged) and _run(["umount", str(merged)]) and _run(["umount", "-l", str(merged)]):
        return "its overlay is still mounted and cannot be unmounted"
    if not os.path.lexists(path):
        return None
    for dirpath, _dirs, files in os.walk(path):
        if os.path.ismount(dirpath):
            return f"{dirpath} is a mount point"
        # A jail may leave directories without write permission behind; allow removal.
        with contextlib.suppress(OSError):
            os.chmod(dirpath, 0o700)
        if WINDOWS:  # a read-only file cannot be removed there
            for name in files:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(dirpath, name), stat.S_IWRITE | stat.S_IREAD)
    shutil.rmtree(path, ignore_errors=True)
    return f"{path} could not be removed" if os.path.lexists(path) else None


async def _set_up(tree: _T, step: str) -> _T:
    """Run a tree's (blocking) setup in a thread; on any failure leave nothing behind."""
    try:
        await off_loop(getattr(tree, step))
    except BaseException:
        with anyio.CancelScope(shield=True):
            await off_loop(tree.remove)
        raise
    return tree


def _apply_order(change: Change) -> tuple[int, int, str]:
    """Deletions first, children before their directory, then the rest, directories before their children.

    A directory replaced by a file (or deleted) must hold only planned deletions when it is checked.
    """
    depth = change.path.count("/")
    if change.status == "deleted":
        return (0, -depth, change.path)
    return (1, depth, change.path)


@contextlib.contextmanager
def _open_parent(root: Path, parts: tuple[str, ...], *, create: bool) -> Iterator[int]:
    """An fd of ``root/parts``, reached one component at a time with O_NOFOLLOW."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags)
    try:
        for part in parts:
            if create:
                owner = _owner_for(fd, part)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if owner is not None:
                        os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                raise Conflict(f"parent {part!r} is not a directory inside the workspace") from exc
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def _owner_for(pfd: int, name: str) -> tuple[int, int] | None:
    """Who a replaced entry (or, for a new one, its directory) belongs to; ``None`` unless root.

    The private copy may belong to the jail's uid and our own writes to root: an applied file
    keeps the owner the host gave it, and a new one takes its directory's.
    """
    if os.geteuid() != 0:
        return None
    try:
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except FileNotFoundError:
        st = os.fstat(pfd)
    return st.st_uid, st.st_gid


def run_command(argv: list[str]) -> str:
    """Run ``argv`` to its end: ``""`` when it succeeded, else why not (its stderr, or its status).

    Its stderr goes to a file, not a pipe: the call returns when the command exits, not when every
    holder of a pipe's write end has closed it (a process another thread starts at the wrong moment
    can hold one; a full suite once saw a finished ``cp`` waited on for minutes)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryFile() as errors:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors, check=False)
        if done.returncode == 0:
            return ""
        errors.seek(0)
        said = errors.read(64 * 1024).decode(errors="replace").strip()
    return said or f"exit {done.returncode}"


_run = run_command


def copy_tree_windows(source: Path, target: Path) -> None:
    """``cp -a`` as far as Windows goes: directories, regular files (main stream, times, the
    read-only bit) and symlinks as links; a junction or another reparse point is not copied.

    ``shutil.copy2`` is not used: on Windows it is ``CopyFile2``, which copies alternate data
    streams too, and a stream is what the changeset cannot show.
    """
    target.mkdir(mode=0o700, exist_ok=True)
    with os.scandir(source) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        st = os.lstat(entry.path)
        dest = target / entry.name
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(entry.path), dest, target_is_directory=os.path.isdir(entry.path))
        elif getattr(st, "st_file_attributes", 0) & FILE_ATTRIBUTE_REPARSE_POINT:
            continue
        elif stat.S_ISDIR(st.st_mode):
            copy_tree_windows(Path(entry.path), dest)
        elif stat.S_ISREG(st.st_mode):
            copy_file_bytes(Path(entry.path), dest)
            shutil.copystat(entry.path, dest, follow_symlinks=False)
    shutil.copystat(source, target, follow_symlinks=False)


def copy_file_bytes(source: Path, dest: Path, mode: int = 0o600) -> None:
    """The bytes of ``source`` (not followed) into a new file ``dest``: nothing but the main stream."""
    binary = getattr(os, "O_BINARY", 0)
    src = open_unfollowed(source)
    try:
        dst = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | binary, mode)
        try:
            while chunk := os.read(src, _CHUNK):
                os.write(dst, chunk)
            os.fsync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _is_whiteout(path: Path, stamp: Stamp) -> bool:
    if stamp.kind != "special":
        return False
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _is_opaque(path: Path) -> bool:
    for name in ("trusted.overlay.opaque", "user.overlay.opaque"):
        with contextlib.suppress(OSError):
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
    return False


def overlay_support() -> str | None:
    """``None`` when this host can mount an overlay for a jail, else why not."""
    if os.geteuid() != 0:
        return "mounting an overlay needs root here (or bubblewrap >= 0.9 with --overlay)"
    try:
        with open("/proc/filesystems", encoding="utf-8") as fh:
            if not any(line.split()[-1:] == ["overlay"] for line in fh):
                return "the kernel has no overlay filesystem"
    except OSError as exc:
        return f"cannot read /proc/filesystems: {exc.strerror}"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount(8) is not installed"
    return None


class OverlayTree(CopyTree):
    """A copy-on-write view of the workspace: the jail writes to an upper dir, setup is O(1).

    The merged view is mounted at ``root`` (so ``apply`` reads changed files from it as from a
    copy); the changeset is read from the upper dir, whose whiteouts are deletions. The host
    workspace is the live lower layer, so the apply guard is the host file's fingerprint when
    the changeset was computed: a file the host changes after review is refused with CONFLICT.
    """

    recoverable = False  # its changes are an upper directory's, read against the mounted view

    def __init__(self, workspace: Path, base: Path) -> None:
        super().__init__(workspace, base / "merged")
        self.base = base
        self.upper = base / "upper"
        self.mounted = False

    @classmethod
    async def prepare(
        cls,
        workspace: Path,
        parent: Path | None = None,
        exclude: Iterable[str] = (),
        *,
        environment_cache: bool = False,
        environment: Iterable[str] = (),
    ) -> OverlayTree:
        del environment_cache, environment  # copies only: an overlay's upper dir is its changeset, never recovered
        reason = overlay_support()
        if reason:
            raise InvalidArgument(f"overlay mount unavailable: {reason}")
        if any(c in str(workspace) for c in ",:\\"):
            raise InvalidArgument(f"overlay cannot mount a workspace whose path has ',' ':' or '\\': {workspace}")
        base = (parent or datadir.subdir("copies")) / private_tree_name("overlay")
        tree = cls(workspace, base)
        # The merged view shows the host's entries already: they only need binding read-only.
        tree.untracked = await off_loop(untracked_paths, workspace, exclude)
        return await _set_up(tree, "_mount")

    def _mount(self) -> None:
        with map_errors("cannot prepare the overlay"):
            for sub in ("upper", "work", "merged"):
                (self.base / sub).mkdir(parents=True, mode=0o700)
            opts = f"lowerdir={self.workspace},upperdir={self.upper},workdir={self.base / 'work'}"
            error = _run(["mount", "-t", "overlay", "overlay", "-o", opts, str(self.root)])
            if error:
                raise ToolFailed(f"mounting the overlay failed: {error}", workspace=str(self.workspace))
            self.mounted = True

    def _changes(self) -> Changeset:
        found: dict[str, Change] = {}
        with map_errors("cannot read the overlay's upper layer"):
            for rel, up in walk(self.upper, set(self.untracked)):
                for change in self._overlay_changes(rel, up):
                    found[change.path] = change
        for rel in found:
            self._remember_host(rel)
        return Changeset([found[rel] for rel in sorted(found)])

    def _overlay_changes(self, rel: str, up: Stamp) -> list[Change]:
        try:
            before: Stamp | None = Stamp.of(self.workspace / rel)
        except FileNotFoundError:
            before = None
        if _is_whiteout(self.upper / rel, up):
            if before is None:
                return []
            return [*self._host_descendants_gone(rel), self._change(rel, "deleted", before.kind, before, None)]
        after = Stamp.of(self.root / rel)
        changes = []
        if before is None:
            changes.append(self._change(rel, "added", after.kind, None, after))
        elif (change := self._compare(rel, before, after)) is not None:
            changes.append(change)
        if up.kind == "dir" and before is not None and before.kind == "dir" and _is_opaque(self.upper / rel):
            changes += self._host_descendants_gone(rel)
        return changes

    def _host_descendants_gone(self, rel: str) -> list[Change]:
        """A deleted or replaced (opaque) directory hides all of the host's entries below it."""
        gone = []
        host_dir = self.workspace / rel
        if not host_dir.is_dir() or host_dir.is_symlink():
            return []
        for sub, stamp in walk(host_dir):
            path = f"{rel}/{sub}"
            if not os.path.lexists(self.root / path):
                gone.append(self._change(path, "deleted", stamp.kind, stamp, None))
        return gone

    def _remember_host(self, rel: str) -> None:
        with contextlib.suppress(OSError):
            self.host[rel] = Stamp.of(self.workspace / rel)

    def remove(self) -> None:
        self.mounted = False
        remove_private_tree(self.base)
