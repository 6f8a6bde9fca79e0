"""What identifies a version of a directory entry without reading it, and the walks that take them.

A :class:`Stamp` is an entry's kind, mode, size, device and inode, times and link count: the kernel
updates a file's ctime on every write, chmod or rename and nobody can set it back, so an entry whose
(inode, ctime) is unchanged is unchanged (on Windows, where ``st_ctime`` is the creation time, its
(volume, file index, size, mtime)). :func:`walk` stamps a tree without following links; the
content helpers read a file without following its last component.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Iterator

    from sandbox.vocabulary import EntryKind as Kind


WINDOWS = os.name == "nt"


FILE_ATTRIBUTE_REPARSE_POINT = 0x400


CHUNK = 1 << 20


def kind_of(mode: int, attributes: int = 0) -> Kind:
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
        kind = kind_of(st.st_mode, getattr(st, "st_file_attributes", 0))
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


def under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(f"{root}/") for root in roots)


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
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def same_content(a: Path, b: Path) -> bool:
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                ca, cb = fa.read(CHUNK), fb.read(CHUNK)
                if ca != cb:
                    return False
                if not ca:
                    return True
    except OSError:
        return False
