"""Directories of the host workspace opened as file descriptors, never through a symlink.

The apply works on a workspace the user (and, in a warm jail, a command) may change while it
runs, so it never resolves a path twice: each directory is opened one component at a time with
``O_NOFOLLOW`` (:func:`open_dir`), and every later call is relative to that descriptor. A symlink
put where a directory was fails the open instead of leading the apply elsewhere. Apart from
:mod:`sandbox.mounts.journal` because the plan (:mod:`sandbox.mounts.applyplan`) guards the host
through the same descriptors before the journal touches anything.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from sandbox import datadir

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator


@contextlib.contextmanager
def open_dir(root: Path | int, parts: Iterable[str]) -> Iterator[int]:
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


class Dirs:
    """The steps' parent directories, each opened once; a missing one is ``None``."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.stack = contextlib.ExitStack()
        self.fds: dict[str, int | None] = {}

    def get(self, rel: str) -> int | None:
        if rel not in self.fds:
            parts = () if rel == "." else PurePosixPath(rel).parts
            try:
                self.fds[rel] = self.stack.enter_context(open_dir(self.workspace, parts))
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

    def __enter__(self) -> Dirs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()


def lstat(pfd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def fchmod_dir(pfd: int, name: str, mode: int) -> None:
    fd = os.open(name, datadir.DIR_FLAGS, dir_fd=pfd)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
