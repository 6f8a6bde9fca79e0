"""Where the sandbox keeps its state: audit log, trust store, scratch and copy trees.

``$SANDBOX_DATA_DIR`` wins, then ``$XDG_DATA_HOME/sandbox``, then ``~/.local/share/sandbox``.

**Private to its user** (issue 31, category 7). The data directory and every directory made in
it are ``0700`` and ours, whatever the umask: ``mkdir``'s mode only asks, so each is narrowed
after it is made, and one found wider (made by an older version, or by hand) is narrowed too.
A data directory that another user owns is refused: its owner could read or swap what we keep.
Below a private directory, what a jail's copy holds keeps the workspace's own modes (it is what
an apply writes back); the ``0700`` directory above it is what keeps it ours.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from sandbox.errors import ToolFailed, map_errors

PRIVATE = 0o700


def data_dir() -> Path:
    explicit = os.environ.get("SANDBOX_DATA_DIR")
    if explicit:
        base = Path(explicit)
    else:
        xdg = os.environ.get("XDG_DATA_HOME")
        base = Path(xdg) / "sandbox" if xdg else Path.home() / ".local" / "share" / "sandbox"
    return private_dir(base, what="the sandbox data directory", parents=True)


def subdir(name: str) -> Path:
    return private_dir(data_dir() / name, what="a directory in the sandbox data directory")


def private_dir(path: Path, *, what: str = "a private directory", parents: bool = False) -> Path:
    """``path`` as a directory of ours that nobody else can enter (made when missing; ``parents``:
    the ones above it too, as ``mkdir -p`` makes them). Refused when another user owns it."""
    with map_errors(f"cannot create {what} {path}"):
        missing = [path]
        while parents and not missing[-1].parent.exists() and missing[-1].parent != missing[-1]:
            missing.append(missing[-1].parent)  # made 0700 too; an existing one is not ours to narrow
        for folder in reversed(missing):
            folder.mkdir(mode=PRIVATE, exist_ok=True)
        if os.name != "nt":  # Windows: the ACL of the user's profile directory decides
            _narrow(path, what)
    return path


def _narrow(path: Path, what: str) -> None:
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise ToolFailed(f"{what} {path} is not a directory", path=str(path))
    if st.st_uid != os.geteuid():
        raise ToolFailed(f"{what} {path} belongs to uid {st.st_uid}, not to us: refused", path=str(path))
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, stat.S_IMODE(st.st_mode) & PRIVATE)  # keep the owner's bits (a read-only mask dir)


def tree_bytes(root: Path) -> int:
    """The bytes of every file below ``root`` (what a store of the data directory holds); an entry
    that vanishes while it is counted counts nothing."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


# POSIX flags (absent on Windows, where the data directory's trees are removed by path).
DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def remove_tree(path: Path) -> None:
    """Remove ``path`` (a tree a jail wrote, maybe still writing) as :func:`remove_tree_at` does."""
    if os.name == "nt":  # no directory descriptors: by path (Windows' rmtree does not follow junctions)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        return
    fd = os.open(path.parent, DIR_FLAGS)
    try:
        st = os.lstat(path.name, dir_fd=fd)
        if stat.S_ISDIR(st.st_mode):
            remove_tree_at(fd, path.name)
        else:
            os.unlink(path.name, dir_fd=fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def remove_tree_at(pfd: int, name: str) -> None:
    """Remove the directory ``name`` of the directory open as ``pfd``, following no link at any
    step (``rmtree`` by descriptors), and opening up the directories a jail left without write
    permission (by descriptor too: a directory swapped for a link meanwhile is not followed)."""
    try:
        shutil.rmtree(name, dir_fd=pfd)
    except PermissionError:
        _opened_up_bytes(pfd, name)
        shutil.rmtree(name, dir_fd=pfd)


def opened_up_bytes(path: Path) -> int:
    """The bytes of every file below ``path``, a tree a jail wrote: a directory it closed (``000``)
    is opened up to us first, so nothing it holds is hidden from the count. No link is followed."""
    if os.name == "nt":
        return tree_bytes(path)
    fd = os.open(path.parent, DIR_FLAGS)
    try:
        return _opened_up_bytes(fd, path.name)
    except OSError:
        return 0
    finally:
        os.close(fd)


def _opened_up_bytes(pfd: int, name: str) -> int:
    _open_up(pfd, name)
    total = 0
    for _path, dirs, files, fd in os.fwalk(name, dir_fd=pfd):
        for sub in dirs:  # before fwalk descends into it
            with contextlib.suppress(OSError):
                if stat.S_IMODE(os.stat(sub, dir_fd=fd, follow_symlinks=False).st_mode) & 0o700 != 0o700:
                    _open_up(fd, sub)
        for file in files:
            with contextlib.suppress(OSError):
                total += os.stat(file, dir_fd=fd, follow_symlinks=False).st_size
    return total


def _open_up(pfd: int, name: str) -> None:
    fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
    try:
        os.chmod(f"/proc/self/fd/{fd}", 0o700)  # the inode opened, whatever the name means now
    finally:
        os.close(fd)


def atomic_write(path: Path, text: str) -> None:
    """Temp file in the same directory, fsync, rename: a reader sees the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
