"""What a call is before a backend runs it: its timeout, and its argv checked by the jail's shell.

No anyio and no pydantic here: the synchronous ``sandbox run`` (:mod:`sandbox.launch`) uses the
same two rules as the executor (:mod:`sandbox.exec`). A ``jail`` here is anything with the
jail's ``workspace``, ``profile`` and ``host_paths_shown``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sandbox import datadir
from sandbox.errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandbox.profile import Profile

MIN_TIMEOUT_S = 1.0


class Shown(Protocol):
    """What :func:`checked_argv` needs of a jail."""

    @property
    def workspace(self) -> Path: ...

    @property
    def profile(self) -> Profile: ...

    @property
    def host_paths_shown(self) -> tuple[str, ...]: ...


# Runs in the jail, as the command's parent-to-be: the jail's own view decides 127 (not found) or
# 126 (found, not executable), and `exec` still gives those statuses when a check passes and the
# exec fails anyway (a script's missing interpreter). dash adds PWD to the environment; we don't.
# $1 is a host-side explanation appended to the one line, for links into what the jail hides.
_CHECKED = """h=$1; shift; unset PWD
case $1 in
*/*) if [ ! -e "$1" ]; then w="not found in the jail"; c=127
     elif [ -d "$1" ]; then w="is a directory, not a command"; c=126
     elif [ ! -x "$1" ]; then w="cannot be executed (no execute permission)"; c=126; fi ;;
*) command -v -- "$1" >/dev/null 2>&1 || { w="command not found in the jail"; c=127; } ;;
esac
[ -z "$c" ] || { printf 'sandbox: %s: %s%s\\n' "$1" "$w" "$h" >&2; exit "$c"; }
exec "$@"
"""


def checked_argv(jail: Shown, argv: Sequence[str], cwd: str | None = None) -> list[str]:
    """``argv`` run so that a missing command exits 127 and an unexecutable one 126, on every
    backend, with one line on stderr naming it (and, where a host-side look finds it, that it
    resolves into a part of the host the jail does not show)."""
    if getattr(jail, "backend", None) == "winjob":
        return list(argv)  # no /bin/sh there: the winjob jail itself answers 127 for a missing command
    hint = _hidden_hint(jail, argv[0], cwd or str(jail.workspace)) or _image_hint(jail, argv[0])
    return ["/bin/sh", "-c", _CHECKED, "sandbox", hint, *argv]


def _image_hint(jail: Shown, name: str) -> str:
    """A Docker jail's programs are its image's: a command missing there is told which image has it."""
    if getattr(jail, "backend", None) != "docker" or "/" in name:
        return ""
    from sandbox import image  # only a Docker jail's calls pay for it (the bwrap quick path never)

    return image.missing_command_hint(jail.profile.docker.image or image.tag(), name)


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _candidate(jail: Shown, name: str, cwd: str) -> str | None:
    """Where the jail would look for ``name``, if that is inside the workspace (else we cannot tell)."""
    if "/" in name:
        path = os.path.normpath(os.path.join(cwd, name))
        return path if _under(path, (str(jail.workspace),)) else None
    from sandbox.backends.environment import base_env

    # The workspace's own tool directories (.venv/bin ...) come first on the jail's PATH.
    for folder in base_env(jail.profile, workspace=jail.workspace).get("PATH", "").split(":"):
        path = os.path.normpath(os.path.join(cwd, folder, name))
        if _under(path, (str(jail.workspace),)) and os.path.lexists(path):
            return path
    return None


def _hidden_hint(jail: Shown, name: str, cwd: str) -> str:
    path = _candidate(jail, name, cwd)
    if path is None:
        return ""
    shown = jail.host_paths_shown
    for _ in range(40):  # the kernel's own limit on links followed
        parent = os.path.realpath(os.path.dirname(path))
        path = os.path.join(parent, os.path.basename(path))
        if not _under(parent, shown):
            break
        if not os.path.islink(path):
            return ""
        path = os.path.normpath(os.path.join(parent, os.readlink(path)))
        if not _under(path, shown):
            break
    else:
        return ""
    there = "exists" if os.path.exists(path) else "does not exist either"
    return f" (it resolves to {path}, which the jail does not show; on the host it {there})"


def check_timeout(timeout: float | None, profile: Profile) -> float:
    """The effective timeout: the profile's default, or an override from 1 s to its ``timeouts.max_s``."""
    if timeout is None:
        return float(profile.timeouts.default_s)
    ceiling = profile.timeouts.max_s
    if isinstance(timeout, bool) or not MIN_TIMEOUT_S <= timeout <= ceiling:
        raise InvalidArgument(
            f"timeout must be between {MIN_TIMEOUT_S:g} and {ceiling:g} seconds, got {timeout!r} "
            f"(the ceiling is profile {profile.name!r}'s timeouts.max_s)",
            timeout=timeout,
            max_s=ceiling,
            profile=profile.name,
        )
    return float(timeout)


FORBIDDEN_WORKSPACES = {
    Path(p)
    for p in (
        "/",
        "/usr",
        "/etc",
        "/bin",
        "/sbin",
        "/lib",
        "/lib64",
        "/proc",
        "/sys",
        "/dev",
        "/boot",
        "/var",
        "/tmp",
        "/run",
    )
}


def check_workspace(workspace: Path) -> Path:
    """The canonical workspace directory, or a clear INVALID_ARGUMENT."""
    try:
        ws = Path(workspace).expanduser().resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise InvalidArgument(f"workspace {workspace} does not exist", workspace=str(workspace)) from exc
    if not ws.is_dir():
        raise InvalidArgument(f"workspace {ws} is not a directory", workspace=str(ws))
    if ws in FORBIDDEN_WORKSPACES or ws == Path.home().resolve() and getattr(os, "geteuid", lambda: 1)() != 0:
        raise InvalidArgument(
            f"workspace {ws} is a system or home directory; choose a project directory", workspace=str(ws)
        )
    data = datadir.data_dir().resolve()
    if data == ws or data.is_relative_to(ws) or ws.is_relative_to(data):
        raise InvalidArgument(f"workspace {ws} overlaps the sandbox data directory {data}", workspace=str(ws))
    return ws


def exit_status(returncode: int) -> tuple[int, int | None]:
    """A child's status (``-N``: killed by signal N) as the shell reports it, 128+N, and that signal."""
    if returncode < 0:
        return 128 - returncode, -returncode
    if returncode > 128 and returncode - 128 < signal.NSIG:
        return returncode, returncode - 128
    return returncode, None
