"""Review snapshots and guarded rollback (ADR 0043).

Before a workspace Write or Edit the previous bytes are kept outside the workspace, under
``<data_dir>/review-changes/<session>/<snapshot>/{before,meta.json}``; the tool result carries a
bounded review record. Its hunks are ``difflib.unified_diff``'s (without the file headers), so
under ``--- a/<path>`` / ``+++ b/<path>`` a patch tool takes them as they are: a new file's hunk
starts ``@@ -0,0 +1,N @@``. Rollback restores the previous bytes (or removes a file the tool
created) only while the file still has the hash the tool left; otherwise CONFLICT and the file is
left alone.
"""

from __future__ import annotations

import base64
import difflib
import itertools
import json
import shutil
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sandbox import datadir
from sandbox.errors import InvalidArgument, map_errors

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from sandbox.vocabulary import ChangeStatus, ReviewOperation, SnapshotState

HUNK_CHARS = 64 * 1024


@dataclass
class Snapshot:
    snapshot_id: str
    session_id: str
    tool_call_id: str
    path: str
    operation: ReviewOperation
    status: ChangeStatus  # added or modified: a Write or an Edit never deletes
    existed: bool
    reversible: bool
    after_sha256: str
    state: SnapshotState = "active"


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
            where.mkdir(parents=True, mode=0o700)
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
    store: SnapshotStore, tool_call_id: str, operation: ReviewOperation, path: str, details: dict[str, Any]
) -> dict[str, Any]:
    """Keep the previous bytes the runner returned and build the result's review record."""
    existed = bool(details.get("existed"))
    before_b64 = details.get("before")
    before = base64.b64decode(before_b64) if before_b64 is not None else None
    reversible = not existed or before is not None
    snap = Snapshot(
        uuid.uuid4().hex[:16],
        store.session_id,
        tool_call_id,
        path,
        operation,
        "modified" if existed else "added",
        existed,
        reversible,
        details["after_sha256"],
    )
    store.save(snap, before)
    review = {
        "snapshot_id": snap.snapshot_id,
        "tool_call_id": tool_call_id,
        "path": path,
        "operation": operation,
        "status": snap.status,
        "reversible": reversible,
        "state": snap.state,
    }
    review.update(_diff(before, details.get("after"), existed))
    return review


def _diff(before: bytes | None, after: str | None, existed: bool) -> dict[str, Any]:
    if existed and before is None or after is None:
        return {"additions": None, "deletions": None, "hunks": [], "binary": False, "truncated": True}
    if before is not None and b"\0" in before[:8192]:
        return {"additions": None, "deletions": None, "hunks": [], "binary": True, "truncated": False}
    old = before.decode("utf-8", errors="replace").splitlines() if before is not None else []
    hunks: list[str] = []
    additions = deletions = size = 0
    truncated = False
    for lines in _hunks(old, after.splitlines()):
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
    """``difflib.unified_diff``'s hunks, each its ``@@`` line and body, without the file headers."""
    hunk: list[str] = []
    for line in itertools.islice(difflib.unified_diff(old, new, lineterm=""), 2, None):
        if line.startswith("@@") and hunk:
            yield hunk
            hunk = []
        hunk.append(line)
    if hunk:
        yield hunk
