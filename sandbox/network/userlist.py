"""The user's own network list: destinations every allowlist session of this user allows or denies, live.

``sandbox policy network allow|deny|remove PATTERN`` writes it (``policy/network.json`` in the data
directory). A session opened afterwards reads it with its profile
(:func:`sandbox.network.egress.for_profile`); a running one looks at its stamp before each command
and follows a change from the next connection on, audited (``network_changes``, source
``user-list``). It changes only an ``allowlist`` session's network: a session with no network (or
the host's) keeps what it has, as a profile that requires ``net-none`` must.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Literal

from sandbox import datadir
from sandbox.errors import InvalidArgument
from sandbox.network.policy import parse_rule

if TYPE_CHECKING:
    from pathlib import Path

ListKind = Literal["allow", "deny"]


class UserNetwork:
    """The list's file; every method reads it afresh (another process may have written it)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or datadir.subdir("policy") / "network.json"

    def load(self) -> dict[ListKind, tuple[str, ...]]:
        """``{"allow": (...), "deny": (...)}``; empty when there is no file, INVALID_ARGUMENT when it is unreadable."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"allow": (), "deny": ()}
        except (OSError, ValueError) as exc:
            raise InvalidArgument(
                f"cannot read the user's network list {self.path}: {exc}", file=str(self.path)
            ) from None
        if not isinstance(data, dict):
            data = {}
        return {kind: tuple(str(p) for p in data.get(kind, ()) if isinstance(p, str)) for kind in ("allow", "deny")}

    def add(self, kind: ListKind, pattern: str) -> None:
        parse_rule(pattern)  # INVALID_ARGUMENT naming a bad pattern
        lists = self.load()
        if pattern not in lists[kind]:
            self._save({**lists, kind: (*lists[kind], pattern)})

    def remove(self, pattern: str) -> bool:
        """Take ``pattern`` off both lists; whether it was on one."""
        lists = self.load()
        kept = {kind: tuple(p for p in patterns if p != pattern) for kind, patterns in lists.items()}
        if kept == lists:
            return False
        self._save(kept)
        return True

    def stamp(self) -> tuple[int, int] | None:
        """The file's modification time and size, ``None`` without one: what a running session compares."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _save(self, lists: dict[ListKind, tuple[str, ...]]) -> None:
        datadir.atomic_write(self.path, json.dumps({k: list(v) for k, v in lists.items()}, indent=2) + "\n")
