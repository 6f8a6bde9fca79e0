"""A Write or Edit undone: the file put back as its snapshot (:mod:`sandbox.review`) kept it.

The user (``snapshot.rollback``, the MCP review tool) asks for it, not the model: it passes none
of the five boundaries. The jail's runner restores the file only if it still holds what the call
wrote, so a later change is never overwritten; a rolled back snapshot says so and stays rolled
back. Apart from :mod:`sandbox.session` because it reads only a snapshot and the jail, and would
read the same from any session that kept them.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from sandbox.errors import Conflict
from sandbox.tools.run import ToolResult, run_in_jail

if TYPE_CHECKING:
    import anyio

    from sandbox.backends.base import Jail
    from sandbox.review import SnapshotStore


async def roll_back(jail: Jail, snapshots: SnapshotStore, write_lock: anyio.Lock, snapshot_id: str) -> ToolResult:
    """Restore the file of ``snapshot_id`` in ``jail``, holding ``write_lock`` (no Write runs meanwhile)."""
    snap, before = snapshots.load(snapshot_id)
    if snap.state == "rolledBack":
        return ToolResult(
            ok=True,
            content=f"{snap.path} was already rolled back",
            root="workspace",
            details={"snapshot_id": snapshot_id, "path": snap.path},
        )
    if not snap.reversible:
        why = (
            "the tool removed it, and a removed file cannot be restored yet"
            if snap.status == "deleted"
            else "the previous content was too large to keep"
        )
        raise Conflict(f"{snap.path}: {why}; rollback is unavailable", snapshot_id=snapshot_id)
    request = {
        "op": "restore",
        "path": snap.path,
        "expect_sha256": snap.after_sha256,
        "before": base64.b64encode(before).decode() if snap.existed and before is not None else None,
    }
    async with write_lock:
        reply = await run_in_jail(jail, request)
    if not reply["ok"]:
        raise Conflict(reply["content"], snapshot_id=snapshot_id, path=snap.path)
    snapshots.mark(snap, "rolledBack")
    return ToolResult(
        ok=True,
        content=reply["content"],
        root="workspace",
        details={"snapshot_id": snapshot_id, "path": snap.path},
    )
