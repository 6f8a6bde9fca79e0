"""The warm Docker jail: one container per session, the agent as its PID 1 (``lifecycle = "session"``).

The container runs one process of ours: the agent of :mod:`sandbox._jailside.agent`, as PID 1
and as the command uid, its stdin open. We attach to the container once (before starting it)
and keep that stream for the jail's life (:class:`AgentLink`): requests go to the agent's stdin
as JSON lines, its replies come back as binary frames (the command's stdout and stderr as they
arrive, then its exit status). A call therefore costs no ``docker exec`` (runc sets up each one
in tens of milliseconds), only a fork in the container. The agent starts each command in a
session of its own and, once the command exited or on a kill request (TERM, the grace, KILL),
sends ``kill(-1, SIGKILL)`` until ``/proc`` shows no other process of its uid: the tree kill,
setsid'd, double-forked and TERM-ignoring processes included. Only then does it report the
exit, so nothing of a call survives into the next; calls are serialised for that reason.

Being PID 1 of the pid namespace, the agent gets no signal from inside it that it has no
handler for (SIGKILL included); it is non-dumpable, so the same uid can neither ptrace it nor
open its ``/proc/1/fd`` pipes. Should it die anyway (an OOM kill, ``docker kill``), the stream
ends: the call fails with BACKEND_UNAVAILABLE saying why, and the next call gets a new
container. Our socket closing (the executor died) closes the agent's stdin (StdinOnce), which
ends the container; auto-remove deletes it. Per-call OOM kills are the agent's reading of the
memory cgroup's ``oom_kill`` count before and after the call.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import docker
import docker.errors
from docker.utils.socket import frames_iter

from sandbox._jailside.agent import HEADER as AGENT_HEADER
from sandbox.backends.base import Process
from sandbox.backends.docker.client import quietly, run_sync
from sandbox.backends.docker.jail import DockerJail
from sandbox.backends.docker.runtime import Runtime
from sandbox.backends.docker.streams import BUFFERED_CHUNKS, STDOUT, ChunkStream, unwrap_socket
from sandbox.backends.environment import base_env
from sandbox.errors import BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from anyio.streams.memory import MemoryObjectSendStream

    from sandbox.backends.base import Stdin

STDIN_CHUNK = 1 << 16
STDIN_WINDOW = 1 << 20  # stdin bytes in flight to a warm container's agent
KILL_WAIT_S = 10  # beyond the grace: an agent this late is wedged, and its container is removed
DIAGNOSTICS = 4096  # the tail of the agent's own stderr kept for error messages


async def _in_chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


class AgentLink:
    """A warm container's attach stream: requests to its agent, the agent's frames back.

    One thread reads the multiplexed stream for the jail's life and routes each frame to its
    call's streams; a full stream blocks it (back-pressure through the daemon to the agent,
    which then stops reading the command's pipes). Requests are written from worker threads.
    """

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        raw = unwrap_socket(sock)
        if raw is None:
            raise BackendUnavailable("this Docker connection cannot carry the agent's requests", backend="docker")
        raw.settimeout(None)  # an idle session is not a dead daemon; close() unblocks the reader
        self._raw = raw
        self.calls: dict[int, AgentProcess] = {}
        self.dead = False
        self.retired = False
        self.error: BaseException | None = None
        self.diagnostics = b""
        self._lock = threading.Lock()
        self._ids = iter(range(1, 1 << 31))
        self._token = anyio.lowlevel.current_token()
        threading.Thread(target=self._run, name="docker-agent-link", daemon=True).start()

    def next_id(self) -> int:
        return next(self._ids)

    def send(self, message: dict[str, Any]) -> None:
        """Write one request (blocking: call from a worker thread)."""
        line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            self._raw.sendall(line)

    def _run(self) -> None:
        buffer = bytearray()
        try:
            for stream_id, data in frames_iter(self.sock, tty=False):  # type: ignore[no-untyped-call]
                if stream_id == STDOUT:
                    buffer += data
                    self._parse(buffer)
                else:
                    self.diagnostics = (self.diagnostics + data)[-DIAGNOSTICS:]
        except (OSError, ValueError) as exc:  # the daemon died or we closed the socket
            self.error = exc
        finally:
            self.dead = True
            for proc in self.calls.copy().values():  # copy(): atomic, the loop may forget one meanwhile
                with contextlib.suppress(RuntimeError):  # the event loop is gone
                    anyio.from_thread.run_sync(proc.lost, token=self._token)

    def _parse(self, buffer: bytearray) -> None:
        size = AGENT_HEADER.size
        while len(buffer) >= size:
            kind, cid, length = AGENT_HEADER.unpack_from(buffer)
            if len(buffer) < size + length:
                return
            payload = bytes(buffer[size : size + length])
            del buffer[: size + length]
            proc = self.calls.get(cid)
            if proc is not None:
                proc.frame(kind, payload)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)
            self.sock.close()
            self._raw.close()


class AgentProcess(Process):
    """One call in a warm container, started and swept by the agent (see :mod:`sandbox._jailside.agent`)."""

    def __init__(self, jail: WarmJail, runtime: Runtime, link: AgentLink, stdin: Stdin) -> None:
        self.runtime = runtime
        self._jail = jail
        self._link = link
        self.id = link.next_id()
        self._stdin = stdin
        out_send, out_recv = anyio.create_memory_object_stream[bytes](BUFFERED_CHUNKS)
        err_send, err_recv = anyio.create_memory_object_stream[bytes](BUFFERED_CHUNKS)
        self._sends: dict[bytes, MemoryObjectSendStream[bytes]] = {b"o": out_send, b"e": err_send}
        self._out, self._err = ChunkStream(out_recv), ChunkStream(err_recv)
        self.stdout, self.stderr = self._out, self._err
        self._token = anyio.lowlevel.current_token()
        self._exited = anyio.Event()
        self._result: dict[str, Any] | None = None
        self._refused: str | None = None
        self._lost = False
        self._draining = False  # killing: output nobody may read any more is dropped, not waited on
        self._blocked: anyio.CancelScope | None = None
        self._released = False
        self._unacked = 0  # stdin bytes sent that the agent has not yet passed on (or dropped)
        self._credit = anyio.Event()
        self.returncode: int | None = None
        link.calls[self.id] = self

    @property
    def finished(self) -> bool:
        return self._exited.is_set()

    # -- from the link's reader thread

    def frame(self, kind: bytes, payload: bytes) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is gone
            if kind in self._sends:
                anyio.from_thread.run(self._deliver, self._sends[kind], payload, token=self._token)
            elif kind == b"x":
                anyio.from_thread.run_sync(self._exit, json.loads(payload), token=self._token)
            elif kind == b"i":
                anyio.from_thread.run_sync(self._credited, int(payload), token=self._token)
            elif kind == b"!":
                self._refused = payload.decode(errors="replace")
                anyio.from_thread.run_sync(self._end, token=self._token)

    async def _deliver(self, send: MemoryObjectSendStream[bytes], data: bytes) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.WouldBlock):
            if self._draining:
                send.send_nowait(data)
                return
            with anyio.CancelScope() as scope:
                self._blocked = scope
                try:
                    await send.send(data)  # blocks while the buffer is full: memory stays bounded
                finally:
                    self._blocked = None

    def _exit(self, result: dict[str, Any]) -> None:
        self._result = result
        if result.get("retire"):
            self._link.retired = True  # the call tampered with the agent: the next one gets a new container
        self._end()

    def lost(self) -> None:
        self._lost = True
        self._end()

    def _credited(self, count: int) -> None:
        self._unacked -= count
        self._credit.set()
        self._credit = anyio.Event()

    def _end(self) -> None:
        for send in self._sends.values():
            send.close()
        self._exited.set()
        self._credit.set()

    # -- the Process interface

    async def feed_stdin(self) -> None:
        # At most STDIN_WINDOW bytes ride between us and the command: the agent credits what it
        # passed on, so its buffer stays bounded and a kill request never waits behind stdin.
        source = self._stdin or b""
        chunks = _in_chunks(source) if isinstance(source, bytes) else source
        async for data in chunks:
            for start in range(0, len(data), STDIN_CHUNK):
                while self._unacked >= STDIN_WINDOW and not self.finished:
                    await self._credit.wait()
                if self.finished:
                    return
                piece = data[start : start + STDIN_CHUNK]
                self._unacked += len(piece)
                await self._request({"op": "stdin", "id": self.id, "data": base64.b64encode(piece).decode()})
        await self._request({"op": "eof", "id": self.id})

    async def _request(self, message: dict[str, Any]) -> None:
        if self._link.dead:
            return  # wait() tells what happened
        await run_sync("cannot write to the container's agent", self._link.send, message)

    async def wait(self) -> int:
        await self._exited.wait()
        if self._result is not None:
            code = self._result.get("code")
            if not isinstance(code, int):
                raise BackendUnavailable(
                    "the container's agent reported no exit status", backend="docker", container=self.runtime.id
                )
            self.returncode = code
            return code
        if self._refused is not None:
            raise BackendUnavailable(
                f"the container's agent refused the call: {self._refused}", backend="docker", container=self.runtime.id
            )
        await self._jail.agent_lost(self)
        raise AssertionError("unreachable")  # agent_lost always raises

    async def kill_tree(self, grace: float) -> None:
        if self.finished and not self._lost:
            return
        self._draining = True
        if self._blocked is not None:
            self._blocked.cancel()
        with anyio.CancelScope(shield=True):
            if self._lost or self._link.dead:
                await self._jail.discard(self.runtime)
                return
            await run_sync(
                "cannot ask the container's agent to kill the call",
                self._link.send,
                {"op": "kill", "id": self.id, "grace": grace},
            )
            with anyio.move_on_after(grace + KILL_WAIT_S):
                await self._exited.wait()
            if not self.finished or self._lost:
                # A wedged agent, or one that died meanwhile: the container goes, and its processes.
                await self._jail.discard(self.runtime)

    def running_pids(self) -> list[int]:
        with contextlib.suppress(docker.errors.DockerException, OSError):
            return self.runtime.running()
        return []

    def oom_killed(self) -> bool:
        return bool(self._result and self._result.get("oom"))

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._draining = True
        self._out.close()
        self._err.close()
        if not self.finished and not self._link.dead:
            # Never waited for (a jail closing, a failed caller): have the agent sweep it anyway;
            # the next call waits for that (WarmJail._ready_agent).
            message = {"op": "kill", "id": self.id, "grace": 0}
            threading.Thread(target=quietly, args=(lambda: self._link.send(message),), daemon=True).start()
        self._jail.call_done(self)

    def forget(self) -> None:
        self._link.calls.pop(self.id, None)


class WarmJail(DockerJail):
    """One container for the session's calls, one call at a time, through its agent."""

    agent = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._warm: Runtime | None = None
        self._link: AgentLink | None = None
        self._slot = anyio.Semaphore(1)  # one call at a time in the warm container
        self._held: AgentProcess | None = None
        self._pending: AgentProcess | None = None  # released before its exit was reported

    @property
    def container_id(self) -> str | None:
        return self._warm.id if self._warm else None

    async def start(self) -> None:
        await self._new_agent()

    async def _new_agent(self) -> Runtime:
        runtime, sock = await run_sync(
            "cannot start the jail's container", Runtime.create_attached, self.client, self._config, self.user
        )
        async with contextlib.AsyncExitStack() as cleanup_on_fail:
            cleanup_on_fail.push_async_callback(_remove, runtime)
            await self._way_out(runtime)
            self._link = AgentLink(sock)
            cleanup_on_fail.pop_all()
        self._warm = runtime
        return runtime

    async def _start(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None, stdin: Stdin
    ) -> AgentProcess:
        await self._slot.acquire()
        with contextlib.ExitStack() as cleanup_on_fail:
            cleanup_on_fail.callback(self._slot.release)
            proc = await self._run_in_agent(argv, env, cwd, stdin)
            cleanup_on_fail.pop_all()
        self._held = proc
        return proc

    async def _run_in_agent(
        self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None, stdin: Stdin
    ) -> AgentProcess:
        runtime, link = await self._ready_agent()
        proc = AgentProcess(self, runtime, link, stdin)
        request = {
            "op": "run",
            "id": proc.id,
            "argv": list(argv),
            "env": base_env(self.profile, env, workspace=self.workspace),
            "cwd": cwd or str(self.workspace),
            "stdin": stdin is not None,
        }
        with contextlib.ExitStack() as cleanup_on_fail:
            cleanup_on_fail.callback(proc.forget)
            await run_sync("cannot start the command in the container", link.send, request)
            cleanup_on_fail.pop_all()
        return proc

    async def _ready_agent(self) -> tuple[Runtime, AgentLink]:
        """The warm container with its agent idle; a new one if it died, was removed or is wedged."""
        pending, self._pending = self._pending, None
        if pending is not None and not pending.finished:
            with anyio.move_on_after(KILL_WAIT_S):
                await pending._exited.wait()
            if not pending.finished and self._warm is not None:
                await self.discard(self._warm)
        if pending is not None:
            pending.forget()
        link = self._link
        if self._warm is not None and (self._warm.removed or link is None or link.dead or link.retired):
            await self.discard(self._warm)
        if self._warm is None or self._link is None:
            await self._new_agent()
        assert self._warm is not None and self._link is not None
        return self._warm, self._link

    async def discard(self, runtime: Runtime) -> None:
        """Remove a warm container we can no longer trust to be empty (its processes die with it)."""
        if self._warm is runtime:
            self._warm = None
            if self._link is not None:
                self._link.close()
                self._link = None
        if not runtime.removed:
            await run_sync("cannot remove the container", runtime.remove)

    async def agent_lost(self, proc: AgentProcess) -> None:
        """The agent's stream ended mid-call: say why, structured, and never reuse the container."""
        runtime = proc.runtime
        diagnostics = proc._link.diagnostics.decode(errors="replace").strip()
        death = await run_sync("the Docker daemon stopped answering during the call", runtime.death)
        if death is None:  # the stream broke but the container runs: we cannot drive it any more
            await self.discard(runtime)
            raise BackendUnavailable(
                "lost the connection to the container's agent during the call", backend="docker", container=runtime.id
            )
        runtime.removed = True  # auto-remove takes it away; the next call gets a new one
        await self.discard(runtime)
        seen, code = death
        oom = "oom" in seen
        if seen & {"kill", "stop"} or oom:
            what = "out of memory" if oom else "docker kill or stop"
            message = f"the container {runtime.id[:12]} was killed from outside ({what})"
        else:
            message = f"the container {runtime.id[:12]}'s agent died (exit status {code})"
            if diagnostics:
                message += f": {diagnostics.splitlines()[-1][:200]}"
        raise BackendUnavailable(
            f"{message}; the call's exit status is unknown",
            backend="docker",
            container=runtime.id,
            exit_code=code,
            oom_killed=oom,
        )

    def call_done(self, proc: AgentProcess) -> None:
        if not proc.finished:
            self._pending = proc
        else:
            proc.forget()
        if self._held is proc:
            self._held = None
            self._slot.release()

    def _release_calls(self) -> None:
        if self._held is not None:
            self._held.release()

    def _disconnect(self) -> None:
        if self._link is not None:
            self._link.close()
        self._warm = self._link = None


async def _remove(runtime: Runtime) -> None:
    """Remove a container whose agent we cannot drive; shielded, so a cancelled start leaves none."""
    with anyio.CancelScope(shield=True):
        await run_sync("cannot remove the container", runtime.remove)
