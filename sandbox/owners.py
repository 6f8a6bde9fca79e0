"""Who owns what an executor leaves on disk or in a cgroup hierarchy: the bottom layer.

Each thing an executor makes that could outlive it names its owner: cgroups, private copies and
overlays in their name, ``<kind>-<pid>-<starttime>-<id>`` (:data:`OWNED`); a directory named by its
user (a scratch directory) in a ``<name>.owner`` file beside it (:func:`claim`). ``starttime`` is
the kernel's start time of the process (in clock ticks since boot), so a pid reused by another
process never passes for the owner (:func:`owner_alive`). :mod:`sandbox.leftovers` sweeps what
dead owners left.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

OWNED = re.compile(r"^(?P<kind>call|copy|overlay)-(?P<pid>\d+)-(?P<start>\d+)-(?P<id>[0-9a-f]+)$")

_tags: dict[int, str] = {}


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def owner_tag() -> str:
    """``<pid>-<starttime>`` of this process (recomputed after a fork)."""
    pid = os.getpid()
    if pid not in _tags:
        _tags[pid] = f"{pid}-{start_time(pid)}"
    return _tags[pid]


def owner_alive(pid: int, start: int) -> bool:
    return start_time(pid) == start


def claim(path: Path) -> None:
    """Record this executor as the owner of ``path`` (a directory named by its user, e.g. a scratch dir)."""
    path.with_name(path.name + ".owner").write_text(owner_tag() + "\n")


def release(path: Path) -> None:
    """Forget the claim on ``path`` once it is removed."""
    with contextlib.suppress(FileNotFoundError):
        path.with_name(path.name + ".owner").unlink()


def claim_alive(path: Path) -> bool | None:
    """Whether the executor that claimed ``path`` still runs; None when there is no readable claim."""
    try:
        pid, _, start = path.with_name(path.name + ".owner").read_text().strip().partition("-")
    except OSError:
        return None
    return owner_alive(int(pid), int(start)) if pid.isdigit() and start.isdigit() else None
