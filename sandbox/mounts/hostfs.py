"""Operations on the host's files for copy-in and apply: copies, owners, private trees, commands.

Directories are opened by descriptor and never followed (:func:`open_parent`); a new entry gets its
parent's owner when we are root (:func:`owner_for`); a private tree lives in the data directory
under a name that says which executor owns it (:func:`private_tree_name`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox import datadir, owners
from sandbox.errors import Conflict

if TYPE_CHECKING:
    from collections.abc import Iterator

from sandbox.mounts.stamps import CHUNK, FILE_ATTRIBUTE_REPARSE_POINT, WINDOWS, open_unfollowed

SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX


def mount_point(entry: os.DirEntry[str], target: Path) -> None:
    """An empty stand-in for an untracked entry, of its kind (a bind needs a directory for a directory)."""
    if entry.is_dir(follow_symlinks=False):
        target.mkdir(mode=0o755)
    else:
        target.touch(mode=0o644)


def copy_attributes(source: Path, target: Path) -> None:
    """What ``cp -a`` keeps of a directory it did not copy itself: mode, times, xattrs, owner (as root)."""
    shutil.copystat(source, target, follow_symlinks=False)
    if os.geteuid() == 0:
        st = os.lstat(source)
        os.lchown(target, st.st_uid, st.st_gid)


def private_tree_name(kind: str) -> str:
    """``<kind>-<pid>-<starttime>-<id>``: ``sandbox gc`` removes it once this executor is gone."""
    return f"{kind}-{owners.owner_tag()}-{uuid.uuid4().hex[:12]}"


def baseline_file(root: Path) -> Path:
    """Where the baselines of the copy ``root`` are kept: ``baselines/<its name>.json`` in the
    data directory (the names are unique), where no jail reaches and no sweep of copies looks."""
    return datadir.subdir("baselines") / f"{root.name}.json"


def remove_private_tree(path: Path) -> str | None:
    """Remove a private copy or overlay directory; ``None`` when it is gone, else why not.

    An overlay still mounted (its executor was killed) is unmounted first, and nothing is removed
    below a mount point that stays: ``rmtree`` must never walk into a workspace.
    """
    with contextlib.suppress(OSError):
        baseline_file(path).unlink()
    merged = path / "merged"
    if os.path.ismount(merged) and run_command(["umount", str(merged)]) and run_command(["umount", "-l", str(merged)]):
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


@contextlib.contextmanager
def open_parent(root: Path, parts: tuple[str, ...], *, create: bool) -> Iterator[int]:
    """An fd of ``root/parts``, reached one component at a time with O_NOFOLLOW."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags)
    try:
        for part in parts:
            if create:
                owner = owner_for(fd, part)
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


def owner_for(pfd: int, name: str) -> tuple[int, int] | None:
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
            while chunk := os.read(src, CHUNK):
                os.write(dst, chunk)
            os.fsync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def is_whiteout(path: Path) -> bool:
    """Whether ``path`` (in an overlay's upper directory) is a whiteout: a deletion of the lower entry."""
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def is_opaque(path: Path) -> bool:
    """Whether the upper directory ``path`` is opaque: it hides the lower directory's entries."""
    for name in ("trusted.overlay.opaque", "user.overlay.opaque"):
        with contextlib.suppress(OSError):
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
    return False
