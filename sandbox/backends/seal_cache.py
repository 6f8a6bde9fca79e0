"""The seal's cached search, remembered: the last searches in memory, and on disk for the next process.

:func:`sandbox.backends.seal.find` decides what a directory's record may be trusted for (its
times, racy or not, on a trusted file system); this module only keeps the records, and refuses
to give back any it did not write. Apart from the search because a cache file is read from disk
at every ``sandbox run``: what it must withstand (a flipped bit, a forgery, a file put in its
place) is a concern of its own.

The disk cache is as trusted as the rest of the data directory (the user's, mode 0700: a process
of the user's outside any jail could also edit this code). It lives in memory (the last
:data:`LRU_SIZE` workspaces: ``serve`` and the library open many jails on one) and in the data
directory's ``cache/seal`` (``sandbox run``'s separate processes), a file per workspace and glob
list (the last :data:`KEPT_FILES`), mode 0600, written whole with ``os.replace``; its key is the
workspace's real path and the path as given (absolute globs match that), the glob list and the
code's version. Nothing in it is believed blindly:

- a cache file that is not a regular file of ours, that others may write, whose CRC-32 does not
  match (a flipped bit could rename a mask), whose records are not shaped as ours (a name with a
  ``/`` or ``..``), or whose key names another format or code (the release and the size and
  mtime of the modules that decide a mask) is ignored and rewritten: never an error;
- a data directory inside the workspace is not used: a jail in ``rw`` mode could forge it.

Standard library only: ``sandbox run``'s quick path builds its jail with it.
"""

from __future__ import annotations

import _thread  # threading's lock without threading's import (the quick path)
import contextlib
import marshal
import os
import stat
import zlib
from collections import OrderedDict
from functools import cache
from typing import TYPE_CHECKING, NamedTuple

from sandbox import datadir
from sandbox.errors import SandboxError

if TYPE_CHECKING:
    from pathlib import Path

LRU_SIZE = 4
"""Workspaces whose last search is kept in memory."""
KEPT_FILES = 64
"""Searches kept on disk (a workspace and glob list each), the least recently written dropped."""
CACHE_FORMAT = 2
"""The layout of a kept search: part of its key (a file of another format is not read)."""
_MAGIC = b"sandbox-seal\n"
_MODULES = ("backends/seal.py", "patterns.py", "_jailside/glob.py")  # what decides a mask


class DirRecord(NamedTuple):
    """One directory as a search found it (see :mod:`sandbox.backends.seal`)."""

    dev: int
    ino: int
    mtime: int
    ctime: int
    trusted: bool  # neither racy nor on an untrusted file system
    masked: tuple[tuple[str, bool], ...]  # entries directly in it: name, is a directory
    entered: tuple[str, ...]  # sub-directories searched: names
    repo: bool  # it holds a .git entry: a repository whose internals are sealed in rw (git_binds)


Tree = dict[str, DirRecord]  # workspace-relative directory ("" the root) -> what it held


@cache
def code_version() -> list[object]:
    """The release, and the size and mtime of the modules that decide a mask (an edited checkout)."""
    from sandbox import __version__

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    stamps: list[object] = [__version__]
    for name in _MODULES:
        try:
            st = os.stat(os.path.join(here, name))
            stamps += [st.st_size, st.st_mtime_ns]
        except OSError:
            stamps.append(None)
    return stamps


class _Cache:
    """The last searches: in memory for this process, on disk for the next ones."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.trees: OrderedDict[str, Tree] = OrderedDict()
        self.lock = _thread.allocate_lock()

    def recall(self, key: str, kept: Path | None) -> Tree:
        with self.lock:
            tree = self.trees.get(key)
            if tree is not None:
                self.trees.move_to_end(key)
                return tree
        tree = (_load(key, kept) if kept else None) or {}
        if tree:
            self.remember(key, tree)
        return tree

    def remember(self, key: str, tree: Tree) -> None:
        with self.lock:
            self.trees[key] = tree
            self.trees.move_to_end(key)
            while len(self.trees) > self.size:
                self.trees.popitem(last=False)

    def keep(self, key: str, tree: Tree, kept: Path | None) -> None:
        self.remember(key, tree)
        if kept:
            _store(key, tree, kept)

    def clear(self) -> None:
        with self.lock:
            self.trees.clear()


CACHE = _Cache(LRU_SIZE)


def cache_file(key: str, workspace: str) -> Path | None:
    """Where the search of ``key`` is kept on disk: ``None`` without a data directory, or with one
    inside the (real) ``workspace``, whose jails could write it (a forged cache hides a secret)."""
    try:
        folder = datadir.subdir("cache") / "seal"
    except SandboxError:
        return None
    real = os.path.realpath(folder)
    if real == workspace or real.startswith(workspace.rstrip("/") + "/"):
        return None
    return folder / f"{zlib.crc32(key.encode()):08x}"


def _load(key: str, path: Path) -> Tree | None:
    """The tree kept on disk for ``key``; ``None`` for any file that is missing, not ours or not sound."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with open(fd, "rb") as kept:
            st = os.fstat(kept.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
                return None
            return _decode(key, kept.read())
    return None


def _decode(key: str, data: bytes) -> Tree | None:
    head = len(_MAGIC) + 4
    if not data.startswith(_MAGIC) or int.from_bytes(data[len(_MAGIC) : head], "big") != zlib.crc32(data[head:]):
        return None
    try:
        kept_key, rows = marshal.loads(data[head:])
    except Exception:  # marshal's own errors, or not a pair: not ours either way
        return None
    if kept_key != key or not isinstance(rows, dict):
        return None
    tree: Tree = {}
    for rel, row in rows.items():
        found = _row(row)
        if found is None:
            return None
        tree[rel] = found
    return tree


_NOT_NAMES = frozenset({"", ".", ".."})


def _row(row: object) -> DirRecord | None:
    """A kept record, if shaped as one: its names never reach out of their directory.

    Its times are not checked: a value that is not the directory's own fails the comparison with
    ``lstat`` and the directory is listed. (At every ``sandbox run``: C-speed checks only.)"""
    if type(row) is not tuple or len(row) != len(DirRecord._fields):
        return None
    masked, entered = row[5], row[6]
    if type(masked) is not tuple or type(entered) is not tuple or type(row[4]) is not bool or type(row[7]) is not bool:
        return None
    if masked and not all(type(m) is tuple and len(m) == 2 and _name(m[0]) and type(m[1]) is bool for m in masked):
        return None
    if entered:
        try:
            joined = "\0".join(entered)  # TypeError unless every name is a str
        except TypeError:
            return None
        if "/" in joined or not _NOT_NAMES.isdisjoint(entered):
            return None
    return DirRecord._make(row)


def _name(name: object) -> bool:
    return type(name) is str and "/" not in name and name not in _NOT_NAMES


def _prune(folder: Path, keep: int) -> None:
    """Leave ``keep`` files in ``folder``: the most recently written (a temporary file too, if old)."""
    try:
        with os.scandir(folder) as entries:
            kept = sorted((e.stat(follow_symlinks=False).st_mtime_ns, e.path) for e in entries)
    except OSError:
        return
    for _, path in kept[: max(0, len(kept) - keep)]:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _store(key: str, tree: Tree, path: Path) -> None:
    """Write ``tree`` whole (a reader sees the old file or the new one), mode 0600; silently not at all on error."""
    payload = marshal.dumps((key, {rel: tuple(found) for rel, found in tree.items()}))
    data = _MAGIC + zlib.crc32(payload).to_bytes(4, "big") + payload
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=0o700, exist_ok=True)
        if not os.path.lexists(path):
            _prune(path.parent, KEPT_FILES - 1)
        temp = path.with_name(f".{path.name}.{os.getpid()}.{_thread.get_ident()}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)  # left by a crash: O_EXCL makes ours with our mode
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with open(fd, "wb") as out:
                out.write(data)
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
