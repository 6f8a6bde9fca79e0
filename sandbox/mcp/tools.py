"""The sandbox's tools as MCP sees them: definitions in, ``CallToolResult`` out.

Input schemas are the pydantic parameter models' own JSON Schemas (:mod:`sandbox.tools.params`),
so MCP validates nothing the session would not: the session validates again and answers a bad
argument as an ``isError`` result naming each problem. Every result carries ``structuredContent``
(``text``, ``ok``, ``error_code``, the tool, its call id) and, for Bash, the exit status and both
streams apart with their byte counts and truncation; whatever else the result's details hold (a
review record, network denials, a private copy's note) is under ``details``.

``text`` is the very text of ``content``, first in the object: clients differ in which part they
show the model. Claude Code (2.1) and Codex CLI (0.171) send the model only ``structuredContent``,
serialised as JSON, whenever a result has one; Gemini CLI (0.61) and opencode (1.18) send only
``content``'s text (Gemini CLI also quotes the raw result, both parts, for an error). Without
``text`` a Read under the first two would reach the model as metadata without the file, and a
refusal as a code without its reason (tests/integration/test_agents.py drives all four).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import mcp_types as types

from sandbox.tools.params import REGISTRY

if TYPE_CHECKING:
    from sandbox.tools.run import ToolResult
    from sandbox.vocabulary import ErrorCode, Notice

_WORKSPACE_NOTE = (
    " It runs inside an OS-level sandbox (bubblewrap or Docker): only the workspace and a scratch "
    "directory ($SANDBOX_SCRATCH_DIR) are writable, the network is off unless the profile opens it, "
    "and a call the policy asks about may be put to the user first."
)

DESCRIPTIONS: dict[str, str] = {
    "Bash": (
        "Run a non-interactive shell command (bash -c) in the workspace and return its exit code, stdout "
        "and stderr (separately in structuredContent). The working directory is the workspace root; "
        "`timeout` is in seconds (default 60). Output streams as progress notifications while it runs. "
        "Nothing started by the command survives the call."
    ),
    "Read": (
        "Read a text file; `path` is relative to the workspace root or absolute. `offset` (1-based line) "
        "and `limit` (lines) read a window of a large file. Lines come back numbered."
    ),
    "Write": (
        "Create or overwrite a whole file with `content` (parent directories are created). Prefer Edit "
        "for changing part of an existing file. Each write is kept as a review snapshot that "
        "SandboxRollback can undo."
    ),
    "Edit": (
        "Replace exact text in a file: each of `edits` is {old_text, new_text}; old_text must occur "
        "exactly once. Read the file first and copy old_text verbatim, whitespace included."
    ),
    "Glob": (
        "List files whose path matches a glob `pattern` (e.g. `**/*.py`), under `path` (default: the "
        "workspace root); at most `limit` paths, sorted."
    ),
    "Grep": (
        "Search file contents with a regular expression `pattern` under `path` (default: the workspace), "
        "optionally only in files matching `include` (a glob). outputMode: content (matching lines, "
        "with `context` lines around), filesWithMatches or count."
    ),
    "LS": "List the entries of a directory (default: the workspace root).",
}

_ANNOTATIONS: dict[str, types.ToolAnnotations] = {
    "Bash": types.ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False),
    "Write": types.ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False),
    "Edit": types.ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False),
}
_READ_ONLY = types.ToolAnnotations(read_only_hint=True, open_world_hint=False)

_BASH_FIELDS = (
    "exit_code",
    "signal",
    "stdout",
    "stderr",
    "stdout_bytes",
    "stderr_bytes",
    "stdout_truncated",
    "stderr_truncated",
    "timed_out",
    "aborted",
    "duration_ms",
)


def definitions() -> list[types.Tool]:
    """The built-in tools, each with its parameter model's JSON Schema."""
    return [
        types.Tool(
            name=name,
            description=DESCRIPTIONS.get(name, spec.description) + _WORKSPACE_NOTE,
            input_schema=spec.params.model_json_schema(),
            annotations=_ANNOTATIONS.get(name, _READ_ONLY),
        )
        for name, spec in REGISTRY.items()
        if not spec.plugin
    ]


def text(result: ToolResult) -> str:
    """What the model reads: the result's text, a failure's prefixed with its error code."""
    return result.content if result.ok or not result.error_code else f"[{result.error_code}] {result.content}"


def structured(name: str, call_id: str, result: ToolResult) -> dict[str, Any]:
    """``structuredContent`` of a result: its text, the error code, and for Bash both streams apart."""
    details = dict(result.details)
    body: dict[str, Any] = {
        "text": text(result),
        "ok": result.ok,
        "error_code": result.error_code,
        "tool": name,
        "tool_call_id": call_id,
        "root": result.root,
    }
    if name == "Bash" and "exit_code" in details:
        body.update({key: details.pop(key) for key in _BASH_FIELDS if key in details})
        network = details.get("network") or {}
        body["network_denials"] = list(network.get("denials", []))
    if result.review is not None:
        body["review"] = result.review
    body["details"] = details
    # Whatever a result's details hold, the wire gets JSON (a path object, a tuple): never a crash.
    return dict(json.loads(json.dumps(body, default=str)))


def call_result(name: str, call_id: str, result: ToolResult) -> types.CallToolResult:
    """A sandbox result as MCP's: its text for the model, its data structured, ``isError`` unless ok."""
    body = structured(name, call_id, result)
    return types.CallToolResult(
        content=[types.TextContent(text=body["text"])],
        structured_content=body,
        is_error=not result.ok,
    )


def with_notices(result: types.CallToolResult, notices: list[Notice]) -> types.CallToolResult:
    """``result`` with the session's opening notices after its text, in both parts alike."""
    trailer = "".join(f"\n[sandbox: {notice['message']}]" for notice in notices)
    said = result.content[0]
    assert isinstance(said, types.TextContent)  # every result of ours is one text block
    structured = dict(result.structured_content or {})
    structured["text"] = said.text + trailer
    structured["notices"] = notices
    return result.model_copy(
        update={"content": [types.TextContent(text=said.text + trailer)], "structured_content": structured}
    )


def error_result(name: str, code: ErrorCode, message: str, **data: Any) -> types.CallToolResult:
    """A refusal before any session call (the session could not open, an unknown extra tool)."""
    said = f"[{code}] {message}"
    body = {"text": said, "ok": False, "error_code": code, "tool": name, "details": data}
    return types.CallToolResult(
        content=[types.TextContent(text=said)],
        structured_content=dict(json.loads(json.dumps(body, default=str))),
        is_error=True,
    )
