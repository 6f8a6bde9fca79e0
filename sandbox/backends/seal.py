"""Secrets and git internals sealed at the OS level, for Bash as for the file tools.

The file tools refuse the profile's deny-read paths (``.env``, ``*.pem``, ``*.key`` ...), but a
command could ``cat .env``. When a jail starts, every workspace entry matching those globs is
**masked**: an empty file or directory is bound read-only over it, so a read gets nothing and a
write, rename or unlink of it fails (``EROFS``/``EBUSY``); a hard link to it crosses a mount
(``EXDEV``); a symlink to it or a ``..`` path reaches the mask. In ``rw`` mode the git internals
that the host's git executes or obeys later (``.git/hooks``, ``.git/config``, whose
``core.hooksPath`` and filters name programs) are bound **read-only**, and ``.git`` is bound
onto itself so that it cannot be renamed away and replaced by a directory with a planted hook.
In ``copy`` mode masked entries are not copied at all (nor reported as changes).

What this cannot cover: an entry created after the jail started (a secret the command writes
itself), a second hard link to a secret under a name no glob matches, a symlink named like a
secret (left alone: it is not the secret; its target is judged by its own name), and the user's
own rules (``sandbox policy``), which the gate applies to the file tools only: the jail knows
the profile's globs.

Standard library only: ``sandbox run``'s quick path builds its jail with it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple

from sandbox.errors import InvalidArgument
from sandbox.patterns import DEFAULT_DENY_READ, NameSet, PatternSet

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from pathlib import Path

    from sandbox.profile import Profile

GIT_READONLY = ("hooks", "config")
"""Inside ``.git``: bound read-only in ``rw`` mode (seed 000's protected write paths)."""
NOT_SEARCHED = frozenset({".git", "node_modules", ".venv", "venv", "__pycache__"})
"""Directories never entered: git's objects carry no names (hooks and config are bound read-only
instead), and dependency trees are thousands of files (the search of a large project's would cost
more than its whole ``sandbox run``) holding packages, not the user's secrets. The file tools
still refuse a deny-read path there."""
MAX_MASKS = 4096
"""More secrets than this in one workspace is refused rather than half sealed."""


class Seal(NamedTuple):
    masked: tuple[tuple[str, bool], ...]  # workspace-relative path, is a directory
    git: bool  # the workspace has a .git directory

    @property
    def masked_paths(self) -> tuple[str, ...]:
        return tuple(rel for rel, _ in self.masked)


class TooManySecrets(Exception):
    pass


def find(workspace: Path | str, deny_read: Iterable[str] = ()) -> Seal:
    """The entries of ``workspace`` to mask: those matching the default and ``deny_read`` globs.

    A directory that matches is masked whole and not entered; symlinks are never followed nor
    masked; the :data:`NOT_SEARCHED` directories are not entered.
    """
    root = os.fspath(workspace)
    every = (*DEFAULT_DENY_READ, *deny_read)
    # Bare globs (".env", "*.pem", most of them) are judged on the name alone: one regex per entry.
    names = NameSet(p for p in every if "/" not in p.lstrip("!") and not p.startswith("~"))
    paths = PatternSet([p for p in every if "/" in p.lstrip("!") and not p.startswith("~")], ())
    by_path = any(not p.startswith("!") for p in paths.patterns)
    masked: list[tuple[str, bool]] = []
    pending = [root]
    start = len(root) + 1
    while pending:
        folder = pending.pop()
        try:
            entries = os.scandir(folder)
        except OSError:
            continue
        with entries:
            for entry in entries:
                name = entry.name
                hit = names.matches(name)
                if not hit and by_path:
                    hit = paths.matches(entry.path[start:]) or paths.matches(entry.path)
                try:  # from the directory entry's type: no stat per file
                    is_dir = entry.is_dir(follow_symlinks=False)
                    if hit and not (is_dir or entry.is_file(follow_symlinks=False)):
                        continue  # a symlink, a socket...: never masked (see the module doc)
                except OSError:
                    continue
                if hit:
                    masked.append((entry.path[start:], is_dir))
                    if len(masked) > MAX_MASKS:
                        raise TooManySecrets(f"more than {MAX_MASKS} workspace entries match the deny-read globs")
                elif is_dir and name not in NOT_SEARCHED:
                    pending.append(entry.path)
    git = os.path.isdir(os.path.join(root, ".git")) and not os.path.islink(os.path.join(root, ".git"))
    return Seal(tuple(sorted(masked)), git)


def binds(workspace: str, seal: Seal, empty_dir: str, empty_file: str, *, rw: bool) -> list[tuple[str, str, bool]]:
    """``(source, target, read-only)`` binds after the workspace's own: (``rw``) git's protected
    paths, then the masks. bwrap takes them in this order; Docker mounts parents first anyway."""
    found: list[tuple[str, str, bool]] = []
    if rw and seal.git:
        git = f"{workspace}/.git"
        found.append((git, git, False))  # a mount point: it cannot be renamed away and replaced
        for name in GIT_READONLY:
            path = f"{git}/{name}"
            if name == "hooks" and not os.path.lexists(path):
                _make_hooks_dir(path)
            if not os.path.islink(path) and (os.path.isdir(path) or os.path.isfile(path)):
                found.append((path, path, True))
    found += [(empty_dir if is_dir else empty_file, f"{workspace}/{rel}", True) for rel, is_dir in seal.masked]
    return found


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


def _make_hooks_dir(path: str) -> None:
    """git's own layout: a hooks directory must exist to be bound read-only (else one could be made).

    Owned as ``.git`` is (root making it in a user's repository gives it to that user); where we
    may not create it, neither may the jail's user.
    """
    try:
        os.mkdir(path, 0o755)
        owner = os.stat(os.path.dirname(path))
        if os.geteuid() == 0:
            os.chown(path, owner.st_uid, owner.st_gid)
    except OSError:
        pass


def copy_exclusions(seal: Seal) -> Sequence[str]:
    """What a private copy leaves out: the masked entries (the jail masks their mount points)."""
    return seal.masked_paths
