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
skipped: by its name (:data:`SECRET_DIRS`, :data:`SECRET_FILES`, :data:`KEY_NAMES`, the
sandbox's own data directory) and by what it resolves to, when the profile loads and again when
a jail opens, so a link cannot smuggle one in. Only regular files: a directory would share
whatever lands in it later. The one exception is a session's plugin directories
(:mod:`sandbox.plugins`), which the user declared and granted: a jail option of their own
(``open_jail(..., shared=)``, checked by :func:`shared_dirs`), bound read-only at
``/run/sandbox/plugins/<id>``.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from sandbox import downloads
from sandbox.errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sandbox.profile import Profile

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SANDBOX_HOME = "/tmp/home"
SANDBOX_UID = 1000
SANDBOX_GID = 1000
PASSTHROUGH = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TERM", "TZ", "COLORTERM", "NO_COLOR")
# The jail sets these itself; the caller's values would point at the host (its home, its PATH).
FIXED = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "SANDBOX")
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
# Under the caller's home: credentials, keys and tokens, refused with everything below them.
SECRET_DIRS = (
    ".ssh",
    ".aws",
    ".azure",
    ".gnupg",
    ".kube",
    ".docker",
    ".password-store",
    ".terraform.d",
    ".config/gcloud",
    ".config/gh",
    ".config/hub",
    ".local/share/keyrings",
    ".local/share/sandbox",
    ".cargo/credentials",
    ".gem/credentials",
)
SECRET_FILES = (
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".vault-token",
    ".cargo/credentials.toml",
    ".config/git/credentials",
    ".pgpass",
    ".my.cnf",
)
KEY_NAMES = ("id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*.pem", "*.key", "*.p12", "*.pfx", "*.kdbx")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
        problem = _refusal(entry, real, home)
        if problem is not None:
            raise InvalidArgument(f"env.files: {problem}", file=entry, resolved=str(real))
        pairs.append((str(real), f"{SANDBOX_HOME}/{rel}"))
    return pairs


def bwrap_args(profile: Profile, shared: Sequence[tuple[str, str]] = ()) -> list[str]:
    """``--ro-bind`` of each host file and shared directory; placed after the jail's home exists,
    before ``/`` turns read-only."""
    binds = [*host_files(profile), *shared]
    return [arg for source, target in binds for arg in ("--ro-bind", source, target)]


def _refusal(entry: str, real: Path, home: Path) -> str | None:
    """Why the file an entry resolves to may not be shared (a secret, not a regular file), or ``None``."""
    if not os.path.isfile(real):
        return f"{entry} is not a regular file ({real}); only files can be shared"
    home = home.resolve()
    reason = _secret(PurePosixPath(real.relative_to(home))) if real.is_relative_to(home) else _key_name(real.name)
    if reason is None and _is_data_dir(real):
        reason = "the sandbox's own data directory"
    if reason is not None:
        return f"{entry} resolves to {real}, a secret ({reason}); it is never shared with a jail"
    return None


def _is_data_dir(path: Path) -> bool:
    from sandbox import datadir

    return path.is_relative_to(datadir.data_dir().resolve())


def _secret(rel: PurePosixPath) -> str | None:
    """Why a path relative to the home is a secret, or ``None``."""
    text = rel.as_posix()
    for folder in SECRET_DIRS:
        if text == folder or text.startswith(folder + "/"):
            return f"under ~/{folder}"
    if text in SECRET_FILES:
        return f"~/{text} holds credentials"
    return _key_name(rel.name)


def _key_name(name: str) -> str | None:
    for pattern in KEY_NAMES:
        if fnmatch.fnmatch(name, pattern):
            return f"a key file name ({pattern})"
    return None


# ------------------------------------------------------------------------------ profile validators


def passable_name(name: str) -> str:
    """An ``env.allow`` entry: a variable name the jail does not set itself."""
    if not _NAME.match(name):
        raise ValueError(f"{name!r} is not an environment variable name")
    if name in FIXED:
        raise ValueError(f"{name} is set by the jail itself (use env.set or env.workspace_path to change it)")
    return name


def home_file(entry: str) -> str:
    """An ``env.files`` entry: ``~/<path>`` inside the caller's home, neither a secret nor a link to one."""
    if not entry.startswith("~/"):
        raise ValueError(f"{entry!r}: name a file of your home as ~/<path> (it appears at {SANDBOX_HOME}/<path>)")
    rel = PurePosixPath(entry[2:])
    if not rel.parts or ".." in rel.parts:
        raise ValueError(f"{entry!r}: a file below ~, without '..'")
    reason = _secret(rel)
    if reason is not None:
        raise ValueError(f"{entry} is a secret ({reason}); it is never shared with a jail")
    # What it resolves to now, so a link into a secret is refused before any jail is prepared;
    # host_files() checks again when a jail opens (the host may have changed since).
    home = Path(os.path.expanduser("~"))
    source = home / rel
    problem = _refusal(entry, Path(os.path.realpath(source)), home) if os.path.exists(source) else None
    if problem is not None:
        raise ValueError(problem)
    return f"~/{rel.as_posix()}"


def workspace_dir(entry: str) -> str:
    """An ``env.workspace_path`` entry: a directory relative to the workspace, inside it."""
    rel = PurePosixPath(entry)
    if not entry or rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"{entry!r}: a directory relative to the workspace, inside it (like .venv/bin)")
    return rel.as_posix()
