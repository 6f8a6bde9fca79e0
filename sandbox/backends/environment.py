"""What a jailed command sees of the caller's environment: an allowlist, never the caller's secrets.

**Variables.** Fixed values first (``HOME`` is the jail's own, ``/tmp/home``), then the names in
:data:`PASSTHROUGH` and the profile's ``env.allow`` (the pass-through list: ``GIT_AUTHOR_NAME``
...) copied from the caller's environment when set, then ``env.set``, then the call's own. ``PATH``
starts with the directories of ``env.workspace_path`` that exist in the workspace (by default
``.venv/bin`` and ``node_modules/.bin``), so a project's own tools run as in an activated venv.

**Host files.** ``env.files`` names files of the caller's home (``~`` is the caller's home on
the host); each is bound read-only at the same place under the jail's home, so ``~/.gitconfig``
gives git its identity. A file that does not exist is skipped: the jail then lacks it exactly as
the host does, and one profile serves machines with and without it. A secret is refused, never
skipped: by its name (:mod:`sandbox.envrules`: the caller's credential directories and files, key
file names, the sandbox's own data directory) and by what it resolves to, when the profile loads and again when
a jail opens, so a link cannot smuggle one in. Only regular files: a directory would share
whatever lands in it later. The one exception is a session's plugin directories
(:mod:`sandbox.plugins`), which the user declared and granted: a jail option of their own
(``open_jail(..., shared=)``, checked by :func:`shared_dirs`), bound read-only at
``/run/sandbox/plugins/<id>``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox import downloads, envrules
from sandbox.envrules import SANDBOX_HOME
from sandbox.errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sandbox.profile import Profile

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SANDBOX_UID = 1000
SANDBOX_GID = 1000
PASSTHROUGH = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TERM", "TZ", "COLORTERM", "NO_COLOR")
# The variables through which common clients take a CA bundle (OpenSSL and Python, requests, curl,
# pip, git, Node): what names a bundle to every tool at once, a jail's or a test's.
CA_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
)


def base_env(
    profile: Profile, extra: Mapping[str, str] | None = None, *, workspace: Path | None = None
) -> dict[str, str]:
    """Fixed values, allowlisted names copied from our environment, then the profile's and caller's."""
    env = {
        "PATH": workspace_path(profile, workspace),
        "HOME": SANDBOX_HOME,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "SHELL": "/bin/sh",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "SANDBOX": "1",
        "TMPDIR": "/tmp",
    }
    for name in (*PASSTHROUGH, *profile.env.allow):
        value = os.environ.get(name)
        if value is not None:
            env[name] = value
    env.update(downloads.environment(profile))  # the installers' caches, when the profile keeps them
    env.update(profile.env.set)
    env.update(extra or {})
    return env


def workspace_path(profile: Profile, workspace: Path | None) -> str:
    """SAFE_PATH behind the workspace's tool directories that exist (checked on the host, per call)."""
    if workspace is None:
        return SAFE_PATH
    found = [str(workspace / rel) for rel in profile.env.workspace_path if os.path.isdir(workspace / rel)]
    return ":".join([*found, SAFE_PATH])


# ------------------------------------------------------------------------------ host files


def host_files(profile: Profile) -> list[tuple[str, str]]:
    """``(host source, jail target)`` of each ``env.files`` entry that exists (refusing secrets):
    every one is bound read-only."""
    return _home_files(profile)


def shared_dirs(shared: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """A jail's ``shared`` option (a session's plugin directories), checked as the jail opens:
    ``(real host directory, jail directory)``, each still a directory, bound read-only."""
    pairs = []
    for source, target in shared:
        if not os.path.isdir(source):
            raise InvalidArgument(f"shared directory {source} is gone", directory=str(source))
        pairs.append((os.path.realpath(source), str(target)))
    return tuple(pairs)


def _home_files(profile: Profile) -> list[tuple[str, str]]:
    home = Path(os.path.expanduser("~"))
    pairs = []
    for entry in dict.fromkeys(profile.env.files):  # once each: Docker refuses a mount point twice
        rel = entry.removeprefix("~/")
        source = home / rel
        if not os.path.exists(source):  # a dangling link too: the jail lacks the file as the host does
            continue
        real = Path(os.path.realpath(source))
        problem = envrules.refusal(entry, real, home)
        if problem is not None:
            raise InvalidArgument(f"env.files: {problem}", file=entry, resolved=str(real))
        pairs.append((str(real), f"{SANDBOX_HOME}/{rel}"))
    return pairs


def bwrap_args(profile: Profile, shared: Sequence[tuple[str, str]] = ()) -> list[str]:
    """``--ro-bind`` of each host file and shared directory; placed after the jail's home exists,
    before ``/`` turns read-only."""
    binds = [*host_files(profile), *shared]
    return [arg for source, target in binds for arg in ("--ro-bind", source, target)]
