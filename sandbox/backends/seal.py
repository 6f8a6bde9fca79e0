"""Secrets and git internals sealed at the OS level, for Bash as for the file tools.

The file tools refuse the profile's deny-read paths (``.env``, ``*.pem``, ``*.key`` ...), but a
command could ``cat .env``. When a jail starts, every workspace entry matching those globs is
**masked**: an empty file or directory is bound read-only over it, so a read gets nothing and a
write, rename or unlink of it fails (``EROFS``/``EBUSY``); a hard link to it crosses a mount
(``EXDEV``); a symlink to it or a ``..`` path reaches the mask. In ``rw`` mode what the host's
git executes or obeys later is bound **read-only** (:func:`git_binds`, the list in
:func:`sandbox.mounts.gitobeyed.obeyed`): every git directory's ``config``, ``hooks``, ``info``,
``objects/info`` (alternates), ``commondir``, ``worktrees``, the submodules' under
``.git/modules``, ``core.hooksPath``'s directory in the worktree, hook managers' files (``.husky``,
``lefthook.yml``, ``.pre-commit-config.yaml``), ``.gitmodules`` and the ``.git`` files of
submodules and worktrees; each git directory and every directory above a sealed path is bound onto
itself, so that it cannot be renamed away and replaced by a directory with a planted hook. What a
writable ``.git`` still lets a jail create (a ``commondir`` where there was none, a rebase todo) is
moved to a quarantine once the call has ended (:mod:`sandbox.gitsweep`); docs/threat-model.md says
what is left (a new nested repository).
In ``copy`` mode masked entries are not copied at all (nor reported as changes).

**A seal that moves.** A jail searches again before each call (:class:`Watch`; cheap, cached) and
masks what appeared since it was built: a secret created on the host, or written by an earlier
call (a warm jail is then replaced by one sealed anew). A session's shared directories (plugin
directories, :mod:`sandbox.plugins`) are bound read-only and sealed the same way
(:func:`shared_binds`).

What this cannot cover: an entry created while a call runs (a secret the command writes
itself is readable by that same command), a second hard link to a secret under a name no glob
matches, a symlink named like a secret (left alone: it is not the secret; its target is judged
by its own name), and the user's own rules (``sandbox policy``), which the gate applies to the
file tools only: the jail knows the profile's globs.

**The search is cached**, as git caches ``stat`` data in its index and directory listings in its
untracked cache: a walk of a 50,000-file workspace costs tens of milliseconds, at every jail and
every ``sandbox run``. A search leaves a record per directory entered: its ``st_dev``,
``st_ino``, ``st_mtime_ns`` and ``st_ctime_ns``, the masked entries directly in it and the
sub-directories it entered. The next search calls ``lstat`` on each recorded directory, parents
first, and lists again only those whose four values moved (and the new sub-directories they name).

What the cache trusts: **a directory's entries (names and types) change only with its mtime and
ctime**. The kernel updates both on every create, unlink and rename in it, and a type cannot
change in place (a file becomes a directory by unlink then mkdir). ``touch -d`` can put an mtime
back but not a ctime (only a change of the system clock can); a directory moved away and back
has a new ctime (Linux sets it on the renamed inode), one replaced by another a new ``st_ino`` or
ctime, a mount over one a new ``st_dev``. A directory is listed through the very descriptor that
``fstat`` reads its times from: a swap between the two cannot pair one directory's times with
another's entries. Where that rule may not hold, nothing is trusted:

- a *racy* directory (git's word), whose mtime or ctime is less than :data:`RACY_NS` (2 s)
  before the search started, could change again within the same timestamp tick (coarse clocks,
  1 s or 2 s file systems) without its times moving: it is listed again at the next search;
- a directory on a file system whose times another machine or process sets (NFS, SMB, FUSE, 9p,
  virtiofs ...): only devices that ``/proc/self/mountinfo`` (read at each search) names with a
  type in :data:`TRUSTED_FILE_SYSTEMS` are trusted; elsewhere, and with no ``/proc`` (macOS),
  every search walks the whole workspace as it did before the cache;
- a cache file that is damaged, forged, not ours or kept inside the workspace is ignored and
  rewritten (:mod:`sandbox.backends.seal_cache` keeps the records, in memory and on disk).

So a secret created before the jail opens is masked whatever the cache holds: the directory it
was created, renamed or moved into had its ctime moved (or too recently to judge), and is listed
again.

Standard library only: ``sandbox run``'s quick path builds its jail with it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import stat
import time
from typing import TYPE_CHECKING, NamedTuple

from sandbox.backends import seal_cache
from sandbox.errors import InvalidArgument
from sandbox.patterns import DEFAULT_DENY_READ, NameSet, PatternSet

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from pathlib import Path

    from sandbox.backends.seal_cache import Tree
    from sandbox.profile import Profile

NOT_SEARCHED = frozenset({".git", "node_modules", ".venv", "venv", "__pycache__"})
"""Directories never entered: git's objects carry no names (what git obeys is bound read-only
instead, :func:`git_binds`; a directory holding a ``.git`` is recorded as a repository), and
dependency trees are thousands of files (the search of a large project's would cost more than its
whole ``sandbox run``) holding packages, not the user's secrets. The file tools still refuse a
deny-read path there."""
MAX_MASKS = 4096
"""More secrets than this in one workspace is refused rather than half sealed."""
RACY_NS = 2_000_000_000
"""A directory changed this recently (mtime or ctime) is listed again at the next search."""
TRUSTED_FILE_SYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "overlay", "zfs", "f2fs", "bcachefs", "jfs"}
)
"""Local file systems whose directory times this kernel sets itself on every change."""


class Seal(NamedTuple):
    masked: tuple[tuple[str, bool], ...]  # workspace-relative path, is a directory
    git: bool  # the workspace has a .git directory
    nested: tuple[str, ...] = ()  # directories below the root holding a .git: repositories git obeys there

    @property
    def masked_paths(self) -> tuple[str, ...]:
        return tuple(rel for rel, _ in self.masked)


class TooManySecrets(Exception):
    pass


class _Globs:
    """The deny-read globs, judged on a workspace entry."""

    def __init__(self, every: Sequence[str], root: str) -> None:
        # Bare globs (".env", "*.pem", most of them) are judged on the name alone: one regex per entry.
        self.names = NameSet(p for p in every if "/" not in p.lstrip("!") and not p.startswith("~"))
        self.paths = PatternSet([p for p in every if "/" in p.lstrip("!") and not p.startswith("~")], ())
        self.by_path = any(not p.startswith("!") for p in self.paths.patterns)
        self.root = root

    def hit_path(self, rel: str) -> bool:
        """Globs with a ``/`` (``vault/**``), on the workspace-relative path and the path as given."""
        return self.paths.matches(rel) or self.paths.matches(os.path.join(self.root, rel))


@functools.lru_cache(maxsize=64)
def _globs(every: tuple[str, ...], root: str) -> _Globs:
    """Compiled once per glob list and root: a jail searches again before every call."""
    return _Globs(every, root)


def find(workspace: Path | str, deny_read: Iterable[str] = ()) -> Seal:
    """The entries of ``workspace`` to mask: those matching the default and ``deny_read`` globs.

    A directory that matches is masked whole and not entered; symlinks are never followed nor
    masked; the :data:`NOT_SEARCHED` directories are not entered. Each directory is listed again
    only when it changed since the last search (see the module doc).
    """
    root = os.fspath(workspace)
    every = (*DEFAULT_DENY_READ, *deny_read)
    real = os.path.realpath(root)
    key = json.dumps([seal_cache.CACHE_FORMAT, seal_cache.code_version(), real, root, every])
    kept = seal_cache.cache_file(key, real)
    known = seal_cache.CACHE.recall(key, kept)
    search = _Search(root, _globs(every, root), known)
    tree = search.run()
    if search.changed or len(tree) != len(known):
        seal_cache.CACHE.keep(key, tree, kept)
    git = os.path.isdir(os.path.join(root, ".git")) and not os.path.islink(os.path.join(root, ".git"))
    nested = tuple(sorted(rel for rel, found in tree.items() if rel and found.repo))
    return Seal(tuple(sorted(search.masked)), git, nested)


def sealed(workspace: Path | str, deny_read: Iterable[str], rel: str) -> bool:
    """Whether the workspace entry ``rel``, or a directory above it, matches the deny-read globs: what
    a jail's seal masks, written by a call or not (a session snapshot leaves it out)."""
    globs = _globs((*DEFAULT_DENY_READ, *deny_read), os.fspath(workspace))
    parts = rel.split("/")
    return any(
        globs.names.matches(name) or (globs.by_path and globs.hit_path("/".join(parts[: i + 1])))
        for i, name in enumerate(parts)
    )


class _Search:
    """One search: each directory reused from ``known`` while its times hold, else listed."""

    def __init__(self, root: str, globs: _Globs, known: Tree) -> None:
        self.root, self.globs, self.known = root, globs, known
        self.started = time.time_ns()  # before any stat: what changes after it is never trusted
        self.devices = _trusted_devices()
        self.masked: list[tuple[str, bool]] = []
        self.changed = False

    def run(self) -> Tree:
        tree: Tree = {}
        pending = [""]
        while pending:
            rel = pending.pop()
            found = self.visit(rel)
            if found is None:
                continue
            tree[rel] = found
            prefix = f"{rel}/" if rel else ""
            if found.masked:
                self.masked += [(prefix + name, is_dir) for name, is_dir in found.masked]
                if len(self.masked) > MAX_MASKS:
                    raise TooManySecrets(f"more than {MAX_MASKS} workspace entries match the deny-read globs")
            if found.entered:
                pending += [prefix + name for name in found.entered]
        return tree

    def visit(self, rel: str) -> seal_cache.DirRecord | None:
        path = f"{self.root}/{rel}" if rel else self.root
        cached = self.known.get(rel)
        if cached is not None and cached.trusted:
            try:
                st = os.stat(path, follow_symlinks=not rel)
            except OSError:
                return None
            same = st.st_ctime_ns == cached.ctime and st.st_mtime_ns == cached.mtime and st.st_ino == cached.ino
            if same and st.st_dev == cached.dev and stat.S_ISDIR(st.st_mode) and st.st_dev in self.devices:
                return cached
        found = self.list(path, rel)
        if found != cached:
            self.changed = True
        return found

    def list(self, path: str, rel: str) -> seal_cache.DirRecord | None:
        # One descriptor for the fstat and the listing: the times recorded are this listing's.
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (os.O_NOFOLLOW if rel else 0)
        try:
            fd = os.open(path, flags)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            masked, entered, repo = self.entries(fd, rel)
        except OSError:
            return None
        finally:
            os.close(fd)
        racy = max(st.st_mtime_ns, st.st_ctime_ns) > self.started - RACY_NS
        trusted = not racy and st.st_dev in self.devices
        return seal_cache.DirRecord(
            st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, trusted, masked, entered, repo
        )

    def entries(self, fd: int, rel: str) -> tuple[tuple[tuple[str, bool], ...], tuple[str, ...], bool]:
        masked: list[tuple[str, bool]] = []
        entered: list[str] = []
        repo = False
        prefix = f"{rel}/" if rel else ""
        by_name, by_path = self.globs.names.matches, self.globs.by_path  # the hot loop: every entry
        with os.scandir(fd) as listing:
            for entry in listing:
                name = entry.name
                hit = by_name(name) or (by_path and self.globs.hit_path(prefix + name))
                try:  # from the directory entry's type: no stat per file
                    is_dir = entry.is_dir(follow_symlinks=False)
                    if hit and not (is_dir or entry.is_file(follow_symlinks=False)):
                        continue  # a symlink, a socket...: never masked (see the module doc)
                except OSError:
                    continue
                if hit:
                    masked.append((name, is_dir))
                elif is_dir and name not in NOT_SEARCHED:
                    entered.append(name)
                elif name == ".git":  # a directory or a gitdir file
                    repo = True
        return tuple(masked), tuple(entered), repo


def _trusted_devices() -> frozenset[int]:
    """The devices mounted with a file system of :data:`TRUSTED_FILE_SYSTEMS` (none without /proc).

    Read at every search: a long-lived process sees mounts come and go (and device numbers reused)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
            lines = mounts.read().splitlines()
    except OSError:
        return frozenset()
    found: set[int] = set()
    for line in lines:
        fields = line.split()
        with contextlib.suppress(ValueError, IndexError):  # "id parent major:minor root point ... - type ..."
            if fields[fields.index("-", 6) + 1] in TRUSTED_FILE_SYSTEMS:
                major, minor = fields[2].split(":")
                found.add(os.makedev(int(major), int(minor)))
    return frozenset(found)


def binds(workspace: str, seal: Seal, empty_dir: str, empty_file: str, *, rw: bool) -> list[tuple[str, str, bool]]:
    """``(source, target, read-only)`` binds after the workspace's own: (``rw``) git's protected
    paths, then the masks. bwrap takes them in this order; Docker mounts parents first anyway."""
    found = git_binds(workspace, seal.nested) if rw else []
    found += [(empty_dir if is_dir else empty_file, f"{workspace}/{rel}", True) for rel, is_dir in seal.masked]
    return found


def git_binds(workspace: str, nested: Sequence[str] = ()) -> list[tuple[str, str, bool]]:
    """(``rw``) What the host's git obeys, read-only (:func:`sandbox.mounts.gitobeyed.obeyed`): each git
    directory's config, hooks, info, alternates, ``commondir`` and worktrees, ``core.hooksPath``'s
    directory, hook managers' files, submodules' and worktrees' ``.git`` files; the same for each
    ``nested`` repository (a directory holding a ``.git``, found by the search). The git directories
    and every directory above a sealed path are bound onto themselves first: a mount point cannot
    be renamed away and replaced by a directory holding a planted copy."""
    from pathlib import Path

    from sandbox.mounts import gitobeyed  # imported here: most jails are not rw repositories

    found = gitobeyed.obeyed(Path(workspace), nested)
    for rel in found.missing:
        _make_dir(f"{workspace}/{rel}")
    for rel in found.missing_files:
        _make_dir(os.path.dirname(f"{workspace}/{rel}"))
        _make_empty_file(f"{workspace}/{rel}")
    every = (*found.protected, *found.missing, *found.missing_files)
    sealed = [rel for rel in every if _sealable(f"{workspace}/{rel}")]
    anchors = {*found.gitdirs, *(parent for rel in sealed for parent in _parents(rel))}
    return [
        *((f"{workspace}/{rel}", f"{workspace}/{rel}", False) for rel in sorted(anchors, key=_depth)),
        *((f"{workspace}/{rel}", f"{workspace}/{rel}", True) for rel in sealed),
    ]


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _depth(rel: str) -> tuple[int, str]:
    return rel.count("/"), rel


def _sealable(path: str) -> bool:
    """A file or directory, not a link (a link is data: its target is sealed by its own name or not at all)."""
    return not os.path.islink(path) and (os.path.isdir(path) or os.path.isfile(path))


def bwrap_args(workspace: str, seal: Seal, empty_dir: str, empty_file: str, *, rw: bool) -> list[str]:
    """bwrap arguments, after the workspace's own bind: see :func:`binds`."""
    return [
        arg
        for source, target, read_only in binds(workspace, seal, empty_dir, empty_file, rw=rw)
        for arg in ("--ro-bind" if read_only else "--bind", source, target)
    ]


def for_profile(profile: Profile, workspace: Path) -> Seal:
    """The workspace's entries to mask under ``profile``, as a structured refusal when there are too many."""
    try:
        return find(workspace, profile.policy.deny_read)
    except TooManySecrets as exc:
        raise InvalidArgument(f"{exc}; narrow policy.deny_read or move them out", workspace=str(workspace)) from exc


def _make_dir(path: str) -> None:
    """git's own layout (``hooks``, ``info``), or ``core.hooksPath``'s directory: it must exist to
    be bound read-only (else the jail could make it).

    Owned as its parent is (root making it in a user's repository gives it to that user); where we
    may not create it, neither may the jail's user.
    """
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        _make_dir(parent)
    try:
        os.mkdir(path, 0o755)
        owner = os.stat(parent)
        if os.geteuid() == 0:
            os.chown(path, owner.st_uid, owner.st_gid)
    except OSError:
        pass


def _searched(root: str | Path, deny_read: Iterable[str]) -> Seal:
    """:func:`find`, with too many secrets as a structured refusal."""
    try:
        return find(root, deny_read)
    except TooManySecrets as exc:
        raise InvalidArgument(f"{exc}; narrow policy.deny_read or move them out", directory=str(root)) from exc


def shared_binds(
    shared: Sequence[tuple[str, str]], deny_read: Iterable[str], empty_dir: str, empty_file: str
) -> list[tuple[str, str, bool]]:
    """``(source, target, read-only)``: each shared directory (a session's plugin directories,
    already resolved) read-only at its jail path, then its secrets masked there as the
    workspace's are (the same globs, the same cached search)."""
    globs = tuple(deny_read)
    found: list[tuple[str, str, bool]] = []
    for source, target in shared:
        found.append((source, target, True))
        masked = _searched(source, globs).masked
        found += [(empty_dir if is_dir else empty_file, f"{target}/{rel}", True) for rel, is_dir in masked]
    return found


def shared_bwrap_args(
    shared: Sequence[tuple[str, str]], deny_read: Iterable[str], empty_dir: str, empty_file: str
) -> list[str]:
    """bwrap arguments of :func:`shared_binds`."""
    return [
        arg
        for source, target, _ in shared_binds(shared, deny_read, empty_dir, empty_file)
        for arg in ("--ro-bind", source, target)
    ]


class Watch:
    """A jail's seal, searched again before each of its calls: a secret that appeared since the
    jail was built (created on the host, or written by an earlier call) is masked for the next call.

    :meth:`changed` gives the workspace's seal as it is now when it, or a shared directory's masks,
    moved since the last time; the jail then rebuilds its mounts (a warm jail is replaced). The
    search is the cached one (:func:`find`): a ``stat`` per directory when nothing moved. What the
    jail sees decides what is searched: the workspace in ``ro``/``rw``; in ``copy`` the private
    copy (host changes never reach it), whose masks add to those the copy left out; in ``overlay``
    the workspace (the live lower layer) and the upper layer (what the calls wrote).
    """

    def __init__(
        self,
        deny_read: Iterable[str],
        strategy: str,
        workspace: Path,
        source: Path,
        sealed: Seal,
        shared: Sequence[tuple[str, str]] = (),
        upper: Path | None = None,
    ) -> None:
        self.deny_read = tuple(deny_read)
        self.strategy, self.workspace, self.source, self.upper = strategy, workspace, source, upper
        self.left_out = sealed.masked if strategy == "copy" else ()  # their mount points stay masked
        self.sealed = sealed
        self.dirs = tuple(source for source, _ in shared)
        self.shared = self._shared()

    def _shared(self) -> tuple[tuple[tuple[str, bool], ...], ...]:
        return tuple(_searched(folder, self.deny_read).masked for folder in self.dirs)

    def _workspace(self) -> Seal:
        if self.strategy == "copy":
            copy = _searched(self.source, self.deny_read)
            return self.sealed._replace(masked=tuple(sorted({*copy.masked, *self.left_out})))
        found = _searched(self.workspace, self.deny_read)
        if self.strategy == "overlay" and self.upper is not None:
            written = _searched(self.upper, self.deny_read)
            found = found._replace(masked=tuple(sorted({*found.masked, *written.masked})))
        return found

    # A search this quick costs the event loop less than a worker thread's round trip (0.3-0.6 ms
    # measured per call): it runs inline. The first search after a jail opens is cached and cheap.
    QUICK_S = 0.002
    quick = True  # the last search was under QUICK_S

    def changed(self) -> Seal | None:
        """The workspace's seal now, when it or a shared directory's masks moved; else ``None``."""
        started = time.monotonic()
        sealed, shared = self._workspace(), self._shared()
        self.quick = time.monotonic() - started < self.QUICK_S
        if sealed == self.sealed and shared == self.shared:
            return None
        self.sealed, self.shared = sealed, shared
        return sealed


def watch(
    profile: Profile, workspace: Path, source: Path, tree: object, sealed: Seal, shared: Sequence[tuple[str, str]]
) -> Watch:
    """The :class:`Watch` of a jail built with ``sealed`` over ``source`` (the workspace or its
    private ``tree``: an overlay's ``upper`` layer is searched too)."""
    upper = getattr(tree, "upper", None)
    strategy = profile.mount.strategy
    return Watch(profile.policy.deny_read, strategy, workspace, source, sealed, shared, upper)


def _make_empty_file(path: str) -> None:
    """An empty config file (git reads it as no keys: ``config.worktree``, an included file), owned
    as its directory: see :func:`_make_dir`."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
        owner = os.stat(os.path.dirname(path))
        if os.geteuid() == 0:
            os.chown(path, owner.st_uid, owner.st_gid)
    except OSError:
        pass


def copy_exclusions(seal: Seal) -> Sequence[str]:
    """What a private copy leaves out: the masked entries (the jail masks their mount points)."""
    return seal.masked_paths
