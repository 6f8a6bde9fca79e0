"""Helpers for tests on the fake backend: a profile naming it, and a ``sandbox serve`` client.

The client drives the server as an agent does, over its stdin and stdout, and keeps the
``tool.output`` notifications it sees so a test can tell stdout from stderr.
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

from sandbox import profile as profiles
from sandbox.backends.fake import FakeBackend, FakeJail, FakeProcess

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from anyio.abc import Process

SANDBOX = str(Path(sys.executable).with_name("sandbox"))
MAX_LINE = 1 << 26


def fake_profile(name: str = "default", **overrides: Any) -> profiles.Profile:
    """A shipped profile with dotted-key overrides, as is: a jail opened by hand needs no backend named."""
    return profiles.load(name).with_overrides(**overrides)


async def open_fake(backend: FakeBackend, workspace: Path, **overrides: Any) -> FakeJail:
    """A fake jail over ``workspace`` opened through the backend's template (checks included)."""
    jail = await backend.open_jail(workspace, fake_profile(**overrides))
    assert isinstance(jail, FakeJail)
    return jail


def only_process(jail: FakeJail) -> FakeProcess:
    assert len(jail.processes) == 1, jail.processes
    return jail.processes[0]


class Client:
    """One ``sandbox serve`` process spoken to over stdio, one JSON object per line."""

    def __init__(self, proc: Process) -> None:
        assert proc.stdout is not None and proc.stdin is not None
        self.proc = proc
        self.lines = BufferedByteReceiveStream(proc.stdout)
        self.next_id = 0
        self.notes: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send((json.dumps(message) + "\n").encode())

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request and return its reply, keeping the notifications that come first."""
        self.next_id += 1
        rid = self.next_id
        await self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            message: dict[str, Any] = json.loads(await self.lines.receive_until(b"\n", MAX_LINE))
            if message.get("id") == rid and "method" not in message:
                return message
            if message.get("method") == "tool.output":
                self.notes.append(message["params"])

    def output(self, tool_call_id: str, stream: str) -> str:
        return "".join(n["data"] for n in self.notes if n["tool_call_id"] == tool_call_id and n["stream"] == stream)


@contextlib.asynccontextmanager
async def serve() -> AsyncIterator[Client]:
    """A ``sandbox serve`` child and its client; the child is killed if the test left it running."""
    proc = await anyio.open_process([SANDBOX, "serve"], env=dict(os.environ))
    try:
        yield Client(proc)
    finally:
        with anyio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            await proc.aclose()
