"""What the MCP tests share (stdio: tests/integration/test_mcp.py, HTTP: test_mcp_http.py): an
elicitation callback answering from a script, a tool result's structured and text parts, and a
Bash call the client walks away from while it runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types

from sandbox.audit import AuditLog
from tests.conftest import survivors

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractAsyncContextManager

    from mcp import ClientSession
    from mcp.client import ClientRequestContext

__all__ = ["Answer", "Asker", "audited_errors", "data", "leave_mid_call", "text", "until"]

Answer = types.ElicitResult | str


class Asker:
    """An elicitation callback answering from a script; it records each question."""

    def __init__(self, *answers: Answer, reading_s: float = 0.0) -> None:
        self.answers = list(answers)
        self.asked: list[types.ElicitRequestParams] = []
        self.reading_s = reading_s  # how long the "user" reads the question: 0 is a client answering itself

    async def __call__(self, context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        del context  # the question is all a script reads
        self.asked.append(params)
        await anyio.sleep(self.reading_s)
        answer = self.answers.pop(0) if self.answers else "deny"
        if isinstance(answer, types.ElicitResult):
            return answer
        return types.ElicitResult(action="accept", content={"decision": answer})


def data(result: types.CallToolResult) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


def text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def until(check: Callable[[], object]) -> None:
    """Poll ``check`` until it holds; the caller's ``fail_after`` bounds the wait."""
    while not check():
        await anyio.sleep(0.05)


async def leave_mid_call(connection: AbstractAsyncContextManager[ClientSession], marker: str) -> None:
    """Start ``sleep <marker>`` through Bash, leave ``connection`` once it runs, and return when no
    process carrying ``marker`` is left; a minute bounds it all."""
    with anyio.fail_after(60):
        async with connection as s, anyio.create_task_group() as tg:
            tg.start_soon(s.call_tool, "Bash", {"command": f"sleep {marker}"})
            await until(lambda: survivors(marker))
            tg.cancel_scope.cancel()
        await until(lambda: not survivors(marker))


def audited_errors(marker: str, tool: str | None = None) -> list[str | None]:
    """The error codes the audit log holds for the calls (of ``tool``) whose arguments carry ``marker``."""
    rows = AuditLog().rows()
    return [r["error_code"] for r in rows if marker in r["args_preview"] and tool in (None, r["tool"])]
