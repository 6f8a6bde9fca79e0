"""Review snapshots and guarded rollback (ADR 0043).

Before a workspace Write or Edit the previous bytes are kept outside the workspace, under
``<data_dir>/review-changes/<session>/<snapshot>/{before,meta.json}``; the tool result carries a
bounded review record, seed 003 §4c's ``ReviewChange`` in snake_case: ``version``, the snapshot,
the message that owns it (``message_id``: the tool message, which a client such as pi names by
its tool call's id, so it is the ``tool_call_id``) and its turn, the path, the operation,
``status`` (added, modified or deleted: what became of the file, not which tool ran), the state,
the line counts and the hunks. The hunks are ``difflib.unified_diff``'s (without the file
headers), so under ``--- a/<path>`` / ``+++ b/<path>`` a patch tool takes them as they are: a
new file's hunk is ``@@ -0,0 +1,N @@``, a deleted file's ``@@ -1,N +0,0 @@``. Rollback restores
the previous bytes (or removes a file the tool created) only while the file still has the hash
the tool left; otherwise CONFLICT and the file is left alone.

The record's ``path`` is relative to the workspace root, in ``/`` form (ADR 0043), as a patch tool
and a reviewer read it; the snapshot keeps the canonical path rollback restores.

No tool deletes a file yet (Write and Edit replace content; there is no ``REM`` or ``MV``): a
record is ``deleted`` when the runner reports no file after the tool (``after_sha256`` null).
Such a record says ``reversible: false``: restoring one needs the runner's ``restore`` to expect
an absent file, which it does not, so its rollback is refused as a conflict.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import PurePath, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Any

from sandbox import datadir, diffbound
from sandbox.errors import InvalidArgument, map_errors

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from sandbox.vocabulary import ChangeStatus, ReviewOperation, SnapshotState

HUNK_CHARS = 64 * 1024
CONTEXT = 3  # lines of context around a change, as diff -u
_RANGE = re.compile(r"([-+])(\d+)")
REVIEW_VERSION = 1
"""The review record's ``version`` (seed 003 §4c): bumped when a field changes meaning."""


@dataclass
class Snapshot:
    snapshot_id: str
    session_id: str
    tool_call_id: str
    path: str
    operation: ReviewOperation
    status: ChangeStatus
    existed: bool
    reversible: bool
    after_sha256: str | None  # None: the tool left no file (a deletion)
    state: SnapshotState = "active"
    # Defaulted so that a meta.json written before these fields existed still loads.
    turn_id: str = ""
    version: int = REVIEW_VERSION


class SnapshotStore:
    def __init__(self, session_id: str, root: Path | None = None) -> None:
        self.session_id = session_id
        self.root = (root or datadir.subdir("review-changes")) / session_id

    def _dir(self, snapshot_id: str) -> Path:
        if not snapshot_id.isalnum():
            raise InvalidArgument(f"unknown snapshot {snapshot_id!r}", snapshot_id=snapshot_id)
        return self.root / snapshot_id

    def save(self, snap: Snapshot, before: bytes | None) -> None:
        with map_errors("cannot store the review snapshot"):
            where = self._dir(snap.snapshot_id)
            datadir.private_dir(where.parent, parents=True)  # the session's directory: 0700 too
            where.mkdir(mode=0o700)
            if before is not None:
                (where / "before").write_bytes(before)
            (where / "meta.json").write_text(json.dumps(asdict(snap)))

    def load(self, snapshot_id: str) -> tuple[Snapshot, bytes | None]:
        where = self._dir(snapshot_id)
        try:
            snap = Snapshot(**json.loads((where / "meta.json").read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise InvalidArgument(f"unknown snapshot {snapshot_id!r} in this session", snapshot_id=snapshot_id) from exc
        before = (where / "before").read_bytes() if (where / "before").exists() else None
        return snap, before

    def mark(self, snap: Snapshot, state: SnapshotState) -> None:
        snap.state = state
        with map_errors("cannot update the review snapshot"):
            (self._dir(snap.snapshot_id) / "meta.json").write_text(json.dumps(asdict(snap)))

    def remove_all(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def record(
    store: SnapshotStore,
    tool_call_id: str,
    operation: ReviewOperation,
    path: str,
    details: dict[str, Any],
    *,
    turn_id: str = "",
    workspace: PurePath | str | None = None,
) -> dict[str, Any]:
    """Keep the previous bytes the runner returned and build the result's review record
    (its ``path`` relative to ``workspace``, the root the file lies in)."""
    existed = bool(details.get("existed"))
    before_b64 = details.get("before")
    before = base64.b64decode(before_b64) if before_b64 is not None else None
    after_sha256: str | None = details["after_sha256"]  # present in every reply; None only for a deletion
    snap = Snapshot(
        snapshot_id=uuid.uuid4().hex[:16],
        session_id=store.session_id,
        tool_call_id=tool_call_id,
        path=path,
        operation=operation,
        status=_status(existed, after_sha256),
        existed=existed,
        # A deletion cannot be undone yet (see above); a replaced file only with its old bytes.
        reversible=after_sha256 is not None and (not existed or before is not None),
        after_sha256=after_sha256,
        turn_id=turn_id,
    )
    store.save(snap, before)
    after = "" if after_sha256 is None else details.get("after")
    return {**_fields(snap), "path": relative(path, workspace), **_diff(before, after, existed)}


def relative(path: str, root: PurePath | str | None) -> str:
    """``path`` relative to ``root`` in ``/`` form (a Windows path too); as it is outside it."""
    if root is None:
        return path
    flavour = PureWindowsPath if PureWindowsPath(str(root)).drive else PurePosixPath
    try:
        return flavour(path).relative_to(flavour(str(root))).as_posix()
    except ValueError:
        return path


def _status(existed: bool, after_sha256: str | None) -> ChangeStatus:
    if after_sha256 is None:
        return "deleted"
    return "modified" if existed else "added"


def _fields(snap: Snapshot) -> dict[str, Any]:
    """The record's identity and state; the diff's fields are added by :func:`_diff`."""
    return {
        "version": snap.version,
        "snapshot_id": snap.snapshot_id,
        "message_id": snap.tool_call_id,
        "tool_call_id": snap.tool_call_id,
        "turn_id": snap.turn_id,
        "path": snap.path,
        "operation": snap.operation,
        "status": snap.status,
        "state": snap.state,
        "reversible": snap.reversible,
    }


def _diff(before: bytes | None, after: str | None, existed: bool) -> dict[str, Any]:
    if existed and before is None or after is None:
        return {"additions": None, "deletions": None, "hunks": [], "binary": False, "truncated": True}
    if before is not None and b"\0" in before[:8192]:
        return {"additions": None, "deletions": None, "hunks": [], "binary": True, "truncated": False}
    old = before.decode("utf-8", errors="replace").splitlines() if before is not None else []
    hunks: list[str] = []
    additions = deletions = size = 0
    truncated = False
    try:
        found = list(_hunks(old, after.splitlines()))
    except diffbound.TooCostly as exc:
        # Past the bound the counts are those of a diff that replaces every differing line (an
        # upper bound) and the hunks are left out: ``omitted`` says why.
        omitted = {"additions": exc.added, "deletions": exc.removed, "omitted": exc.summary()}
        return {**omitted, "hunks": [], "binary": False, "truncated": True}
    for lines in found:
        additions += sum(1 for line in lines if line.startswith("+"))
        deletions += sum(1 for line in lines if line.startswith("-"))
        text = "\n".join(lines)
        size += len(text)
        if size > HUNK_CHARS:
            truncated = True
        else:
            hunks.append(text)
    return {"additions": additions, "deletions": deletions, "hunks": hunks, "binary": False, "truncated": truncated}


def _hunks(old: list[str], new: list[str]) -> Iterator[list[str]]:
    """``difflib.unified_diff``'s hunks, each its ``@@`` line and body, without the file headers
    (:func:`sandbox.diffbound.unified`: :class:`~sandbox.diffbound.TooCostly` past its bounds).

    The lines both sides share at their start and end, beyond a hunk's context, are left out of
    the comparison (an edit touches a few lines of a long file; difflib's matcher is quadratic in
    repeated lines) and the ``@@`` line numbers moved back by what was left out at the start.
    """
    skip = max(0, len(os.path.commonprefix([old, new])) - CONTEXT)  # commonprefix takes any sequences
    tail = max(0, len(os.path.commonprefix([old[skip:][::-1], new[skip:][::-1]])) - CONTEXT)
    old, new = old[skip : len(old) - tail], new[skip : len(new) - tail]
    hunk: list[str] = []
    # Bounded in size and time (a hostile file can make difflib quadratic): TooCostly past it.
    for line in itertools.islice(diffbound.unified(old, new, lineterm="", n=CONTEXT), 2, None):
        if line.startswith("@@"):
            if skip:
                line = _RANGE.sub(lambda m: f"{m[1]}{int(m[2]) + skip}", line, count=2)
            if hunk:
                yield hunk
                hunk = []
        hunk.append(line)
    if hunk:
        yield hunk
