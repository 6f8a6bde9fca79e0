"""The Bash tool: a non-interactive shell command, run by the jail's shell (bash through ``sh`` on
POSIX, the profile's shell on Windows), its streams apart, its tree killed at the end; the result
says the exit status, a timeout with where the limit came from, an abort, the refused
destinations and what a ``rw`` call left that git would obey."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox import exec as executor
from sandbox import remedy
from sandbox.backends import landlock_audit
from sandbox.backends.base import NO_BASH
from sandbox.errors import ShellNotFound
from sandbox.gitsweep import summary as quarantine_summary
from sandbox.redaction import redact_output
from sandbox.tools.base import Invocation, Tool, ToolHost
from sandbox.tools.params import BashParams
from sandbox.tools.run import ToolResult

if TYPE_CHECKING:
    import anyio

    from sandbox.backends.base import Jail
    from sandbox.exec import OutputCallback


class Bash(Tool):
    """A shell command in the jail: its streams apart, its exit status, its tree killed at the end."""

    name = "Bash"
    params = BashParams
    needs_target = False
    runs_commands = True

    async def run(self, host: ToolHost, call: Invocation) -> ToolResult:
        params = call.params
        assert isinstance(params, BashParams)
        return await run_bash(
            host.jail,
            params,
            shell=host.shell_for(call.turn_id, params.shell),
            env=host.scratch_env(),
            on_stdout=call.on_stdout,
            on_stderr=call.on_stderr,
            abort=call.abort,
        )


async def run_bash(
    jail: Jail,
    params: BashParams,
    *,
    env: dict[str, str],
    shell: str | None = None,
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
    abort: anyio.Event | None = None,
) -> ToolResult:
    """``params.command`` in ``shell`` (a catalogue id; the jail's own when None), as
    :meth:`~sandbox.backends.base.Jail.shell_argv` runs it."""
    result = await executor.run(
        jail,
        jail.shell_argv(params.command, shell),
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
    redacted = 0
    if jail.profile.policy.redact_output:  # seed 003 §8: before the result is kept or shown
        (stdout, on_out), (stderr, on_err) = redact_output(result.stdout), redact_output(result.stderr)
        redacted = on_out + on_err
        if redacted:
            result = result.model_copy(update={"stdout": stdout, "stderr": stderr})
    details = result.model_dump()
    if redacted:
        details["redacted"] = redacted
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
    parts += landlock_audit.lines(result.kernel_denials)
    if result.quarantined:
        parts.append(quarantine_summary(result.quarantined))
    return "\n".join(parts) if parts else "(no output)"


def denial_lines(network: dict[str, Any] | None) -> list[str]:
    """One line per refused destination (host and port), for the model: who refused, and why."""
    seen: dict[tuple[str, int], str] = {}
    for denial in (network or {}).get("denials", []):
        seen.setdefault((denial["host"], denial["port"]), f"[{denial['line']}]")
    return list(seen.values())
