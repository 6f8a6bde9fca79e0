"""A ``copy`` mount on an engine that cannot see our files: the workspace moves as tar streams.

A remote engine (see :func:`~.client.engine_of`) cannot bind the private copy, so the jail's
workspace is a Docker volume of the engine's, one per jail. :func:`populate` fills it: the
private copy (:class:`~sandbox.mounts.CopyTree`, made here as locally) goes in as one tar stream
(``put_archive``) through a *carrier* container that mounts the volume and is never a jail: it
runs once, as root with ``CAP_CHOWN`` alone, to give the volume's root to the command uid (the
archive API skips a tar's ``.`` entry, so nothing else can), and then stays, stopped, for the
copy-out. The jail's containers (warm or per call) mount the same volume at the workspace's path.

Copy-out reads the volume back as a tar stream (``get_archive`` of the carrier) and
:func:`sync_from_tar` mirrors it into the private copy, so :class:`RemoteTree` feeds the very
changeset and guarded apply of a local copy. An entry whose content and mode are unchanged keeps
its inode, so the changeset's stat comparison holds. That stream is the jail's word, so every
member is checked before anything is written (:class:`TarRefused`, TOOL_FAILED, otherwise):

* names: under the archive's one top directory, relative, no ``..``, ``.`` or empty component,
  no NUL, each at most once;
* sizes: a member over the profile's ``limits.file_size`` (or :data:`MAX_MEMBER`), more than
  :data:`MAX_TOTAL` bytes or :data:`MAX_MEMBERS` members in all;
* links: a hard link only to a regular file earlier in the same archive (copied, never linked); a
  symlink that points outside the workspace is never created on this host: like a FIFO or a
  device it becomes a change the apply skips (the flags a local copy gives it), unless it names
  the image's system tree by its names (a venv's interpreter): that one is made in the private
  copy, and the changeset judges it by this host as a local copy's (``system-link`` or not);
* nothing is written through a symlink: every parent is opened one component at a time with
  ``O_NOFOLLOW``, and a member must come after its directory.

tarfile's ``data`` filter is not used: it resolves paths with ``realpath`` on this host's file
system and refuses a whole archive for a FIFO; the checks above are lexical and per member.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any

import docker.errors
from docker.types import Mount

from sandbox import datadir
from sandbox.backends.docker.client import connect, quietly, translated
from sandbox.errors import BackendUnavailable, ToolFailed
from sandbox.mounts import Change, Changeset, CopyTree, in_system_tree_lexically, walk
from sandbox.threads import off_loop

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from sandbox.backends.docker.client import Engine
    from sandbox.vocabulary import ChangeStatus as Status

MAX_MEMBER = 1 << 31  # one file, when the profile sets no limits.file_size
MAX_TOTAL = 1 << 34  # all of a copy-out
MAX_MEMBERS = 1_000_000
CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SPECIAL_REASON = "FIFOs, sockets and devices never leave the jail"
_OUTSIDE_REASON = "the symlink points outside the workspace"


class TarRefused(ToolFailed):
    """A copy-out archive with a member we refuse; ``data`` names the member and why."""


def _refuse(name: str, why: str) -> TarRefused:
    return TarRefused(f"the jail's copy-out archive is refused: member {name!r} {why}", member=name, refused=why)


# -- copy-in ---------------------------------------------------------------------------------


def tar_of_tree(root: Path, out: IO[bytes]) -> int:
    """Write ``root``'s entries (not ``root`` itself) to ``out`` as a tar; the member count.

    Symlinks stay symlinks, hard links stay links; devices and sockets are left out (the jail
    gets no device node from the workspace). Owners are numeric: the engine keeps them.
    """
    count = 0
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for rel, _stamp in sorted(walk(root)):
            info = tar.gettarinfo(str(root / rel), arcname=rel)
            if info is None or info.ischr() or info.isblk():
                continue
            info.uname = info.gname = ""
            if info.isreg():
                with open(root / rel, "rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)
            count += 1
    return count


@dataclass
class Carrier:
    """The volume a remote jail's workspace lives in, and the stopped container that reaches it."""

    volume: str
    container: str
    workspace: str

    def mount(self) -> Mount:
        return Mount(target=self.workspace, source=self.volume, type="volume")


_OWN_ROOT = 'chmod "$1" "$3" && chown "$2" "$3"'


def populate(client: docker.DockerClient, image: str, tree: CopyTree, user: str, labels: dict[str, str]) -> Carrier:
    """A volume holding ``tree``'s content with the owners it has, its root the command uid's (blocking)."""
    ws = str(tree.workspace)
    with contextlib.ExitStack() as cleanup_on_fail:
        with translated("cannot create the jail's volume on the remote engine"):
            volume = client.volumes.create(labels=labels)
        cleanup_on_fail.callback(quietly, volume.remove)
        mode = f"{stat.S_IMODE(tree.root.stat().st_mode):o}"
        with translated("cannot create the workspace's carrier container on the remote engine"):
            container = client.containers.create(
                image,
                entrypoint=["/bin/sh", "-c", _OWN_ROOT, "sandbox-own"],
                command=[mode, user, ws],
                user="0:0",
                labels=labels,
                network_mode="none",
                read_only=True,
                cap_drop=["ALL"],
                cap_add=["CHOWN"],
                security_opt=["no-new-privileges"],
                mounts=[Mount(target=ws, source=str(volume.name), type="volume")],
            )
        cleanup_on_fail.callback(quietly, lambda: container.remove(force=True))
        carrier = Carrier(str(volume.name), str(container.id), ws)
        _put_tree(client, carrier, tree.root)
        _own_root(client, carrier)
        cleanup_on_fail.pop_all()
    return carrier


def _put_tree(client: docker.DockerClient, carrier: Carrier, root: Path) -> None:
    # Spooled to a file of ours: memory stays flat whatever the workspace's size.
    with tempfile.TemporaryFile(dir=datadir.subdir("copies")) as spool:
        tar_of_tree(root, spool)
        spool.seek(0)
        with translated("cannot copy the workspace into the remote engine's volume"):
            if not client.api.put_archive(carrier.container, carrier.workspace, spool):
                raise BackendUnavailable("the remote engine refused the workspace's archive", backend="docker")


def _own_root(client: docker.DockerClient, carrier: Carrier) -> None:
    with translated("cannot hand the remote workspace to the jail's user"):
        client.api.start(carrier.container)
        status = client.api.wait(carrier.container, timeout=120).get("StatusCode")
        if status != 0:
            logs = client.api.logs(carrier.container, stdout=True, stderr=True, tail=5)
            text = logs.decode(errors="replace").strip() if isinstance(logs, bytes) else ""
            raise BackendUnavailable(
                f"cannot hand the remote workspace to the jail's user (exit status {status}): {text[:200]}",
                backend="docker",
                container=carrier.container,
            )


# -- copy-out --------------------------------------------------------------------------------


class ChunkReader(io.RawIOBase):
    """A file over an iterator of byte chunks (the SDK's ``get_archive`` stream), for ``tarfile``'s ``r|``."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count


@dataclass
class Limits:
    member: int = MAX_MEMBER
    total: int = MAX_TOTAL
    members: int = MAX_MEMBERS


@dataclass
class Held:
    """A member the archive had and this host never gets: it becomes a change the apply skips."""

    rel: str
    kind: str
    target: str | None = None
    mode: int | None = None


@dataclass
class Sync:
    """What :func:`sync_from_tar` did: members seen, the ones held back, bytes read."""

    seen: set[str] = field(default_factory=set)
    held: list[Held] = field(default_factory=list)
    bytes: int = 0


def check_name(name: str, top: str) -> str | None:
    """A member's path relative to the workspace (``None`` for the top directory itself), or refused."""
    if "\0" in name:
        raise _refuse(name, "has a NUL byte in its name")
    if name.startswith("/"):
        raise _refuse(name, "has an absolute name")
    parts = name.rstrip("/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise _refuse(name, "has an empty, '.' or '..' component")
    if parts[0] != top:
        raise _refuse(name, f"is not under the workspace's directory {top!r}")
    return "/".join(parts[1:]) or None


def points_outside(rel: str, target: str, workspace: str) -> bool:
    """Whether a symlink at ``rel`` naming ``target`` resolves (lexically) outside the workspace."""
    if target.startswith("/"):
        inside = posixpath.normpath(target)
        return not (inside == workspace or inside.startswith(f"{workspace}/"))
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    return joined == ".." or joined.startswith("../")


class _Mirror:
    """Writes the checked members into the private copy; see :func:`sync_from_tar`."""

    def __init__(self, root: Path, workspace: str, limits: Limits, owner: tuple[int, int] | None) -> None:
        self.root = root
        self.workspace = workspace
        self.limits = limits
        self.owner = owner
        self.sync = Sync()
        self.files: set[str] = set()  # regular members so far: hard links may name them
        self.dir_modes: dict[str, int] = {}
        self.fds: dict[str, int] = {}  # directory fds by relative path ("" the root), for the sync

    @contextlib.contextmanager
    def parent(self, rel: str, *, archived: bool = True) -> Iterator[int]:
        """An fd of ``rel``'s directory, reached with O_NOFOLLOW from the root; writable by us.

        With ``archived``, that directory must be one of the archive's, already seen. Directory
        fds are kept for the sync (:meth:`forget` drops those an entry's replacement makes stale).
        """
        folder = posixpath.dirname(rel)
        if archived and folder and folder not in self.dir_modes:
            raise _refuse(rel, f"would be written through {folder!r}, not a directory of the archive seen before it")
        yield self._dir_fd(folder, rel)

    def _dir_fd(self, folder: str, rel: str) -> int:
        if folder in self.fds:
            return self.fds[folder]
        if not folder:
            fd = os.open(self.root, _DIR_FLAGS)
        else:
            above = self._dir_fd(posixpath.dirname(folder), rel)
            try:
                fd = os.open(posixpath.basename(folder), _DIR_FLAGS, dir_fd=above)
            except OSError:
                raise _refuse(rel, f"would be written through {folder!r}, not a directory") from None
        self.fds[folder] = fd
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if os.geteuid() != 0 and mode & 0o700 != 0o700:
            os.fchmod(fd, mode | 0o700)  # a jail's 0500 directory; the final modes come last
        return fd

    def forget(self, rel: str) -> None:
        """``rel`` is about to be replaced or removed: its directory fds (and those below) go stale."""
        for folder in [f for f in self.fds if f == rel or f.startswith(f"{rel}/")]:
            os.close(self.fds.pop(folder))

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def member(self, tar: tarfile.TarFile, member: tarfile.TarInfo, top: str) -> None:
        rel = check_name(member.name, top)
        if rel is None:
            if not member.isdir():
                raise _refuse(member.name, "is the workspace itself but not a directory")
            self.dir_modes[""] = stat.S_IMODE(member.mode)
            return
        if rel in self.sync.seen:
            raise _refuse(member.name, "appears twice")
        self.sync.seen.add(rel)
        self.forget(rel)
        if len(self.sync.seen) > self.limits.members:
            raise _refuse(member.name, f"is past the limit of {self.limits.members} members")
        if member.isreg():
            self._file(tar, member, rel)
        elif member.isdir():
            self._dir(member, rel)
        elif member.issym():
            self._symlink(member, rel)
        elif member.islnk():
            self._hardlink(member, rel, top)
        else:
            self._special(member, rel)

    def _size(self, member: tarfile.TarInfo) -> None:
        if member.size > self.limits.member:
            raise _refuse(member.name, f"is {member.size} bytes, over the limit of {self.limits.member}")
        self.sync.bytes += member.size
        if self.sync.bytes > self.limits.total:
            raise _refuse(member.name, f"takes the archive past {self.limits.total} bytes")

    def _file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, rel: str) -> None:
        self._size(member)
        data = tar.extractfile(member)
        assert data is not None  # a regular member always has its data
        self.files.add(rel)
        name, mode = PurePosixPath(rel).name, stat.S_IMODE(member.mode)
        with self.parent(rel) as pfd:
            if member.size <= CHUNK:  # most files: compared in memory, rewritten only when changed
                content = data.read()
                if not _holds(pfd, name, content, mode):
                    _write_file(pfd, name, io.BytesIO(content), mode, self.owner)
                return
            _write_file(pfd, name, data, mode, self.owner)

    def _dir(self, member: tarfile.TarInfo, rel: str) -> None:
        name = PurePosixPath(rel).name
        with self.parent(rel) as pfd:
            current = _lstat(pfd, name)
            if current is not None and not stat.S_ISDIR(current.st_mode):
                _remove_entry(pfd, name, current)
                current = None
            if current is None:
                os.mkdir(name, 0o700, dir_fd=pfd)
                if self.owner is not None:
                    os.chown(name, *self.owner, dir_fd=pfd, follow_symlinks=False)
        self.dir_modes[rel] = stat.S_IMODE(member.mode)

    def _symlink(self, member: tarfile.TarInfo, rel: str) -> None:
        target = member.linkname
        if not target or "\0" in target:
            raise _refuse(member.name, "is a symlink without a usable target")
        name = PurePosixPath(rel).name
        with self.parent(rel) as pfd:
            current = _lstat(pfd, name)
            if current is not None and stat.S_ISLNK(current.st_mode) and os.readlink(name, dir_fd=pfd) == target:
                return  # unchanged since copy-in (an outside one included: it was there already)
            if points_outside(rel, target, self.workspace) and not self._into_system(rel, target):
                self.sync.held.append(Held(rel, "symlink", target=target))
                return
            if current is not None:
                _remove_entry(pfd, name, current)
            os.symlink(target, name, dir_fd=pfd)
            if self.owner is not None:
                os.chown(name, *self.owner, dir_fd=pfd, follow_symlinks=False)

    def _into_system(self, rel: str, target: str) -> bool:
        """Whether the link names the image's system tree (a venv's ``bin/python3 -> /usr/bin/python3``):
        made in the private copy, where :func:`sandbox.mounts.link_verdict` judges it by this host."""
        return in_system_tree_lexically(posixpath.join(self.workspace, posixpath.dirname(rel), target))

    def _hardlink(self, member: tarfile.TarInfo, rel: str, top: str) -> None:
        try:
            source = check_name(member.linkname, top)
        except TarRefused:
            raise _refuse(member.name, f"is a hard link pointing out of the archive ({member.linkname!r})") from None
        if source is None or source not in self.files:
            raise _refuse(member.name, f"is a hard link to {member.linkname!r}, not a file earlier in the archive")
        with self.parent(source) as spfd:
            fd = os.open(PurePosixPath(source).name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=spfd)
        with os.fdopen(fd, "rb") as data:
            self._size_of_link(member, os.fstat(data.fileno()).st_size)
            self.files.add(rel)
            with self.parent(rel) as pfd:
                _write_file(pfd, PurePosixPath(rel).name, data, stat.S_IMODE(member.mode), self.owner)

    def _size_of_link(self, member: tarfile.TarInfo, size: int) -> None:
        member.size = size
        self._size(member)

    def _special(self, member: tarfile.TarInfo, rel: str) -> None:
        name = PurePosixPath(rel).name
        with self.parent(rel) as pfd:
            current = _lstat(pfd, name)
        kind = {tarfile.FIFOTYPE: stat.S_IFIFO, tarfile.CHRTYPE: stat.S_IFCHR, tarfile.BLKTYPE: stat.S_IFBLK}
        wanted = kind.get(member.type)
        if current is not None and wanted is not None and stat.S_IFMT(current.st_mode) == wanted:
            return  # the same kind of node the workspace had: unchanged
        self.sync.held.append(Held(rel, "special", mode=wanted))

    def finish(self, keep: set[str]) -> None:
        """Remove what the archive no longer has, then give every directory its mode."""
        present = sorted((rel for rel, _ in walk(self.root)), key=lambda r: -r.count("/"))
        for rel in present:
            if rel in keep:
                continue
            self.forget(rel)
            with self.parent(rel, archived=False) as pfd:
                name = PurePosixPath(rel).name
                current = _lstat(pfd, name)
                if current is not None:
                    _remove_entry(pfd, name, current)
        for rel, mode in sorted(self.dir_modes.items(), key=lambda item: -item[0].count("/")):
            fd = self._dir_fd(rel, rel)
            if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
                os.fchmod(fd, mode)


def _lstat(pfd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove_entry(pfd: int, name: str, current: os.stat_result) -> None:
    if stat.S_ISDIR(current.st_mode):
        shutil.rmtree(name, dir_fd=pfd)
    else:
        os.unlink(name, dir_fd=pfd)


def _write_file(pfd: int, name: str, data: IO[bytes], mode: int, owner: tuple[int, int] | None) -> None:
    """Write ``data`` at ``name`` by temp and rename; an identical file (content and mode) stays as it is."""
    current = _lstat(pfd, name)
    temp = f".sbx-{uuid.uuid4().hex[:12]}"
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd)
    try:
        with os.fdopen(fd, "wb", closefd=False) as out:
            shutil.copyfileobj(data, out, CHUNK)
        if current is not None and _same_file(pfd, name, current, fd, mode):
            os.unlink(temp, dir_fd=pfd)  # unchanged: the copy-in's inode and ctime stay
            return
        os.fchmod(fd, mode)
        if owner is not None:
            os.fchown(fd, *owner)
        if current is not None and stat.S_ISDIR(current.st_mode):
            shutil.rmtree(name, dir_fd=pfd)
        os.rename(temp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=pfd)
        raise
    finally:
        os.close(fd)


def _holds(pfd: int, name: str, content: bytes, mode: int) -> bool:
    """Whether ``name`` is a regular file of ``mode`` holding exactly ``content``."""
    current = _lstat(pfd, name)
    if current is None or not stat.S_ISREG(current.st_mode) or stat.S_IMODE(current.st_mode) != mode:
        return False
    if current.st_size != len(content):
        return False
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
    try:
        return os.pread(fd, len(content) + 1, 0) == content
    finally:
        os.close(fd)


def _same_file(pfd: int, name: str, current: os.stat_result, fd: int, mode: int) -> bool:
    """Whether the entry at ``name`` is a regular file of ``mode`` with the content just written to ``fd``."""
    if not stat.S_ISREG(current.st_mode) or stat.S_IMODE(current.st_mode) != mode:
        return False
    if current.st_size != os.fstat(fd).st_size:
        return False
    old = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
    try:
        offset = 0
        while chunk := os.pread(old, CHUNK, offset):
            if os.pread(fd, len(chunk), offset) != chunk:
                return False
            offset += len(chunk)
        return offset == current.st_size
    finally:
        os.close(old)


def sync_from_tar(
    chunks: Iterable[bytes],
    root: Path,
    workspace: str,
    limits: Limits | None = None,
    owner: tuple[int, int] | None = None,
) -> Sync:
    """Make ``root`` (the private copy) the archive's tree of ``workspace``, every member checked first.

    ``chunks`` is ``get_archive``'s stream of ``workspace``: its members are named
    ``<basename>/…``. Members held back (outside symlinks, FIFOs, devices) leave this host's entry
    as it was and are reported in :attr:`Sync.held`. ``owner`` (as root): whom new entries belong to.
    """
    mirror = _Mirror(root, workspace, limits or Limits(), owner)
    top = PurePosixPath(workspace).name
    try:
        with tarfile.open(fileobj=io.BufferedReader(ChunkReader(chunks), CHUNK), mode="r|") as tar:
            for member in tar:
                mirror.member(tar, member, top)
        mirror.finish(mirror.sync.seen)  # a held member's rel keeps this host's entry as it was
    except tarfile.TarError as exc:
        raise TarRefused(f"the jail's copy-out archive is unreadable: {exc}", refused=str(exc)) from exc
    finally:
        mirror.close()
    return mirror.sync


def held_changes(held: Iterable[Held], tree: CopyTree) -> list[Change]:
    """The members a copy-out held back, as the changes a local copy would report for them."""
    changes = []
    for item in held:
        before = tree.copy.get(item.rel)
        status: Status = "added" if before is None else "modified"
        if item.kind == "symlink":
            change = Change(item.rel, status, "symlink", ["symlink-outside"], before.mode if before else None)
            change.target = item.target
            change.applicable, change.reason = False, _OUTSIDE_REASON
        else:
            change = Change(item.rel, status, "special", ["special-file"], before.mode if before else None, item.mode)
            change.applicable, change.reason = False, _SPECIAL_REASON
        changes.append(change)
    return changes


class RemoteTree(CopyTree):
    """A private copy whose jail writes to a remote engine's volume: each changeset reads it back first."""

    recoverable = False  # the jail's writes are on the remote engine's volume, not in this tree
    snapshots = False
    carrier: Carrier | None = None
    engine: Engine | None = None
    limits: Limits | None = None
    owner: tuple[int, int] | None = None

    async def changes(self) -> Changeset:
        sync = await off_loop(self._pull)
        changeset = await super().changes()
        held = held_changes(sync.held, self)
        names = {c.path for c in held}
        changeset.changes = sorted([c for c in changeset.changes if c.path not in names] + held, key=lambda c: c.path)
        return changeset

    def _pull(self) -> Sync:
        assert self.carrier is not None and self.engine is not None
        with contextlib.closing(connect(engine=self.engine)) as client:
            with translated("cannot read the jail's workspace back from the remote engine"):
                stream, _stat = client.api.get_archive(self.carrier.container, self.carrier.workspace, CHUNK)
            with translated("cannot read the jail's workspace back from the remote engine"):
                return sync_from_tar(stream, self.root, self.carrier.workspace, self.limits, self.owner)

    def remove(self) -> None:
        if self.carrier is not None and self.engine is not None:
            with contextlib.suppress(BackendUnavailable):
                self._remove_carrier(self.carrier, self.engine)
        super().remove()

    @staticmethod
    def _remove_carrier(carrier: Carrier, engine: Engine) -> None:
        with contextlib.closing(connect(engine=engine)) as client:
            quietly(lambda: client.api.remove_container(carrier.container, force=True))
            for _ in range(50):  # a per-call container's auto-remove may still hold the volume
                try:
                    client.api.remove_volume(carrier.volume)
                    return
                except docker.errors.NotFound:
                    return
                except docker.errors.APIError as exc:
                    if exc.status_code != 409:
                        return
                time.sleep(0.1)
