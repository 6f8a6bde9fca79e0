"""Session snapshots over MCP (issue 39): ``Snapshot``, ``Restore`` and ``Fork``.

``Snapshot`` keeps the session's whole file state (its private view of the workspace, its scratch
directory and modes; no process) under an id in the snapshot store (:mod:`sandbox.snapshots`);
``Restore`` brings the session back to one of its line's snapshots, in a new jail. Only a
``copy`` or ``overlay`` session has a state to keep: any other is INVALID_ARGUMENT, naming them.

A restore discards what the view changed since, so the session's own gate judges it
(:func:`sandbox.session.forks.restore`): refused in plan and goal, and in ``ask`` a confirm put
to the user by the session's approver, which is the connection's :class:`ElicitationApprover`:
it asks through this call's request (the call's id is the question's), once, there, and nothing
here asks again. CONFLICT where the host changed a path of the snapshot since (``force``
restores all the same; the apply then refuses the path), INVALID_ARGUMENT for a snapshot of
another workspace or of another line of sessions.

``Fork``: a connection's tools reach its one session, so sessions a fork opened could not be
called by the model that asked for them, and a server holding them open would only hide their
jails from everyone. ``Fork`` is honest about it: it keeps the branch point as a snapshot and says
how each branch goes on. This connection is one branch (``Restore`` of the id brings it back to
the branch point, to try another way in turn); each other one is an MCP server the user starts
from the snapshot (``sandbox mcp --from-snapshot ID``; over HTTP one such server opens a branch
per connection), whose session starts from the snapshot in the same line of sessions, so it may
restore the branch point too, and whose changes are its own changeset.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field

from sandbox import snapshots
from sandbox.errors import SandboxError
from sandbox.mcp.review import ReviewCall
from sandbox.session import forks
from sandbox.threads import off_loop
from sandbox.tools.run import ToolResult

if TYPE_CHECKING:
    from sandbox.session import Sandbox


class SnapshotArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RestoreArgs(SnapshotArgs):
    snapshot_id: str = Field(
        min_length=1, max_length=64, description="a session snapshot's id (snap-...) from Snapshot or Fork"
    )
    force: bool = Field(
        False, description="restore even where the host changed a path since (applying the changes then refuses it)"
    )


class ForkArgs(SnapshotArgs):
    n: int = Field(1, ge=1, le=forks.MAX_FORKS, description="how many branches")


@dataclasses.dataclass
class BranchCall(ReviewCall):
    """A review call, with its call id (a restore's question rides it), its turn, and the command
    line of this server (a fork's branches start from it)."""

    call_id: str = ""
    turn_id: str = "turn-0"
    launch: tuple[str, ...] = ("sandbox", "mcp")


def described(snapshot_id: str) -> dict[str, Any]:
    return {"snapshot_id": snapshot_id, **snapshots.read(snapshot_id).describe()}


def _said(snap: dict[str, Any]) -> str:
    return (
        f"session snapshot {snap['snapshot_id']}: {snap['changed']} changed and {snap['deleted']} deleted path(s), "
        f"{snap['bytes']} bytes ({snap['kind']})"
    )


async def _snapshot(call: BranchCall) -> ToolResult:
    call.parsed(SnapshotArgs)
    snap = await off_loop(described, await call.sandbox.snapshot(turn_id=call.turn_id))
    content = (
        f'kept {_said(snap)}. Restore {{"snapshot_id": "{snap["snapshot_id"]}"}} brings this session\'s files, '
        "scratch directory and modes back to it (no process is kept)."
    )
    return ToolResult(ok=True, content=content, details=snap)


def _same_line(sandbox: Sandbox, snapshot_id: str) -> None:
    """INVALID_ARGUMENT for another workspace's snapshot, or another line's, saying what to do instead."""
    snap = snapshots.read(snapshot_id)
    forks.check_line(sandbox, snap, f"a server started with `sandbox mcp --from-snapshot {snap.id}`")


async def _restore(call: BranchCall) -> ToolResult:
    args = call.parsed(RestoreArgs)
    await off_loop(_same_line, call.sandbox, args.snapshot_id)
    restored = await call.sandbox.restore(
        args.snapshot_id, force=args.force, turn_id=call.turn_id, tool_call_id=call.call_id
    )
    content = (
        f"restored session snapshot {args.snapshot_id}: the workspace view, scratch directory and modes are as "
        f"they were then ({restored['changed']} path(s) of the snapshot), in a new jail (no process was kept)"
    )
    hidden: list[str] = restored.get("host_changed") or []
    if hidden:
        content += f"; the host changed {', '.join(hidden[:10])} since: applying this session's changes refuses them"
    return ToolResult(ok=True, content=content, details=restored)


async def _fork(call: BranchCall) -> ToolResult:
    args = call.parsed(ForkArgs)
    snap = await off_loop(described, await call.sandbox.snapshot(turn_id=call.turn_id))
    snapshot_id = snap["snapshot_id"]
    command = [*call.launch, "--from-snapshot", snapshot_id]
    content = (
        f"branch point kept as {_said(snap)}. This MCP connection drives one session, so the {args.n} branch(es) "
        "cannot become sessions you call here. This session goes on as one branch: "
        f'Restore {{"snapshot_id": "{snapshot_id}"}} brings it back to the branch point to try another way. '
        "To run branches side by side, the user starts one MCP server per branch from the snapshot "
        f"(over --http or --unix, one server opens a branch per connection):\n  {shlex.join(command)}\n"
        "Each branch starts from this state in a jail of its own, may restore the branch point, and keeps its "
        "own changes for review."
    )
    details = {**snap, "branches": args.n, "command": command, "command_line": shlex.join(command)}
    return ToolResult(ok=True, content=content, details=details)


Handler = Callable[[BranchCall], Awaitable[ToolResult]]
HANDLERS: dict[str, tuple[str, type[BaseModel], Handler, types.ToolAnnotations]] = {
    "Snapshot": (
        "Keep this session's whole file state (its private copy of the workspace, its scratch directory and "
        "modes; no process) as a session snapshot, and return its snapshot_id for Restore. Needs a copy or "
        "overlay mount. Not SandboxSnapshots' per-file review snapshots.",
        SnapshotArgs,
        _snapshot,
        types.ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
    ),
    "Restore": (
        "Bring this session back to a session snapshot from Snapshot or Fork: its files, scratch directory and "
        "modes, in a new jail; everything the session changed since is discarded (asked in ask mode). "
        "Refused with CONFLICT when the host changed a path of the snapshot since (force restores anyway).",
        RestoreArgs,
        _restore,
        types.ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False),
    ),
    "Fork": (
        "Keep this session's state as a branch point (a session snapshot) for n branches: this session goes "
        "on as one (Restore goes back to the branch point); the result gives the command that starts an "
        "MCP server for each other branch, which only the user can run.",
        ForkArgs,
        _fork,
        types.ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
    ),
}


def definitions() -> list[types.Tool]:
    return [
        types.Tool(name=name, description=description, input_schema=model.model_json_schema(), annotations=notes)
        for name, (description, model, _, notes) in HANDLERS.items()
    ]


async def call(branch: BranchCall) -> ToolResult:
    """The tool's result; a refusal or failure of the sandbox's as its stable code and message."""
    try:
        return await HANDLERS[branch.name][2](branch)
    except SandboxError as exc:
        return ToolResult(ok=False, error_code=exc.code, content=exc.message, details=dict(exc.data))
