"""Boundary 5 for a plugin tool: its command run in the jail, JSON on stdin, JSON read from stdout.

A call passes the five boundaries like a built-in tool's and runs the tool's ``command`` in the
jail: the workspace as its working directory, the environment Bash gets plus
``SANDBOX_PLUGIN_DIR``, ``SANDBOX_PLUGIN_ID`` and ``SANDBOX_PLUGIN_TOOL`` (``${PLUGIN_DIR}`` in a
command word is replaced by the plugin's directory in the jail). The arguments arrive on stdin as
one JSON object; stdout must be one JSON value. An object with a ``content`` key is a result:
``content`` (a string, or any JSON value, shown as JSON), ``isError`` (true: the call failed,
TOOL_FAILED) and ``details`` (an object, passed on). Any other JSON value is the content itself.
A non-zero exit, stdout that is not JSON, a timeout or an abort fail the call (TOOL_FAILED,
TIMEOUT, ABORTED), keeping stdout and stderr (bounded) in the details.

Apart from :mod:`sandbox.plugins` because only the session runs a tool: what declares, checks
and registers plugins needs no process, no jail and no executor.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sandbox import exec as executor
from sandbox.backends.environment import SAFE_PATH
from sandbox.tools.run import ToolResult

if TYPE_CHECKING:
    from collections.abc import Mapping

    import anyio

    from sandbox.backends.base import Jail
    from sandbox.plugins import PluginArgs, PluginTool
    from sandbox.profile import Profile
    from sandbox.vocabulary import ErrorCode

STDOUT_CAPTURE = 8 * 1024 * 1024  # machine-read: kept whole up to this, else the call fails
KEPT_TEXT = 16 * 1024  # of stdout and of stderr, in a result's details
PLUGIN_DIR_WORD = "${PLUGIN_DIR}"


def command_for(tool: PluginTool) -> list[str]:
    return [word.replace(PLUGIN_DIR_WORD, tool.plugin.jail_dir) for word in tool.manifest.command]


def timeout_for(tool: PluginTool, profile: Profile) -> float:
    """The manifest's timeout (else the profile's default), never above the profile's ceiling."""
    wanted = tool.manifest.timeout if tool.manifest.timeout is not None else profile.timeouts.default_s
    return min(float(wanted), float(profile.timeouts.max_s))


async def run(
    jail: Jail,
    tool: PluginTool,
    params: PluginArgs,
    *,
    env: Mapping[str, str],
    cwd: str,
    abort: anyio.Event | None = None,
) -> ToolResult:
    """Boundary 5 for a plugin tool: its command in the jail, JSON on stdin, JSON read from stdout."""
    timeout = timeout_for(tool, jail.profile)
    plugin_env = {
        **env,
        # A plugin is the user's tool, not the project's: its bare command words (`python3`, `node`)
        # are found in the system directories only, never in the workspace's .venv/bin (issue 31, 1).
        "PATH": SAFE_PATH,
        "SANDBOX_PLUGIN_DIR": tool.plugin.jail_dir,
        "SANDBOX_PLUGIN_ID": tool.plugin.id,
        "SANDBOX_PLUGIN_TOOL": tool.manifest.name,
    }
    result = await executor.run(
        jail,
        command_for(tool),
        stdin=json.dumps(params.arguments()).encode(),
        timeout=timeout,
        env=plugin_env,
        cwd=cwd,
        capture_bytes=STDOUT_CAPTURE,
        abort=abort,
    )
    details: dict[str, Any] = {
        "plugin": tool.plugin.id,
        "tool": tool.manifest.name,
        "exit_code": result.exit_code,
        "signal": result.signal,
        "duration_ms": result.duration_ms,
        "stdout": _kept(result.stdout),
        "stderr": _kept(result.stderr),
        "stdout_bytes": result.stdout_bytes,
        "stderr_bytes": result.stderr_bytes,
    }
    if result.network:
        details["network"] = result.network

    def failed(code: ErrorCode, text: str) -> ToolResult:
        stderr = result.stderr.strip()
        if stderr:
            text += "\n[stderr]\n" + _kept(stderr, 2000)
        return ToolResult(ok=False, error_code=code, content=text, details=details, root="workspace")

    name = tool.spec.name
    if result.timed_out:
        return failed("TIMEOUT", f"{name} timed out after {timeout:g} s; the process tree was killed")
    if result.aborted:
        return failed("ABORTED", f"{name} was aborted; the process tree was killed")
    if result.exit_code != 0:
        return failed("TOOL_FAILED", f"{name} failed: its command exited with {result.exit_code}")
    if result.stdout_truncated:
        return failed("TOOL_FAILED", f"{name} wrote more than {STDOUT_CAPTURE} bytes on stdout; its result was lost")
    try:
        value = json.loads(result.stdout)
    except ValueError as exc:
        return failed("TOOL_FAILED", f"{name} did not answer JSON on stdout ({exc})")
    details.pop("stdout")  # it is the result below
    if isinstance(value, dict) and "content" in value:
        content = value["content"]
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        extra = value.get("details")
        if isinstance(extra, dict):
            details["result_details"] = extra
        if value.get("isError") is True:
            return ToolResult(ok=False, error_code="TOOL_FAILED", content=text, details=details, root="workspace")
        return ToolResult(ok=True, content=text, details=details, root="workspace")
    details["result"] = value
    return ToolResult(ok=True, content=json.dumps(value, ensure_ascii=False), details=details, root="workspace")


def _kept(text: str, limit: int = KEPT_TEXT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[… {len(text) - limit} characters left out …]\n{text[-half:]}"
