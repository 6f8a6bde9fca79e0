"""Review over MCP: the session's snapshots (a tool and a resource), rollback, a copy session's changes.

Each workspace Write or Edit keeps a review snapshot (:mod:`sandbox.review`); ``SandboxSnapshots``
lists them, ``SandboxRollback`` restores one (only while the file still has the content the tool
left, else CONFLICT), ``SandboxChanges`` shows what a ``copy``/``overlay`` session changed in its
private tree so far. The same listing is the resource ``sandbox://snapshots``.

The changesets a copy session keeps when its connection ends (:mod:`sandbox.changes`) are listed
and shown (``SandboxChangesets``, ``SandboxChangesetShow``, the resource ``sandbox://changesets``),
only this workspace's; the first result of a session says which wait (:func:`opening_notices`). Applying or
discarding one is the user's decision every time: ``SandboxChangesetApply`` and
``SandboxChangesetDiscard`` ask through elicitation (never "for the session") and are refused
when no one answers; a model that could apply its own private changes unasked would make the
copy mount's review moot.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandbox import changes as kept_changes
from sandbox import changesummary
from sandbox.errors import InvalidArgument, SandboxError, ToolDenied
from sandbox.mcp.approvals import ElicitationApprover, PendingCall
from sandbox.mcp.tools import call_result, error_result
from sandbox.policy.approvals import ApprovalRequest, decide
from sandbox.profile_tables import EgressPattern
from sandbox.textsafe import printable
from sandbox.threads import off_loop
from sandbox.tools.run import ToolResult

if TYPE_CHECKING:
    from pathlib import Path

    from mcp.server.context import ServerRequestContext

    from sandbox.mounts import Changeset
    from sandbox.session import Sandbox
    from sandbox.vocabulary import Notice, Operation

SNAPSHOTS_URI = "sandbox://snapshots"
CHANGESETS_URI = "sandbox://changesets"
DIFF_CHARS = 64 * 1024
RESOURCE_NOT_FOUND = -32002


class _NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RollbackArgs(_NoArgs):
    snapshot_id: str = Field(min_length=1, max_length=64, description="a snapshot_id from SandboxSnapshots")


class ChangesetArgs(_NoArgs):
    changeset_id: str = Field(min_length=1, max_length=64, description="an id from SandboxChangesets")


class ChangesetShowArgs(ChangesetArgs):
    paths: list[str] | None = Field(None, description="only these entries (default: all)")


class ChangesetApplyArgs(ChangesetShowArgs):
    include_flagged: bool = Field(False, description="also apply flagged entries (hooks, dotfiles, executables)")


class NetworkArgs(_NoArgs):
    add: list[EgressPattern] = Field(default_factory=list, max_length=32, description="destinations to allow")
    remove: list[str] = Field(default_factory=list, max_length=256, description="patterns to take off the allowlist")


def snapshots(sandbox: Sandbox | None) -> list[dict[str, Any]]:
    """This session's review snapshots, oldest first."""
    if sandbox is None or not sandbox.snapshots.root.is_dir():
        return []
    found = []
    for where in sandbox.snapshots.root.iterdir():
        try:
            snap, _ = sandbox.snapshots.load(where.name)
        except SandboxError:
            continue  # half-written or foreign: not a snapshot of ours
        found.append((where.stat().st_mtime_ns, dataclasses.asdict(snap)))
    return [snap for _, snap in sorted(found, key=lambda pair: pair[0])]


@dataclasses.dataclass
class ReviewCall:
    """One call of a review tool: its session, the connection's approver, its request, its arguments."""

    sandbox: Sandbox
    approver: ElicitationApprover
    ctx: ServerRequestContext[Any, Any]
    name: str
    args: dict[str, Any]

    def parsed(self, model: type[M]) -> M:
        try:
            return model.model_validate(self.args)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
            raise InvalidArgument(f"invalid arguments for {self.name}: {problems}", tool=self.name) from exc


M = TypeVar("M", bound=BaseModel)


async def _list(call: ReviewCall) -> ToolResult:
    call.parsed(_NoArgs)
    listed = await anyio.to_thread.run_sync(snapshots, call.sandbox)
    lines = [
        printable(f"{s['snapshot_id']}  {s['operation']:5}  {s['status']:8}  {s['state']:10}  {s['path']}")
        for s in listed
    ]
    return ToolResult(ok=True, content="\n".join(lines) or "no review snapshots yet", details={"snapshots": listed})


async def _rollback(call: ReviewCall) -> ToolResult:
    return await call.sandbox.rollback(call.parsed(RollbackArgs).snapshot_id)


async def _changes(call: ReviewCall) -> ToolResult:
    call.parsed(_NoArgs)
    changeset = await call.sandbox.changes()
    listed = changeset.to_list()
    lines = [printable(f"{c.get('status', '?'):8}  {c.get('path', '')}") for c in listed]  # names are data
    if len(lines) > changesummary.ITEMISE:  # 14,000 installed files: summed up (details list each)
        lines = await off_loop(_summed, changeset, call.sandbox)
    details = {"counts": changeset.summary(), "changes": listed, "mount": call.sandbox.jail.mount}
    note = "\n[kept as a changeset when this connection ends: SandboxChangesets lists it]"
    return ToolResult(ok=True, content=("\n".join(lines) or "no changes in the private copy") + note, details=details)


def _summed(changeset: Changeset, sandbox: Sandbox) -> list[str]:
    """A large changeset as a reviewer reads it (:mod:`sandbox.changesummary`): a few lines."""
    rules = changesummary.Rules.of_profile(sandbox.profile, sandbox.workspace)
    return [changesummary.total_line(changeset.changes), *changesummary.summary_lines(changeset.changes, rules)]


async def _changesets(call: ReviewCall) -> ToolResult:
    call.parsed(_NoArgs)
    found = [k.summary() for k in await off_loop(kept_changes.listing, call.sandbox.workspace)]
    lines = [f"{k['id']}  {k['state']:8}  {k['created']}  {k['counts']}" for k in found]
    return ToolResult(ok=True, content="\n".join(lines) or "no kept changesets", details={"changesets": found})


async def _kept(call: ReviewCall, changeset_id: str) -> kept_changes.Kept:
    return await off_loop(_own, changeset_id, call.sandbox.workspace)


def _own(changeset_id: str, workspace: Path) -> kept_changes.Kept:
    """A kept changeset of this session's workspace (another project's is not this model's to see)."""
    kept = kept_changes.load(changeset_id)
    if os.path.realpath(kept.workspace) != os.path.realpath(workspace):
        raise InvalidArgument(f"changeset {changeset_id} is not of this workspace", changeset_id=changeset_id)
    return kept


async def _show(call: ReviewCall) -> ToolResult:
    args = call.parsed(ChangesetShowArgs)
    kept = await _kept(call, args.changeset_id)
    diff = await kept.diff_off_loop(args.paths)
    shown = diff if len(diff) <= DIFF_CHARS else diff[:DIFF_CHARS] + "\n[diff truncated; name paths to see the rest]"
    text = "\n".join([*kept.git_lines(), shown]) or "no changes"
    return ToolResult(ok=True, content=text, details={**kept.to_dict(), "diff_chars": len(diff)})


async def _apply(call: ReviewCall) -> ToolResult:
    args = call.parsed(ChangesetApplyArgs)
    kept = await _kept(call, args.changeset_id)
    counts = kept.summary()["counts"]
    await _ask(call, kept, "write", f"apply changeset {kept.id} ({counts}) to {kept.workspace}")
    report = await kept.apply(args.paths, include_flagged=args.include_flagged)
    body = report.to_dict()
    return ToolResult(
        ok=True, content=f"changeset {kept.id}: {body}", details={"id": kept.id, "state": kept.state, **body}
    )


async def _discard(call: ReviewCall) -> ToolResult:
    args = call.parsed(ChangesetArgs)
    kept = await _kept(call, args.changeset_id)
    await _ask(call, kept, "write", f"discard changeset {kept.id} for good (its changes are not in {kept.workspace})")
    await off_loop(kept.discard)
    return ToolResult(ok=True, content=f"changeset {kept.id} discarded", details={"id": kept.id})


async def _network(call: ReviewCall) -> ToolResult:
    """The allowlist shown, narrowed unasked, or widened with the user's consent, once (issue 36):
    a model that could add its own destinations would make the allowlist moot."""
    args = call.parsed(NetworkArgs)
    sandbox = call.sandbox
    current = list(sandbox.profile.network.allow)
    added = [pattern for pattern in args.add if pattern not in current]
    if added:
        await _decided(call, "connect", ", ".join(added), f"allow this session's commands to reach {', '.join(added)}")
    if added or args.remove:
        sandbox.configure(network={"allow": [pattern for pattern in current if pattern not in args.remove] + added})
    allow = list(sandbox.profile.network.allow)
    content = "the network allowlist: " + (", ".join(allow) if allow else "(empty)")
    return ToolResult(ok=True, content=content, details={"allow": allow, "added": added, "removed": args.remove})


async def _ask(call: ReviewCall, kept: kept_changes.Kept, operation: Operation, reason: str) -> None:
    """Always the user's decision, once (never for the session); anything but an allow refuses."""
    await _decided(call, operation, str(kept.workspace), reason, changeset_id=kept.id)


async def _decided(call: ReviewCall, operation: Operation, resource: str, reason: str, **data: Any) -> None:
    call_id = f"review-{uuid.uuid4().hex[:12]}"
    request = ApprovalRequest(
        session_id=call.sandbox.session_id,
        turn_id="turn-0",
        tool_call_id=call_id,
        tool=call.name,
        operation=operation,
        resource=resource,
        reason=reason,
        rule_id="network.configure" if operation == "connect" else "review.changeset",
        allow_session=False,
    )
    call.approver.calls[call_id] = PendingCall(call.ctx, anyio.Event())
    try:
        outcome = await decide(call.approver, request, float(call.sandbox.profile.policy.approval_timeout_s))
    finally:
        call.approver.calls.pop(call_id, None)
    if not outcome.allowed or outcome.decided_by != "user":
        raise ToolDenied(outcome.reason, tool=call.name, decided_by=outcome.decided_by, **data)


Handler = Callable[[ReviewCall], Awaitable[ToolResult]]
HANDLERS: dict[str, tuple[str, type[BaseModel], Handler]] = {
    "SandboxSnapshots": (
        "List this session's review snapshots: one per Write or Edit in the workspace, with its snapshot_id, "
        "path, operation and state (active or rolledBack).",
        _NoArgs,
        _list,
    ),
    "SandboxRollback": (
        "Undo one Write or Edit: restore the file as it was before (or remove a file the tool created). "
        "Refused with CONFLICT when the file changed since; give a snapshot_id from SandboxSnapshots.",
        RollbackArgs,
        _rollback,
    ),
    "SandboxChanges": (
        "Show what this session changed in its private copy of the workspace (mount copy or overlay): "
        "added, modified and deleted paths. The host workspace is untouched until the user applies them.",
        _NoArgs,
        _changes,
    ),
    "SandboxChangesets": (
        "List the kept changesets of this workspace: the private-copy changes of earlier sessions, each with "
        "its id, state (kept, partial, applied) and counts.",
        _NoArgs,
        _changesets,
    ),
    "SandboxChangesetShow": (
        "Show a kept changeset: its entries, flags (risky paths) and the diff against the workspace as it is now.",
        ChangesetShowArgs,
        _show,
    ),
    "SandboxChangesetApply": (
        "Apply a kept changeset to the host workspace. The user is always asked; flagged entries (hooks, "
        "dotfiles, new executables) are held back unless named in paths or include_flagged.",
        ChangesetApplyArgs,
        _apply,
    ),
    "SandboxChangesetDiscard": (
        "Discard a kept changeset for good. The user is always asked.",
        ChangesetArgs,
        _discard,
    ),
    "SandboxNetwork": (
        "Show this session's network allowlist, add destinations to it (the user is always asked), or remove "
        "some (never asked). Patterns: host, *.host (subdomains), host:port, an IP or a CIDR.",
        NetworkArgs,
        _network,
    ),
}
_READ_ONLY = frozenset({"SandboxSnapshots", "SandboxChanges", "SandboxChangesets", "SandboxChangesetShow"})


def definitions() -> list[types.Tool]:
    return [
        types.Tool(
            name=name,
            description=description,
            input_schema=model.model_json_schema(),
            annotations=types.ToolAnnotations(read_only_hint=name in _READ_ONLY, open_world_hint=False),
        )
        for name, (description, model, _) in HANDLERS.items()
    ]


async def call(
    sandbox: Sandbox,
    approver: ElicitationApprover,
    ctx: ServerRequestContext[Any, Any],
    name: str,
    args: dict[str, Any],
) -> types.CallToolResult:
    handler = HANDLERS[name][2]
    try:
        result = await handler(ReviewCall(sandbox, approver, ctx, name, args))
    except SandboxError as exc:
        return error_result(name, exc.code, exc.message, **exc.data)
    return call_result(name, "", result)


def opening_notices(sandbox: Sandbox) -> list[Notice]:
    """What the user should hear as the session opens: its own notices, that its writes go to a
    private copy kept when the connection ends, and the workspace's kept changesets still waiting.

    A client shows the model a tool's result but not the server's stderr, so these ride the
    first result (and a log message, for clients that show those)."""
    notices = list(sandbox.notices)
    workspace = sandbox.workspace
    if sandbox.jail.tree is not None:
        notices.append(
            {
                "code": "changes.private-copy",
                "message": f"this session writes to a private copy of {workspace}; the workspace is untouched. "
                "When the connection ends the changes are kept as a changeset: SandboxChangesets lists it, "
                f"and on the host `sandbox changes list --workspace {workspace}`",
            }
        )
    recovered = {n.get("changeset_id") for n in notices}
    waiting = [k.id for k in kept_changes.listing(workspace) if k.state != "applied" and k.id not in recovered]
    if waiting:
        shown = ", ".join(waiting[-5:]) + (f" and {len(waiting) - 5} older" if len(waiting) > 5 else "")
        notices.append(
            {
                "code": "changes.waiting",
                "message": f"{len(waiting)} kept changeset(s) of this workspace wait for review: {shown} "
                "(SandboxChangesetShow; on the host `sandbox changes show ID`, `sandbox changes apply ID`)",
            }
        )
    return notices


def resources() -> list[types.Resource]:
    return [
        types.Resource(
            uri=SNAPSHOTS_URI,
            name="snapshots",
            description="This session's review snapshots (JSON): what SandboxRollback can undo",
            mime_type="application/json",
        ),
        types.Resource(
            uri=CHANGESETS_URI,
            name="changesets",
            description="The kept changesets of this workspace (JSON): what SandboxChangesetApply can apply",
            mime_type="application/json",
        ),
    ]


async def read_resource(sandbox: Sandbox | None, workspace: Path, uri: str) -> types.ReadResourceResult:
    if uri == SNAPSHOTS_URI:
        body: dict[str, Any] = {"snapshots": snapshots(sandbox)}
    elif uri == CHANGESETS_URI:
        body = {"changesets": [k.summary() for k in await off_loop(kept_changes.listing, workspace)]}
    else:
        known = f"{SNAPSHOTS_URI}, {CHANGESETS_URI}"
        raise MCPError(code=RESOURCE_NOT_FOUND, message=f"unknown resource {uri!r}; resources: {known}")
    text = json.dumps(body, indent=2)
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=uri, mime_type="application/json", text=text)]
    )
