"""Where a winjob jail's commands see the workspace, and the file tools' paths moved to match.

Apart from the jail (:mod:`sandbox.backends.winjob`) because it is pure path and JSON work:
Windows has no mount namespace, so under ``copy`` the commands work in a private copy at another
path. :class:`View` moves a host path into the copy and back (compared as Windows does, without
case), and rewrites the file tools' runner requests and replies; :class:`ViewReply` reads a
runner's reply whole and hands it on with the workspace's paths again.
"""

from __future__ import annotations

import contextlib
import json
import ntpath
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import ByteReceiveStream

from sandbox.backends.winjob_process import READ_SIZE

if TYPE_CHECKING:
    from pathlib import Path


class View:
    """Where the jail's commands see the workspace: ``root`` (the workspace, or its private copy)."""

    def __init__(self, workspace: Path, root: Path) -> None:
        self.workspace = workspace
        self.root = root
        self.moved = root != workspace

    @staticmethod
    def _swap(path: str, old: Path, new: Path) -> str | None:
        """``path`` under ``old`` (compared as Windows does, without case), moved under ``new``."""
        base = str(old).rstrip("\\/")
        if ntpath.normcase(path[: len(base)]) != ntpath.normcase(base):
            return None
        rest = path[len(base) :]
        if rest and rest[0] not in "\\/":
            return None
        return str(new).rstrip("\\/") + rest

    def into(self, path: str) -> str:
        """A host path as the jail's commands reach it (a path elsewhere is left as it is)."""
        return self._swap(path, self.workspace, self.root) or path if self.moved else path

    def out(self, path: str) -> str:
        return self._swap(path, self.root, self.workspace) or path if self.moved else path

    def request(self, data: bytes) -> tuple[bytes, str | None]:
        """A runner request with its paths moved into the view, and its operation."""
        try:
            request = json.loads(data)
        except ValueError:
            return data, None
        if not isinstance(request, dict):
            return data, None
        if self.moved:
            for key in ("path", "given"):
                if isinstance(request.get(key), str):
                    request[key] = self.into(request[key])
        op = request.get("op")
        return json.dumps(request).encode(), op if isinstance(op, str) else None

    def reply(self, data: bytes, op: str | None) -> bytes:
        """A runner reply with every path in the view named by its workspace path again. A Read's
        ``content`` is the file's and left alone; another's is a message, whose mentions of the
        copy's root are replaced."""
        try:
            reply = json.loads(data)
        except ValueError:
            return data
        if not isinstance(reply, dict):
            return data
        mapped = {k: self._out_all(v) for k, v in reply.items() if k != "content"}
        content = reply.get("content")
        if isinstance(content, str) and op != "read":
            content = content.replace(str(self.root), str(self.workspace))
        return json.dumps({**mapped, "content": content}).encode()

    def _out_all(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.out(value)
        if isinstance(value, list | tuple):
            return [self._out_all(v) for v in value]
        if isinstance(value, dict):
            return {k: self._out_all(v) for k, v in value.items()}
        return value


class ViewReply(ByteReceiveStream):
    """A runner's stdout read whole (one JSON reply), then handed on with :meth:`View.reply`'s paths."""

    def __init__(self, inner: ByteReceiveStream, view: View, op: str | None) -> None:
        self.inner = inner
        self.view = view
        self.op = op
        self._out: bytes | None = None

    async def receive(self, max_bytes: int = READ_SIZE) -> bytes:
        if self._out is None:
            chunks = []
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    chunks.append(await self.inner.receive())
            self._out = self.view.reply(b"".join(chunks), self.op)
        if not self._out:
            raise anyio.EndOfStream
        chunk, self._out = self._out[:max_bytes], self._out[max_bytes:]
        return chunk

    async def aclose(self) -> None:
        await self.inner.aclose()

    def close(self) -> None:
        self.inner.close()  # type: ignore[attr-defined]
