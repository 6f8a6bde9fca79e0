"""Boundary 5's plumbing: a tool's result, and the file tools' runner in the session's jail.

:class:`ToolResult` is what every tool returns. The file tools run ``sandbox/_jailside/runner.py``
inside the same jail as Bash (:func:`run_in_jail`), so they see exactly what Bash sees and cannot
write where Bash cannot. The runner and the glob translator it imports travel as one ``python3 -c``
program, built once at import.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from sandbox import _jailside
from sandbox import exec as executor
from sandbox.errors import BackendUnavailable
from sandbox.tools.replies import RunnerReply, decode_reply, runner_reply
from sandbox.vocabulary import ErrorCode, Root

if TYPE_CHECKING:
    import anyio

    from sandbox.backends.base import Jail

RUNNER_PROGRAM = _jailside.program("runner", "glob")
# The other operations never read a glob: their program leaves the translator out (its compile in
# the jail is a couple of milliseconds of every Read, Write, Edit and LS).
_PLAIN_RUNNER_PROGRAM = _jailside.program("runner")
_GLOB_OPS = frozenset({"glob", "grep"})
RUNNER_CAPTURE = 48 * 1024 * 1024
RUNNER_TIMEOUT_S = 120.0


class ToolResult(BaseModel):
    ok: bool
    content: str
    error_code: ErrorCode | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    root: Root | None = None
    review: dict[str, Any] | None = None


async def run_in_jail(jail: Jail, request: dict[str, Any], abort: anyio.Event | None = None) -> RunnerReply:
    """One runner round trip; the reply carries ``ok``, ``content``, ``error_code``, ``details``."""
    program = RUNNER_PROGRAM if request.get("op") in _GLOB_OPS else _PLAIN_RUNNER_PROGRAM
    if isinstance(request.get("path"), str):
        request = {**request, "path": jail.to_view(request["path"])}
    result = await executor.run(
        jail,
        jail.runner_argv(program),
        stdin=json.dumps(request).encode(),
        timeout=RUNNER_TIMEOUT_S,
        capture_bytes=RUNNER_CAPTURE,
        abort=abort,
        network=False,
        runner=True,
    )
    if result.aborted:
        return RunnerReply(ok=False, error_code="ABORTED", content="aborted", details={})
    if result.timed_out:
        return RunnerReply(ok=False, error_code="TIMEOUT", content="the file tool timed out", details={})
    raw = decode_reply(jail.from_view(result.stdout))  # bounded in depth: the jail writes it
    if raw is not None:
        reply = runner_reply(raw)
        if result.quarantined:  # rw: what git would obey that the write left (a Write of .git/commondir)
            reply["details"]["quarantined"] = result.quarantined
        return reply
    if result.exit_code == 127 or "python3" in result.stderr and "No such file" in result.stderr:
        raise BackendUnavailable("python3 is missing in the jail; the file tools need it", backend=jail.backend)
    return RunnerReply(
        ok=False,
        error_code="TOOL_FAILED",
        details={"exit_code": result.exit_code},
        content=f"the file tool failed in the jail: {result.stderr.strip()[-2000:] or result.exit_code}",
    )
