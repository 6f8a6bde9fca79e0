"""The file tools: Read, Write, Edit, Glob, Grep and LS, each run by the stdlib runner inside the
session's jail (:func:`sandbox.tools.run.run_in_jail`), so they see exactly what Bash sees and
cannot write where Bash cannot.

Each tool turns its approved call into the runner's request (:meth:`FileTool.request`) and the
runner's reply into its result (:meth:`FileTool.shape`): Glob and Grep show only what the policy
lets the model read; Write and Edit keep a review snapshot of a workspace file (its diff and its
rollback) and say when they wrote to a private copy, and refuse a write outside the workspace and
the scratch directory, which could not persist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from sandbox import review
from sandbox.threads import off_loop
from sandbox.tools.base import Invocation, Tool, ToolHost
from sandbox.tools.params import EditParams, GlobParams, GrepParams, LSParams, ReadParams, WriteParams
from sandbox.tools.replies import grep_text
from sandbox.tools.run import ToolResult, run_in_jail

if TYPE_CHECKING:
    from pydantic import BaseModel

    from sandbox.tools.replies import RunnerReply
    from sandbox.vocabulary import ReviewOperation

PRIVATE_COPY_NOTE = " (in the private copy; review and apply to keep it)"


class FileTool(Tool):
    """A tool the runner serves: one request in, one reply out, shaped here."""

    reviewed: ClassVar[ReviewOperation | None] = None  # Write and Edit: a review snapshot is kept

    def request(self, params: BaseModel, target: str) -> dict[str, Any]:
        """The runner's request for ``params`` on the approved canonical ``target``."""
        raise NotImplementedError

    async def run(self, host: ToolHost, call: Invocation) -> ToolResult:
        assert call.target is not None
        reply = await run_in_jail(host.jail, self.request(call.params, call.target), abort=call.abort)
        if self.reviewed is not None:  # the review's diff costs more than linear time: off the event loop
            return await off_loop(self.shape, host, call, reply)
        return self.shape(host, call, reply)

    def shape(self, host: ToolHost, call: Invocation, reply: RunnerReply) -> ToolResult:
        """The runner's reply as the tool's result: an external path named, the runner's own
        bookkeeping (``before``/``after``) dropped."""
        details, content = reply["details"], reply["content"]
        content, details = self.shown(host, call, content, details)
        # A write that landed in the workspace: its review snapshot, and the private copy's note.
        reviewed = self.reviewed if reply["ok"] and call.root == "workspace" else None
        record = None
        if reviewed is not None and call.target is not None:
            record = review.record(
                host.snapshots,
                call.tool_call_id,
                reviewed,
                call.target,
                details,
                turn_id=call.turn_id,
                workspace=host.workspace,
            )
        if call.root == "external" and call.target is not None:
            details.setdefault("path", call.target)  # seed 003 §4a: an external result names its absolute path
        for key in ("before", "after"):
            details.pop(key, None)
        if reviewed is not None and host.jail.tree is not None:
            content += PRIVATE_COPY_NOTE  # the host workspace is untouched until the changeset is applied
            details["private_copy"] = True
        return ToolResult(
            ok=reply["ok"],
            content=content,
            error_code=reply["error_code"],
            details=details,
            root=call.root,
            review=record,
        )

    def shown(
        self, host: ToolHost, call: Invocation, content: str, details: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        """What of the reply the model reads (everything, unless a tool filters it)."""
        del host, call
        return content, details


class Read(FileTool):
    name = "Read"
    params = ReadParams

    def request(self, params: BaseModel, target: str) -> dict[str, Any]:
        assert isinstance(params, ReadParams)
        # ``given`` is the caller's spelling, for the Glob call a directory's refusal suggests.
        return {
            "op": "read",
            "path": target,
            "given": params.path,
            "offset": params.offset,
            "limit": params.limit,
            "raw": params.raw,
        }


class _Writing(FileTool):
    """Write and Edit: outside the workspace and the scratch directory, the jail's filesystem is
    read-only or private to one call (/tmp), so a write there is refused rather than lost."""

    async def run(self, host: ToolHost, call: Invocation) -> ToolResult:
        if call.root == "external":
            return ToolResult(
                ok=False,
                error_code="TOOL_FAILED",
                root="external",
                content=f"{call.target} is outside the workspace and the scratch directory; in this sandbox "
                f"such a write cannot persist. Write inside {host.workspace} or {host.scratch}.",
            )
        return await super().run(host, call)


class Write(_Writing):
    name = "Write"
    params = WriteParams
    reviewed = "write"

    def request(self, params: BaseModel, target: str) -> dict[str, Any]:
        assert isinstance(params, WriteParams)
        return {"op": "write", "path": target, "content": params.content}


class Edit(_Writing):
    name = "Edit"
    params = EditParams
    reviewed = "edit"

    def request(self, params: BaseModel, target: str) -> dict[str, Any]:
        assert isinstance(params, EditParams)
        return {"op": "edit", "path": target, "edits": [e.model_dump() for e in params.edits]}


class Glob(FileTool):
    name = "Glob"
    params = GlobParams

    def request(self, params: BaseModel, target: str) -> dict[str, Any]:
        assert isinstance(params, GlobParams)
        return {"op": "glob", "path": target, "pattern": params.pattern, "limit": params.limit}

    def shown(
        self, host: ToolHost, call: Invocation, content: str, details: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        del call  # a listing is filtered by the policy alone
        if "paths" not in details:
            return content, details
        paths = [p for p in details["paths"] if host.readable(p)]
        details["paths"] = paths
        text = "\n".join(paths) if paths else "no files match"
        if details.get("truncated"):
            text += f"\n[{details['count']} matches; showing the first {len(paths)}; narrow the pattern]"
        return text, details


class Grep(FileTool):
    name = "Grep"
    params = GrepParams

    def request(self, params: BaseModel, target: str) -> dict[str, Any]:
        assert isinstance(params, GrepParams)
        return {
            "op": "grep",
            "path": target,
            "pattern": params.pattern,
            "include": params.include,
            "mode": params.outputMode,
            "context": params.context,
            "head_limit": params.headLimit,
            "case_insensitive": params.caseInsensitive,
        }

    def shown(
        self, host: ToolHost, call: Invocation, content: str, details: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        if "mode" not in details:  # a failure's reply: as it is
            return content, details
        params = call.params
        assert isinstance(params, GrepParams)
        return grep_text(details, host.readable, params.pattern)


class LS(FileTool):
    name = "LS"
    params = LSParams

    def request(self, params: BaseModel, target: str) -> dict[str, Any]:
        assert isinstance(params, LSParams)
        return {"op": "ls", "path": target}


FILE_TOOLS: tuple[FileTool, ...] = (Read(), Write(), Edit(), Glob(), Grep(), LS())


def runner_request(params: BaseModel, target: str) -> dict[str, Any]:
    """The runner's request of the file tool whose parameters ``params`` are, on ``target`` (for a
    caller that runs the runner itself)."""
    for tool in FILE_TOOLS:
        if isinstance(params, tool.params):
            return tool.request(params, target)
    raise TypeError(f"no runner operation for {type(params).__name__}")
