"""Package managers' download caches, kept per project: ``[mount] download_cache = "project"``.

Off by default. When a profile (or ``sandbox run --download-cache project``) turns it on, a
directory of the data directory, one per (workspace, backend), is bound read-write into the jail at
:data:`JAIL_DIR`, and the installers are pointed at it (:data:`VARIABLES`: pip, uv, npm, yarn, Go,
cargo). A second install of the same project finds its downloads there instead of fetching them
again, and the cache is neither copied in nor part of the changeset: it is not the workspace.

What it is not: the host's home. No host cache (``~/.cache/pip``, ``~/.npm``) is ever shown to a
jail, read or written; the jail fills its own. What a poisoned entry can do: a run of the same
workspace on the same backend may install what an earlier run of it left in the cache (pip and npm
check the index's hashes only when the project pins them), inside the jail only; no other
workspace's jail sees the directory, the host runs nothing from it, and the host reads it only to
size and remove it, never following a link the jail planted. Together the caches are capped
(:data:`LIMIT`): the least recently used project's goes first when a jail opens.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from typing import TYPE_CHECKING

from sandbox import datadir

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox.profile import Profile

JAIL_DIR = "/sandbox-downloads"
"""Where the cache is in every jail (bubblewrap and Docker): a fixed path, not the host's."""
VARIABLES = {
    "PIP_CACHE_DIR": "pip",
    "UV_CACHE_DIR": "uv",
    "npm_config_cache": "npm",
    "YARN_CACHE_FOLDER": "yarn",
    "GOMODCACHE": "go/mod",
    "GOCACHE": "go/build",
    "CARGO_HOME": "cargo",
}
"""Each installer's cache variable and its directory under :data:`JAIL_DIR`."""
LIMIT = 8 * 2**30
"""Every project's download cache together; past it the least recently used go when a jail opens."""
PRUNE_EVERY_S = 600.0
"""Sizing every cache is a walk of each: done at a jail's opening at most this often."""
_BOUND = "cache"  # in each entry, the directory a jail is shown
_USED = "used"  # in each entry, beside the cache (out of the jail's reach), touched at each opening
_PRUNED = ".pruned"


def enabled(profile: Profile) -> bool:
    return profile.mount.download_cache == "project"


def environment(profile: Profile) -> dict[str, str]:
    """The installers' cache variables when the profile keeps a download cache (else nothing)."""
    if not enabled(profile):
        return {}
    return {name: f"{JAIL_DIR}/{sub}" for name, sub in VARIABLES.items()}


def root() -> Path:
    return datadir.subdir("downloads")


def host_dir(workspace: Path, backend: str) -> Path:
    """The entry of ``workspace`` for ``backend`` (not made): one per backend, whose jails write as
    different owners (bubblewrap as us, Docker as the image's user). The entry is ours; the jail is
    shown only its ``cache`` directory (:data:`_BOUND`), which Docker's jails get to own."""
    key = hashlib.sha256(os.path.realpath(workspace).encode()).hexdigest()[:24]
    return root() / f"{key}-{backend}"


def prepare(workspace: Path, profile: Profile, backend: str, limit: int = LIMIT) -> Path | None:
    """The directory to bind for a jail of ``workspace`` (made, marked used, the others pruned to
    ``limit`` now and then), or ``None`` when the profile keeps none."""
    if not enabled(profile):
        return None
    entry = host_dir(workspace, backend)
    if _due(root() / _PRUNED):
        prune(limit, keep=entry)
    datadir.private_dir(entry, what="the project's download cache")
    _stamp(entry / _USED)
    bound = entry / _BOUND
    with contextlib.suppress(FileExistsError):
        bound.mkdir(mode=0o700)
    return bound


def prune(limit: int = LIMIT, keep: Path | None = None) -> list[Path]:
    """Remove the least recently used caches until all fit in ``limit`` bytes (``keep`` stays)."""
    entries = []
    with contextlib.suppress(OSError):
        for entry in root().iterdir():
            if entry.is_dir() and not entry.is_symlink():
                entries.append((_used(entry), datadir.opened_up_bytes(entry), entry))  # noqa: PERF401 -- in a suppress
    total = sum(size for _used_at, size, _entry in entries)
    removed = []
    for _used_at, size, entry in sorted(entries):
        if total <= limit:
            break
        if entry == keep:
            continue
        datadir.remove_tree(entry)
        total -= size
        removed.append(entry)
    _stamp(root() / _PRUNED)
    return removed


def _used(entry: Path) -> float:
    try:
        return os.lstat(entry / _USED).st_mtime
    except OSError:
        return 0.0


def _due(stamp: Path) -> bool:
    try:
        return time.time() - os.lstat(stamp).st_mtime > PRUNE_EVERY_S
    except OSError:
        return True


def _stamp(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.touch()
