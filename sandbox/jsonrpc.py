"""JSON-RPC 2.0 over a pair of file descriptors, one JSON object per line, whatever the methods.

Here is what ``sandbox serve`` (:mod:`sandbox.server`) needs of the wire and nothing of the
sandbox: the client's lines, each bounded (:data:`MAX_LINE`) and parsed with bounded depth; whole
lines written onto a non-blocking stdout; the error codes; and the translation of whatever ends a
request (invalid params, one of our errors, a resource running out, a bug) into the error its
reply carries.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from pydantic import ValidationError

from sandbox import jsonbound
from sandbox.backends.child import PIPE_SIZE
from sandbox.errors import InvalidArgument, SandboxError, ToolFailed

if TYPE_CHECKING:
    from pydantic import BaseModel

    from sandbox.backends.child import FdReceiveStream

MAX_LINE = 64 * 1024 * 1024
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, SANDBOX_ERROR = -32700, -32600, -32601, -32602, -32000
INTERNAL_ERROR = -32603
# What one request can run out of without the process being at fault: it ends that request only.
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC, errno.EDQUOT, errno.EAGAIN})


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


class Writer:
    """Serialises whole lines onto a non-blocking fd (stdout)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._lock = anyio.Lock()
        self.closed = False

    async def send(self, message: dict[str, Any]) -> None:
        try:
            text = json.dumps(message, separators=(",", ":"))
        except (ValueError, TypeError, RecursionError) as exc:
            if "id" not in message:
                return  # a notification that cannot be written is dropped, not the server
            error = {"code": INTERNAL_ERROR, "message": f"the reply cannot be written as JSON: {exc}"}
            text = json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error})
        data = memoryview((text + "\n").encode())
        async with self._lock:
            while data and not self.closed:
                try:
                    data = data[os.write(self.fd, data) :]
                except BlockingIOError:
                    await anyio.wait_writable(self.fd)
                except (BrokenPipeError, OSError):
                    self.closed = True


class Lines:
    """The client's lines, each at most ``limit`` bytes: a longer one is read to its end, dropped
    as it streams by (memory stays bounded whatever its length) and reported as ``None``."""

    def __init__(self, stream: FdReceiveStream, limit: int, pending: bytes = b"") -> None:
        self._stream, self._limit = stream, limit
        self._buffer = bytearray(pending)
        self._scanned = 0  # no newline before this offset of the buffer

    async def receive(self) -> bytes | None:
        """The next line without its newline; ``anyio.EndOfStream`` at the end (an unfinished last
        line is dropped: the client is gone). Each read is a checkpoint: a flood of lines shares
        the loop with the requests it started."""
        skipping = False
        while (end := self._buffer.find(b"\n", self._scanned)) < 0:
            self._scanned = len(self._buffer)
            if self._scanned > self._limit:
                skipping, self._scanned = True, 0
                self._buffer.clear()
            await anyio.lowlevel.checkpoint()
            self._buffer += await self._stream.receive(PIPE_SIZE)
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        self._scanned = 0
        return None if skipping or len(line) > self._limit else line


def parse(line: bytes) -> Any:
    """The line's JSON value, bounded in size and depth (:mod:`sandbox.jsonbound`). Parsed here:
    ``json.loads`` holds the GIL throughout, so a worker thread would not free the loop meanwhile."""
    return jsonbound.loads(line, max_bytes=MAX_LINE)


def unexpected(exc: BaseException, method: str = "the request") -> RpcError:
    """An exception no handler expected, as the answer to the request it ended.

    Running out of descriptors, memory or disk is that request's failure (``TOOL_FAILED`` with the
    errno): the server keeps serving, and a later request may find the resource back. Anything else
    is a bug: the client gets an internal error, the traceback goes to stderr.
    """
    ours = _first(exc, SandboxError)
    if isinstance(ours, SandboxError):  # one of ours, inside a task group's exception group
        return RpcError(SANDBOX_ERROR, ours.message, ours.to_dict())
    found = _resource_error(exc)
    if found is not None:
        error = ToolFailed(f"{method}: out of resources: {found}", errno=_errno_name(found))
        return RpcError(SANDBOX_ERROR, error.message, error.to_dict())
    sys.stderr.write("".join(traceback.format_exception(exc)))
    error = ToolFailed(f"{method}: internal error: {type(exc).__name__}: {exc}")
    return RpcError(INTERNAL_ERROR, error.message, error.to_dict())


def _resource_error(exc: BaseException) -> BaseException | None:
    """``exc``, or the first exception in its group or chain, that is a resource running out."""
    if isinstance(exc, MemoryError) or isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
        return exc
    if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
        return exc  # no thread (a process limit): as EAGAIN
    inner = list(exc.exceptions) if isinstance(exc, BaseExceptionGroup) else []
    inner += [e for e in (exc.__cause__, exc.__context__) if e is not None]
    return next((found for e in inner if (found := _resource_error(e)) is not None), None)


def _first(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` or the first exception of ``kind`` in its group, depth first."""
    if isinstance(exc, kind):
        return exc
    inner = exc.exceptions if isinstance(exc, BaseExceptionGroup) else ()
    return next((found for e in inner if (found := _first(e, kind)) is not None), None)


def _errno_name(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, "EUNKNOWN")
    return "ENOMEM" if isinstance(exc, MemoryError) else "EAGAIN"


def validate_params(method: str, model: type[BaseModel], params: Any) -> BaseModel:
    """``params`` as ``model``, or the INVALID_PARAMS error naming each key and its problem."""
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'params'}: {e['msg']}" for e in exc.errors())
        raise RpcError(
            INVALID_PARAMS, f"invalid params for {method}: {problems}", InvalidArgument(problems).to_dict()
        ) from exc
