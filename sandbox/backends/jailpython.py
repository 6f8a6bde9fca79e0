"""The interpreter and shell our own programs run under in a jail, by absolute paths no jail can shadow.

Every program of ours started in a jail is Python (the warm agent, the file tools' runner, the
network forwarder) or the shell the Bash tool starts. Found by name, each would be found through
the jail's PATH, whose first directories are the workspace's (``env.workspace_path``:
``.venv/bin``, ``node_modules/.bin``, there for the user's commands), so a repository shipping
``.venv/bin/python3`` would run in our place: as a warm jail's PID 1, outside every call's
cgroup and limits, serving later calls. So a backend names its interpreter by an absolute path,
checked before use, and the jail's PATH serves the user's commands only.

**bubblewrap** shows the host's system directories read-only, so the jail's interpreter is the
host's: ``python3`` of :data:`CANDIDATES`, resolved on the host to the real file (no link left to
swap later). It must be a regular file owned by root, and so must every directory from ``/`` down
to it, none of them writable by group or others (the check sudo and OpenSSH's StrictModes make of
a path), and it must lie in a system directory the jail shows. Root only, even for an ordinary
user: an interpreter the user owns is one any of their processes could rewrite, and the jail shows
none of their files outside the workspace anyway. The verdict is kept per process and checked again
by one ``stat`` per jail (an upgraded package is verified afresh); a failure is never kept. Then,
per jail, no mount the jail writes or the project fills (the workspace, scratch, ``/tmp``, shared
directories) may be at or above it (:func:`outside`).

**Docker**: the image's :data:`IMAGE_PYTHON` (our images' Debian ``python3``). The container's root
file system is read-only and its environment empty, so only a mount can shadow it: none may be at
or above its directory (the workspace is bound at its host path, which could be ``/usr``).

Failures are :class:`~sandbox.errors.BackendUnavailable`: no jail starts with an interpreter that
a jail could have written.
"""

from __future__ import annotations

import os
import stat
import threading
from typing import TYPE_CHECKING, NamedTuple

from sandbox.errors import BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import Iterable

CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
IMAGE_PYTHON = "/usr/bin/python3"
# Where the jail finds bash for the Bash tool: the system directories of SAFE_PATH, never the
# workspace's (a planted .venv/bin/bash would otherwise be the shell of every command).
SYSTEM_BIN = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class _Verdict(NamedTuple):
    path: str
    key: tuple[int, int, int, int, int]  # what stat says of it when verified: dev, ino, uid, mode, mtime


_lock = threading.Lock()
_kept: _Verdict | None = None


def host_python() -> str:
    """The host's verified ``python3`` (its real path), in a system directory a bubblewrap jail shows.

    Kept once verified; one ``stat`` per call tells that it is still the file that was verified."""
    global _kept
    kept = _kept
    if kept is not None and _key(kept.path) == kept.key:
        return kept.path
    from sandbox.backends.bwrap_argv import SYSTEM_DIRS  # here: bwrap_argv is bubblewrap's alone

    shown = tuple(os.path.realpath(d) for d in SYSTEM_DIRS if os.path.isdir(d))
    with _lock:
        verdict = _verify(shown)
        _kept = verdict
    return verdict.path


def bwrap_python(targets: Iterable[str]) -> str:
    """The host's verified ``python3``, once none of a bubblewrap jail's mount ``targets`` can shadow it."""
    return outside(host_python(), targets, "bwrap")


def outside(python: str, targets: Iterable[str], backend: str) -> str:
    """``python`` when no mount target is at or above it (a mount there would replace it), else refuse."""
    for target in targets:
        top = target.rstrip("/") + "/"
        if python == target or python.startswith(top):
            raise BackendUnavailable(
                f"the jail's interpreter {python} would lie under {target}, which the jail can write or the "
                "project fills; move the workspace (or scratch) out of the system directories",
                backend=backend,
                interpreter=python,
                mount=target,
            )
    return python


def image_python(targets: Iterable[str]) -> str:
    """The image's interpreter, once no mount of the container is at, above or inside its directory.

    Inside too: ``python3`` is a link in the image (to ``python3.11`` beside it), which a mount on
    the link's target would replace."""
    folder = os.path.dirname(IMAGE_PYTHON)
    targets = list(targets)
    outside(folder, targets, "docker")
    inside = [t for t in targets if t.startswith(folder + "/")]
    if inside:
        raise BackendUnavailable(
            f"a mount at {inside[0]} would shadow the jail's interpreter {IMAGE_PYTHON}",
            backend="docker",
            interpreter=IMAGE_PYTHON,
            mount=inside[0],
        )
    return IMAGE_PYTHON


def _key(path: str) -> tuple[int, int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_uid, st.st_mode, st.st_mtime_ns)


def _verify(shown: tuple[str, ...]) -> _Verdict:
    problems = []
    for candidate in CANDIDATES:
        real = os.path.realpath(candidate)
        problem = _unsafe(real, shown)
        if problem is None:
            key = _key(real)
            if key is not None:
                return _Verdict(real, key)
            problem = f"{real} vanished while it was checked"
        problems.append(f"{candidate}: {problem}")
    raise BackendUnavailable(
        "no python3 on this host that a jail could not have written (the jail's agent, file tools and "
        "network forwarder need one, owned by root and writable by nobody else): " + "; ".join(problems),
        backend="bwrap",
        checked=list(CANDIDATES),
    )


def _unsafe(real: str, shown: tuple[str, ...]) -> str | None:
    """Why ``real`` may not be the jail's interpreter, or ``None``."""
    if not any(real.startswith(folder.rstrip("/") + "/") for folder in shown):
        return f"{real} is not in a system directory the jail shows ({', '.join(shown)})"
    try:
        st = os.stat(real)
    except OSError as exc:
        return f"{real}: {exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        return f"{real} is not a regular file"
    path = real
    while True:
        problem = _owner_problem(path, os.stat(path) if path != real else st)
        if problem is not None:
            return problem
        if path == "/":
            return None
        path = os.path.dirname(path)


def _owner_problem(path: str, st: os.stat_result) -> str | None:
    if st.st_uid != 0:
        return f"{path} is owned by uid {st.st_uid}, not root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by its group or by others (mode {stat.filemode(st.st_mode)})"
    return None
