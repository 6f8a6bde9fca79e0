"""A ``sandbox serve`` client for the tests, driving the server as an agent does.

One process spoken to over stdio, one JSON object per line. The client keeps the
``tool.output`` notifications it sees (so a test can tell stdout from stderr) and answers
``approval.request`` with :attr:`Client.answer` (``"close"`` closes its stdin instead).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from anyio.abc import Process

SANDBOX = str(Path(sys.executable).with_name("sandbox"))
MAX_LINE = 1 << 26
CLOSE_WAIT_S = 10.0


class Client:
    def __init__(self, proc: Process) -> None:
        assert proc.stdout is not None and proc.stdin is not None
        self.proc = proc
        self.lines = BufferedByteReceiveStream(proc.stdout)
        self.next_id = 0
        self.notes: list[dict[str, Any]] = []
        self.approvals: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.answer: Any = {"decision": "deny"}
        # classify.request (seed 004's classifier): the params seen, and the reply: a result, or
        # {"error": ...} for an error answer, or None for no answer at all.
        self.classifications: list[dict[str, Any]] = []
        self.classify: Callable[[dict[str, Any]], Any] = lambda _params: {"error": {"code": -32601, "message": "no"}}

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send((json.dumps(message) + "\n").encode())

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request and return its reply, keeping or answering what the server sends first."""
        self.next_id += 1
        rid = self.next_id
        await self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            message: dict[str, Any] = json.loads(await self.lines.receive_until(b"\n", MAX_LINE))
            if message.get("id") == rid and "method" not in message:
                return message
            if message.get("method") == "tool.output":
                self.notes.append(message["params"])
            elif "method" in message and "id" not in message:
                self.events.append(message)  # other notifications (network.denied ...)
            elif message.get("method") == "classify.request":
                self.classifications.append(message["params"])
                reply = self.classify(message["params"])
                if reply is not None:
                    body = reply if isinstance(reply, dict) and "error" in reply else {"result": reply}
                    await self.send({"jsonrpc": "2.0", "id": message["id"], **body})
            elif message.get("method") == "approval.request":
                self.approvals.append(message["params"])
                if self.answer == "close":
                    assert self.proc.stdin is not None
                    await self.proc.stdin.aclose()
                    continue
                await self.send({"jsonrpc": "2.0", "id": message["id"], "result": self.answer})

    def output(self, tool_call_id: str, stream: str) -> str:
        return "".join(n["data"] for n in self.notes if n["tool_call_id"] == tool_call_id and n["stream"] == stream)


@contextlib.asynccontextmanager
async def serve() -> AsyncIterator[Client]:
    """A ``sandbox serve`` child and its client, ended as an agent ends it: its stdin closed.

    The server then closes its sessions and exits. Killed only if it has not within
    ``CLOSE_WAIT_S``: a SIGKILLed executor leaves its calls' cgroups to ``sandbox gc``.
    """
    proc = await anyio.open_process([SANDBOX, "serve"], env=dict(os.environ))
    try:
        yield Client(proc)
    finally:
        with anyio.CancelScope(shield=True):
            if proc.returncode is None and proc.stdin is not None:
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await proc.stdin.aclose()
                with anyio.move_on_after(CLOSE_WAIT_S):
                    await proc.wait()
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            await proc.aclose()
