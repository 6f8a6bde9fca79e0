"""Environment directories: the dependency and cache trees a profile says are environment, not work.

A profile's ``[mount] environment`` lists them (``.venv``, ``node_modules``, ``target``,
``__pycache__``…). An entry with a ``/`` is a plain path from the workspace's top; a bare name
(no ``/``) is matched at any depth, so ``frontend/node_modules`` and ``pkg/__pycache__`` are
environment too. The outermost match is the directory: ``.venv/lib/…/__pycache__`` belongs to
``.venv``. Nothing under ``.git`` is environment (the repository is its own group).

They are copied like the rest of the workspace and persist across a session's calls (the
session's private copy is kept), but in a changeset each is ONE consent group (see
:mod:`sandbox.changes`): summed up in one line (:func:`summarise`), held back from ``apply``
unless named (``--only .venv``) or included (``--include-environment``). Naming a group consents
to all of it, its flagged entries (a venv's scripts are new executables) included: they are
counted in its line.

**The cross-session cache** (``[mount] environment_cache = "project"``, off by default). After a
copy run whose command succeeded, each environment directory of the private copy is saved in the
data directory under (workspace, directory, SHA-256 of the lock files beside it); at the next
copy-in of that workspace, a directory the host does not have is seeded from the entry whose
lock-file hash is the one the host has now. A seeded directory is *not* in the copy's baseline:
the changeset shows it as added (the host has none), so it still needs consent to reach the
host. A directory with no lock file beside it is never cached (nothing would tell a stale tree
from a fresh one). What a poisoned entry can do: a run of the same workspace with the same lock
files gets a tree an earlier run of it wrote, and may execute it (a trojaned ``.venv/bin/pytest``),
inside the jail only; the key keeps it from any other workspace or dependency set, and the host's
home is never read or written. The cache is capped (:data:`CACHE_LIMIT`), pruned oldest first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol

from sandbox import datadir
from sandbox.mounts.hostfs import run_command

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

GROUP = "environment"
CACHE_LIMIT = 4 * 2**30  # every cached tree together; the oldest go first past it
LOCK_FILES = (
    "pyproject.toml",
    "poetry.lock",
    "uv.lock",
    "Pipfile.lock",
    "setup.py",
    "setup.cfg",
    "package.json",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "Cargo.toml",
    "Cargo.lock",
    "go.mod",
    "go.sum",
)
_LOCK_PREFIXES = ("requirements",)  # requirements.txt, requirements-dev.txt, requirements/…: *.txt
_GIT = ".git"
# Not counted as flagged in a summary: every entry of ``.venv`` is a "dotfile" by its name, and a
# link to the jail's own interpreter is a notice (sandbox.mounts.NOTICE_FLAGS), not a risk.
_UNCOUNTED_FLAGS = frozenset({"dotfile", "system-link"})


# -- which paths are environment ---------------------------------------------------------------------


def group_of(path: str, environment: Iterable[str]) -> str | None:
    """The environment directory ``path`` is in (or is), outermost first; ``None`` when it is work."""
    parts = PurePosixPath(path).parts
    if not parts or parts[0] == _GIT:
        return None
    names = {e for e in environment if "/" not in e}
    paths = {e for e in environment if "/" in e}
    for depth in range(1, len(parts) + 1):
        prefix = "/".join(parts[:depth])
        if parts[depth - 1] in names or prefix in paths:
            return prefix
    return None


def groups(paths: Iterable[str], environment: Sequence[str]) -> dict[str, list[str]]:
    """The environment directories among ``paths``, each with its paths (the directory's own included)."""
    found: dict[str, list[str]] = {}
    if not environment:
        return found
    for path in paths:
        root = group_of(path, environment)
        if root is not None:
            found.setdefault(root, []).append(path)
    return found


# -- one line per directory ------------------------------------------------------------------------


class ChangeLike(Protocol):
    """What :func:`summarise` reads of a change (:class:`sandbox.mounts.Change` has it)."""

    @property
    def path(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def size(self) -> int | None: ...
    @property
    def flags(self) -> list[str]: ...


@dataclass(frozen=True)
class EnvSummary:
    """One environment directory of a changeset: its packages, files and bytes (as the jail left them)."""

    name: str
    packages: int
    files: int
    bytes: int
    flagged: int = 0
    deleted: int = 0

    def line(self) -> str:
        """``.venv: 31 packages, 2,978 files, 41 MiB -- environment, not applied unless asked (…)``."""
        what = [_count(self.packages, "package")] if self.packages else []
        what += [_count(self.files, "file"), human_bytes(self.bytes)]
        if self.deleted:
            what.append(f"{self.deleted:,} deleted")
        if self.flagged:
            what.append(f"{self.flagged:,} flagged (new executables, setuid, hard links…: sandbox changes show)")
        return (
            f"{self.name}: {', '.join(what)} -- environment, not applied unless asked "
            f"(--only {self.name} or --include-environment)"
        )


def summarise(entries: Iterable[ChangeLike], tree_root: str) -> EnvSummary:
    """The changes under the environment directory ``tree_root`` (a workspace-relative path), summed up.

    Pure: only the entries are read. Packages are counted from what installers leave: a Python
    distribution's ``*.dist-info`` (or ``*.egg-info``) directory, an npm package's
    ``node_modules/<pkg>/package.json`` (``node_modules/@scope/<pkg>/package.json``).
    """
    packages: set[str] = set()
    files = size = flagged = deleted = 0
    for change in entries:
        if change.status == "deleted":
            deleted += 1
            continue
        if set(change.flags) - _UNCOUNTED_FLAGS:
            flagged += 1
        if change.kind == "file":
            files += 1
            size += change.size or 0
        if (package := _package(change.path)) is not None:
            packages.add(package)
    return EnvSummary(tree_root, len(packages), files, size, flagged, deleted)


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}" if number == 1 else f"{number:,} {noun}s"


def _package(path: str) -> str | None:
    parts = PurePosixPath(path).parts
    for depth, part in enumerate(parts):
        if part.endswith((".dist-info", ".egg-info")):
            return "/".join(parts[: depth + 1])
    if parts[-1:] == ("package.json",) and len(parts) >= 3:
        owner = parts[-3] if not parts[-2].startswith("@") else None
        if owner == "node_modules" or (len(parts) >= 4 and parts[-4] == "node_modules" and parts[-3][:1] == "@"):
            return "/".join(parts[:-1])
    return None


def human_bytes(count: int) -> str:
    """Binary units, whole above ten: ``41 MiB``, ``2.5 KiB``, ``512 B``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" or value >= 10 else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


# -- the cross-session cache ---------------------------------------------------------------------


@dataclass(frozen=True)
class CacheKey:
    """Where one environment directory of one workspace is cached, for one set of lock files."""

    workspace: str  # the workspace's real path
    rel: str
    locks: str  # SHA-256 of the lock files beside the directory

    @property
    def path(self) -> Path:
        ws = hashlib.sha256(self.workspace.encode()).hexdigest()[:16]
        name = hashlib.sha256(self.rel.encode()).hexdigest()[:16]
        return cache_root() / ws / f"{name}-{self.locks[:32]}"


def cache_root() -> Path:
    return datadir.subdir("envcache")


def lock_hash(workspace: Path, rel: str) -> str | None:
    """The SHA-256 of the lock files in the directory holding ``rel`` (read unfollowed); ``None``: none."""
    parent = workspace.joinpath(*PurePosixPath(rel).parts[:-1])
    try:
        names = sorted(n for n in os.listdir(parent) if _is_lock_file(n))
    except OSError:
        return None
    digest, found = hashlib.sha256(), False
    for name in names:
        try:
            fd = os.open(parent / name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue  # a link, a directory, unreadable: not a lock file we can vouch for
        with os.fdopen(fd, "rb") as fh:
            digest.update(f"{name}\0".encode())
            digest.update(hashlib.sha256(fh.read()).digest())
            found = True
    return digest.hexdigest() if found else None


def _is_lock_file(name: str) -> bool:
    return name in LOCK_FILES or (name.startswith(_LOCK_PREFIXES) and name.endswith(".txt"))


def key_for(workspace: Path, rel: str) -> CacheKey | None:
    locks = lock_hash(workspace, rel)
    return CacheKey(os.path.realpath(workspace), rel, locks) if locks is not None else None


def seed(workspace: Path, root: Path) -> list[str]:
    """Seed the private copy ``root`` with this workspace's cached directories the host does not have.

    Only an entry whose lock-file hash is the host's now is used. Returns the seeded paths.
    """
    seeded = []
    for rel in _cached_dirs(workspace):
        key = key_for(workspace, rel)
        if key is None or not (key.path / "tree").is_dir() or os.path.lexists(workspace / rel):
            continue
        source = key.path / "tree"
        target = root.joinpath(*PurePosixPath(rel).parts)
        if not target.parent.is_dir() or target.parent.is_symlink() or os.path.lexists(target):
            continue  # its parent is not in the copy as a real directory: nothing is seeded through a link
        if _cp(source, target) == "":
            seeded.append(rel)
            with contextlib.suppress(OSError):
                os.utime(key.path / "meta.json")  # recently used: pruned last
    return seeded


def save(workspace: Path, root: Path, environment: Sequence[str], limit: int = CACHE_LIMIT) -> list[str]:
    """Save the environment directories of the private copy ``root`` in the cache; the saved paths."""
    saved = []
    for rel in find(root, environment):
        key = key_for(workspace, rel)
        if key is None:
            continue  # no lock file beside it: nothing would tell a stale tree from a fresh one
        if _store(root / rel, key):
            saved.append(rel)
    prune(limit)
    return saved


def find(root: Path, environment: Sequence[str]) -> list[str]:
    """The environment directories in the tree ``root`` (outermost only; no link followed, no ``.git``)."""
    found = []
    for dirpath, dirs, _files in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        for name in list(dirs):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if rel == _GIT or os.path.islink(os.path.join(dirpath, name)):
                dirs.remove(name)
            elif group_of(rel, environment) == rel:
                found.append(rel)
                dirs.remove(name)
    return sorted(found)


def _store(source: Path, key: CacheKey) -> bool:
    """Copy ``source`` into the cache under ``key``, replacing what was there, as one rename."""
    entry = key.path
    entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = entry.parent / f".partial-{uuid.uuid4().hex[:12]}"
    partial.mkdir(mode=0o700)
    try:
        if _cp(source, partial / "tree") != "":
            return False
        meta = {"workspace": key.workspace, "dir": key.rel, "locks": key.locks, "saved": time.time()}
        (partial / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        _remove(entry)
        os.rename(partial, entry)
        return True
    finally:
        _remove(partial)


def _cached_dirs(workspace: Path) -> list[str]:
    """The directories cached for ``workspace`` (any lock-file hash), from their ``meta.json``."""
    ws = hashlib.sha256(os.path.realpath(workspace).encode()).hexdigest()[:16]
    found = set()
    with contextlib.suppress(OSError):
        for entry in (cache_root() / ws).iterdir():
            with contextlib.suppress(OSError, ValueError, KeyError):
                meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
                rel = str(meta["dir"])
                if not PurePosixPath(rel).is_absolute() and ".." not in PurePosixPath(rel).parts:
                    found.add(rel)
    return sorted(found)


def prune(limit: int = CACHE_LIMIT) -> list[Path]:
    """Remove the least recently used cached trees until all of them fit in ``limit`` bytes."""
    entries = []
    with contextlib.suppress(OSError):
        for ws in cache_root().iterdir():
            for entry in ws.iterdir():
                used = _mtime(entry / "meta.json")
                entries.append((used, datadir.opened_up_bytes(entry), entry))
    total = sum(size for _used, size, _entry in entries)
    removed = []
    for _used, size, entry in sorted(entries):
        if total <= limit:
            break
        _remove(entry)
        total -= size
        removed.append(entry)
    return removed


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0  # a partial or broken entry: the first to go


def _cp(source: Path, target: Path) -> str:

    return run_command(["cp", "-a", "--reflink=auto", "--no-target-directory", str(source), str(target)])


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        datadir.remove_tree(path)
