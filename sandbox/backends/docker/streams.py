"""Bytes between us and a container: the SDK's hijacked sockets seen as anyio streams.

Docker multiplexes a container's stdout and stderr on one socket in frames. A :class:`Pump`
reads one ``docker exec``'s socket in a thread of its own and feeds two bounded memory streams
(:class:`ChunkStream`), so a full stream holds the thread back and the daemon with it: memory
stays bounded whatever the command prints. The warm jail's link to its agent reads frames the
same way (:mod:`sandbox.backends.docker.warm`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
from anyio.abc import ByteReceiveStream
from docker.utils.socket import frames_iter

from sandbox.errors import BackendUnavailable

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

STDOUT, STDERR = 1, 2
BUFFERED_CHUNKS = 64


class ChunkStream(ByteReceiveStream):
    """A memory object stream of byte chunks seen as a byte stream."""

    def __init__(self, receive: MemoryObjectReceiveStream[bytes]) -> None:
        self._receive = receive
        self._pending = b""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._pending:
            self._pending = await self._receive.receive()  # EndOfStream ends the byte stream too
        chunk, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return chunk

    async def aclose(self) -> None:
        self._receive.close()

    def close(self) -> None:
        self._receive.close()


def unwrap_socket(sock: Any) -> socket.socket | None:
    raw = getattr(sock, "_sock", sock)
    return raw if isinstance(raw, socket.socket) else None


class Pump:
    """Reads one exec's multiplexed output in a thread and forwards it frame by frame."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        out_send, out_recv = anyio.create_memory_object_stream[bytes](BUFFERED_CHUNKS)
        err_send, err_recv = anyio.create_memory_object_stream[bytes](BUFFERED_CHUNKS)
        self._sends: dict[int, MemoryObjectSendStream[bytes]] = {STDOUT: out_send, STDERR: err_send}
        self.stdout, self.stderr = ChunkStream(out_recv), ChunkStream(err_recv)
        self.done = anyio.Event()
        self.error: BaseException | None = None
        self._token = anyio.lowlevel.current_token()
        raw = unwrap_socket(sock)
        if raw is not None:
            raw.settimeout(None)  # a silent command is not a dead daemon; close() unblocks us
        threading.Thread(target=self._run, name="docker-exec-pump", daemon=True).start()

    def _run(self) -> None:
        try:
            for stream_id, data in frames_iter(self.sock, tty=False):  # type: ignore[no-untyped-call]
                self._forward(self._sends.get(stream_id, self._sends[STDERR]), data)
        except (OSError, ValueError) as exc:  # the daemon died or we closed the socket
            self.error = exc
        finally:
            with contextlib.suppress(RuntimeError):  # the event loop is gone
                for send in self._sends.values():
                    anyio.from_thread.run_sync(send.close, token=self._token)
                anyio.from_thread.run_sync(self.done.set, token=self._token)

    def _forward(self, send: MemoryObjectSendStream[bytes], data: bytes) -> None:
        # Blocks while the buffer is full: back-pressure to the daemon, memory stays bounded.
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            anyio.from_thread.run(send.send, data, token=self._token)

    def feed(self, data: bytes) -> None:
        """Write the call's stdin and half-close it, so the command sees end of file."""
        raw = unwrap_socket(self.sock)
        if raw is None:
            raise BackendUnavailable("this Docker connection cannot carry stdin", backend="docker")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            raw.sendall(data)
        with contextlib.suppress(OSError):
            raw.shutdown(socket.SHUT_WR)

    async def stream(self, source: ByteReceiveStream) -> None:
        """Copy a stream to the call's stdin as it arrives (no thread: MSG_DONTWAIT), then half-close."""
        raw = unwrap_socket(self.sock)
        if raw is None:
            raise BackendUnavailable("this Docker connection cannot carry stdin", backend="docker")
        try:
            async for chunk in source:
                view = memoryview(chunk)
                while view:
                    try:
                        view = view[raw.send(view, socket.MSG_DONTWAIT) :]
                    except BlockingIOError:
                        await anyio.wait_writable(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.stdout.close()
        self.stderr.close()
        raw = unwrap_socket(self.sock)
        with contextlib.suppress(OSError):
            if raw is not None:
                raw.shutdown(socket.SHUT_RDWR)
            self.sock.close()
            if raw is not None:
                raw.close()
