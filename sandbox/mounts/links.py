"""Where a symlink leads when followed, judged in the host's view and the private tree's.

Inside the workspace it is applied like a file; into the read-only system tree the jail was given
(:data:`SYSTEM_TREES`: a venv's ``bin/python3 -> /usr/bin/python3``) it is carried as a link and
flagged ``system-link``; anywhere else it is ``symlink-outside``, never applied (:func:`link_verdict`).
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Literal

from sandbox.mounts.stamps import WINDOWS

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
    return judge_link(rel, target, workspace, view)[0]


def judge_link(rel: str, target: str, workspace: Path, view: Path | None = None) -> tuple[LinkVerdict, str]:
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
