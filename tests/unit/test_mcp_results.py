"""An MCP result says the same to the model whichever part a client reads: ``structuredContent``'s
``text`` is ``content``'s text (Claude Code and Codex CLI show only the structured part, Gemini CLI
and opencode only the text; tests/integration/test_agents.py drives them)."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest

from sandbox.mcp import tools
from sandbox.tools.run import ToolResult

READ = ToolResult(ok=True, content="     1\talpha\n     2\tbeta", root="workspace", details={"lines": 2})
REFUSED = ToolResult(
    ok=False,
    error_code="TOOL_DENIED",
    content="/etc/x is outside the workspace and the scratch directory; write inside /ws instead.",
    root="external",
    details={"rule_id": "path.external-write"},
)
BASH = ToolResult(
    ok=False,
    error_code="TOOL_FAILED",
    content="out\n[stderr]\nerr\n[exit code 2]",
    root="workspace",
    details={"exit_code": 2, "stdout": "out\n", "stderr": "err\n", "backend": "bwrap"},
)


def parts(result: types.CallToolResult) -> tuple[str, dict[str, Any]]:
    block = result.content[0]
    assert isinstance(block, types.TextContent) and isinstance(result.structured_content, dict)
    return block.text, result.structured_content


@pytest.mark.parametrize(("name", "result"), [("Read", READ), ("Write", REFUSED), ("Bash", BASH)])
def test_the_structured_part_carries_the_text(name: str, result: ToolResult) -> None:
    said, body = parts(tools.call_result(name, "call-1", result))
    assert body["text"] == said and list(body)[0] == "text"  # first: a truncating client keeps it
    assert body["ok"] is result.ok and body["error_code"] == result.error_code


def test_a_read_carries_the_file_and_a_refusal_its_reason() -> None:
    assert parts(tools.call_result("Read", "c", READ))[1]["text"] == "     1\talpha\n     2\tbeta"
    refused = parts(tools.call_result("Write", "c", REFUSED))[1]
    assert refused["text"] == f"[TOOL_DENIED] {REFUSED.content}" and refused["details"]["rule_id"]


def test_bash_keeps_its_streams_apart_besides_the_text() -> None:
    body = parts(tools.call_result("Bash", "c", BASH))[1]
    assert (body["stdout"], body["stderr"], body["exit_code"]) == ("out\n", "err\n", 2)
    assert body["text"] == "[TOOL_FAILED] out\n[stderr]\nerr\n[exit code 2]"


def test_a_refusal_before_any_session_says_the_same_in_both_parts() -> None:
    result = tools.error_result("Bash", "BACKEND_UNAVAILABLE", "bubblewrap is missing", backend="bwrap")
    said, body = parts(result)
    assert result.is_error and body["text"] == said == "[BACKEND_UNAVAILABLE] bubblewrap is missing"
