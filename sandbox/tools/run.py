"""Boundary 5: run a validated, authorized tool call inside the session's jail.

Bash runs through ``exec.run``. The file tools run ``sandbox/_jailside/runner.py`` inside the
same jail, so they see exactly what Bash sees and cannot write where Bash cannot. The runner and
the glob translator it imports travel as one ``python3 -c`` program, built once at import.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from sandbox import _jailside, remedy
from sandbox import exec as executor
from sandbox.backends.base import NO_BASH
from sandbox.errors import BackendUnavailable, ShellNotFound
from sandbox.tools.params import (
    BashParams,
    EditParams,
    GlobParams,
    GrepParams,
    LSParams,
    ReadParams,
    WriteParams,
)
from sandbox.tools.replies import RunnerReply, decode_reply, runner_reply
from sandbox.vocabulary import ErrorCode, Root

if TYPE_CHECKING:
    import anyio

    from sandbox.backends.base import Jail
    from sandbox.exec import OutputCallback

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


async def run_bash(
    jail: Jail,
    params: BashParams,
    *,
    env: dict[str, str],
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
    abort: anyio.Event | None = None,
) -> ToolResult:
    result = await executor.run(
        jail,
        jail.shell_argv(params.command),
        timeout=params.timeout,
        env=env,
        on_stdout=on_stdout,
        on_stderr=on_stderr,
        abort=abort,
    )
    if result.exit_code == 127 and NO_BASH in result.stderr:
        raise ShellNotFound(
            "bash is not installed in the jail; the image or root filesystem needs it", backend=jail.backend
        )
    details = result.model_dump()
    if result.timed_out:
        given = params.timeout if "timeout" in params.model_fields_set else None
        source = remedy.for_call(given, params.timeout, jail.profile, "Bash")
        details["timeout"] = source.to_dict()  # where the limit came from, and how to raise it
        status = f"{source.line()}; the process tree was killed; {source.how_to_raise()}"
        return ToolResult(
            ok=False, error_code="TIMEOUT", root="workspace", details=details, content=_bash_text(result, status)
        )
    if result.aborted:
        return ToolResult(
            ok=False,
            error_code="ABORTED",
            root="workspace",
            details=details,
            content=_bash_text(result, "aborted; the process tree was killed"),
        )
    ok = result.exit_code == 0
    return ToolResult(
        ok=ok,
        error_code=None if ok else "TOOL_FAILED",
        root="workspace",
        details=details,
        content=_bash_text(result, None if ok else f"exit code {result.exit_code}"),
    )


def _bash_text(result: executor.ExecResult, status: str | None) -> str:
    parts = [result.stdout.rstrip("\n")] if result.stdout else []
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if status:
        parts.append(f"[{status}]")
    parts += denial_lines(result.network)
    if result.quarantined:
        from sandbox.gitsweep import summary

        parts.append(summary(result.quarantined))
    return "\n".join(parts) if parts else "(no output)"


def denial_lines(network: dict[str, Any] | None) -> list[str]:
    """One line per refused destination (host and port), for the model: who refused, and why."""
    seen: dict[tuple[str, int], str] = {}
    for denial in (network or {}).get("denials", []):
        seen.setdefault((denial["host"], denial["port"]), f"[{denial['line']}]")
    return list(seen.values())


def runner_request(params: BaseModel, target: str) -> dict[str, Any]:
    """The in-jail request for a file tool; ``target`` is the approved canonical path."""
    if isinstance(params, ReadParams):
        # ``given`` is the caller's spelling, for the Glob call a directory's refusal suggests.
        return {
            "op": "read",
            "path": target,
            "given": params.path,
            "offset": params.offset,
            "limit": params.limit,
            "raw": params.raw,
        }
    if isinstance(params, WriteParams):
        return {"op": "write", "path": target, "content": params.content}
    if isinstance(params, EditParams):
        return {"op": "edit", "path": target, "edits": [e.model_dump() for e in params.edits]}
    if isinstance(params, GlobParams):
        return {"op": "glob", "path": target, "pattern": params.pattern, "limit": params.limit}
    if isinstance(params, GrepParams):
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
    if isinstance(params, LSParams):
        return {"op": "ls", "path": target}
    raise TypeError(f"no runner operation for {type(params).__name__}")


async def run_in_jail(jail: Jail, request: dict[str, Any], abort: anyio.Event | None = None) -> RunnerReply:
    """One runner round trip; the reply carries ``ok``, ``content``, ``error_code``, ``details``."""
    program = RUNNER_PROGRAM if request.get("op") in _GLOB_OPS else _PLAIN_RUNNER_PROGRAM
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
    raw = decode_reply(result.stdout)  # bounded in depth: the jail writes it
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
