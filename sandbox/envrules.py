"""What may cross from the caller's environment into a jail's, and what never does: the bottom layer.

The names a jail sets itself (:data:`FIXED`), the caller's secrets by name (:data:`SECRET_DIRS`,
:data:`SECRET_FILES`, :data:`KEY_NAMES`, the sandbox's own data directory) and the rules of a
profile's ``env`` entries (:func:`passable_name`, :func:`home_file`, :func:`workspace_dir`), which
the profile model validates with and :mod:`sandbox.backends.environment` (the jail's environment
and its home files), :mod:`sandbox.plugins` (a plugin's directory) judge by. It imports nothing of
the package but the data directory's location.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path, PurePosixPath

from sandbox import datadir

SANDBOX_HOME = "/tmp/home"
# The jail sets these itself; the caller's values would point at the host (its home, its PATH).
FIXED = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "SANDBOX")
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


def refusal(entry: str, real: Path, home: Path) -> str | None:
    """Why the file an entry resolves to may not be shared (a secret, not a regular file), or ``None``."""
    if not os.path.isfile(real):
        return f"{entry} is not a regular file ({real}); only files can be shared"
    home = home.resolve()
    reason = (
        secret_reason(PurePosixPath(real.relative_to(home)))
        if real.is_relative_to(home)
        else key_name_reason(real.name)
    )
    if reason is None and _is_data_dir(real):
        reason = "the sandbox's own data directory"
    if reason is not None:
        return f"{entry} resolves to {real}, a secret ({reason}); it is never shared with a jail"
    return None


def _is_data_dir(path: Path) -> bool:
    return path.is_relative_to(datadir.data_dir().resolve())


def secret_reason(rel: PurePosixPath) -> str | None:
    """Why a path relative to the home is a secret, or ``None``."""
    text = rel.as_posix()
    for folder in SECRET_DIRS:
        if text == folder or text.startswith(folder + "/"):
            return f"under ~/{folder}"
    if text in SECRET_FILES:
        return f"~/{text} holds credentials"
    return key_name_reason(rel.name)


def key_name_reason(name: str) -> str | None:
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
    reason = secret_reason(rel)
    if reason is not None:
        raise ValueError(f"{entry} is a secret ({reason}); it is never shared with a jail")
    # What it resolves to now, so a link into a secret is refused before any jail is prepared;
    # host_files() checks again when a jail opens (the host may have changed since).
    home = Path(os.path.expanduser("~"))
    source = home / rel
    problem = refusal(entry, Path(os.path.realpath(source)), home) if os.path.exists(source) else None
    if problem is not None:
        raise ValueError(problem)
    return f"~/{rel.as_posix()}"


def workspace_dir(entry: str) -> str:
    """An ``env.workspace_path`` entry: a directory relative to the workspace, inside it."""
    rel = PurePosixPath(entry)
    if not entry or rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"{entry!r}: a directory relative to the workspace, inside it (like .venv/bin)")
    return rel.as_posix()
