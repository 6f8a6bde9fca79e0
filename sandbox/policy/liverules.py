"""Rules that follow their files: a running session sees the rules saved while it runs.

Apart from the gate because it is about files and their stamps, not decisions: the gate only
asks whether a stamp changed and calls ``load`` again (:meth:`sandbox.policy.gate.Gate.follow`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from sandbox.policy.rules import RuleSet
    from sandbox.vocabulary import PermissionMode


@dataclass(frozen=True)
class LiveRules:
    """Rules that follow their files (seed 004: saved configuration takes effect at once).

    ``load`` reads the rules and the user's global mode afresh; ``files`` are what it reads (the
    user's rules store, the trust store, the project's policy file). A running session's gate
    looks at their modification stamps before each call and reloads when one changed.
    """

    load: Callable[[], tuple[RuleSet, PermissionMode | None]]
    files: tuple[Path, ...]

    def stamp(self) -> tuple[tuple[int, int] | None, ...]:
        return tuple(_stamp(path) for path in self.files)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)
