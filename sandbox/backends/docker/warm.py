"""The warm Docker jail: one container per session, the agent as its PID 1 (``lifecycle = "session"``).

The container runs one process of ours: the agent of :mod:`sandbox._jailside.agent`, as PID 1
and as the command uid. We attach to the container once (before starting it) and keep that
stream for the jail's life; on a local engine the agent also connects to a unix socket of ours
bound into the container, and the calls go over that (:mod:`.links` says how, and who may
connect). A call therefore costs no ``docker exec`` (runc sets up each one in tens of
milliseconds), only a fork in the container.

Streams. Over the socket (:class:`PipeProcess`) each call's stdout and stderr are pipes we
create; their write ends (and stdin's read end) go to the agent with ``SCM_RIGHTS``, the
command writes straight into them and we read them as a local child's: no byte of output
crosses the agent or dockerd. Over the attach stream, the fallback (:class:`FramedProcess`),
the agent reads the command's pipes and sends the bytes back in frames through dockerd.

The agent starts each command in a session of its own and, once the command exited or on a
kill request (TERM, the grace, KILL), sends ``kill(-1, SIGKILL)`` until ``/proc`` shows no
other process of its uid: the tree kill, setsid'd, double-forked and TERM-ignoring processes
included. Only then does it report the exit, so nothing of a call survives into the next (and
no writer of our pipes is left: they end); calls are serialised for that reason.

Being PID 1 of the pid namespace, the agent gets no signal from inside it that it has no
handler for (SIGKILL included); it is non-dumpable, so the same uid can neither ptrace it nor
open its ``/proc/1/fd`` pipes and socket. Should it die anyway (an OOM kill, ``docker kill``),
the link ends: the call fails with BACKEND_UNAVAILABLE saying why, and the next call gets a new
container. Our side closing (the executor died) ends the socket and the agent's stdin
(StdinOnce), which ends the container; auto-remove deletes it. Per-call OOM kills are the
agent's reading of the memory cgroup's ``oom_kill`` count before and after the call.

:class:`AgentJail` holds what this jail shares with the per-call one
(:mod:`sandbox.backends.docker.percall`): starting an agent container and linking it, sending a
call to an agent, explaining a lost one. The per-call jail gives each call a container of its
own from a pool and removes it after the call; this one keeps its container for the session.
"""

from __future__ import annotations

import base64
import contextlib
import threading
from abc import abstractmethod
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import docker
import docker.errors

from sandbox.backends.agentlink import AgentReplies, CallPipes, run_request
from sandbox.backends.base import Process
from sandbox.backends.docker import gvisor
from sandbox.backends.docker.client import quietly, run_sync
from sandbox.backends.docker.config import with_agent_socket
from sandbox.backends.docker.jail import DockerJail
from sandbox.backends.docker.links import (
    AGENT_SOCKET,
    HELLO_WAIT_S,
    AttachLink,
    Link,
    Listener,
    PeerRefused,
    SocketLink,
    owner_of,
    socket_wanted,
)
from sandbox.backends.docker.runtime import Runtime
from sandbox.backends.docker.streams import BUFFERED_CHUNKS, ChunkStream
from sandbox.errors import BackendUnavailable, SandboxError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from anyio.streams.memory import MemoryObjectSendStream

    from sandbox.backends.base import Stdin

STDIN_CHUNK = 1 << 16
STDIN_WINDOW = 1 << 20  # stdin bytes in flight to a warm container's agent (attach stream)
KILL_WAIT_S = 10  # beyond the grace: an agent this late is wedged, and its container is removed


async def _in_chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


class AgentCall(AgentReplies, Process):
    """One call in a warm container, started and swept by the agent (see :mod:`sandbox._jailside.agent`).

    What both links share: the exit report, refusals, a lost agent, the kill request. How the
    output comes back is the subclass's: :class:`PipeProcess` or :class:`FramedProcess`.
    """

    def __init__(self, jail: AgentJail, runtime: Runtime, link: Link, stdin: Stdin) -> None:
        self.runtime = runtime
        self._jail = jail
        self._link = link
        self.id = link.next_id()
        self._stdin = stdin
        self._token = anyio.lowlevel.current_token()
        self._exited = anyio.Event()
        self._result: dict[str, Any] | None = None
        self._refused: str | None = None
        self._lost = False
        self._released = False
        self.returncode: int | None = None
        if not link.register(self.id, self):  # the agent died since the link was chosen: wait() says so
            self._lost = True
            self._exited.set()

    @property
    def finished(self) -> bool:
        return self._exited.is_set()

    def remote_fds(self) -> list[int]:
        """The fds that go with the run request (the command's ends of our pipes)."""
        return []

    def handed_over(self) -> None:
        """The run request is sent (or failed): drop our copies of the command's ends."""

    # -- from the link's reader thread (frames routed by AgentReplies)

    def _exit(self, result: dict[str, Any]) -> None:
        self._result = result
        if result.get("retire"):
            self._link.retired = True  # the call tampered with the agent: the next one gets a new container
        self._end()

    def lost(self) -> None:
        self._lost = True
        self._end()

    def _end(self) -> None:
        self._exited.set()

    # -- the Process interface

    backend = "docker"
    agent = "the container's agent"

    async def wait(self) -> int:
        await self._exited.wait()
        where = {"backend": self.backend, "container" if self.backend == "docker" else "vm": self.runtime.id}
        if self._result is not None:
            code = self._result.get("code")
            if not isinstance(code, int):
                raise BackendUnavailable(f"{self.agent} reported no exit status", **where)
            self.returncode = code
            return code
        if self._refused is not None:
            raise BackendUnavailable(f"{self.agent} refused the call: {self._refused}", **where)
        await self._jail.agent_lost(self)
        raise AssertionError("unreachable")  # agent_lost always raises

    def _stop_output(self) -> None:
        """Killing: output nobody may read any more must not hold the agent back."""

    async def kill_tree(self, grace: float) -> None:
        if self.finished and not self._lost:
            return
        self._stop_output()
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

    @abstractmethod
    def _close_streams(self) -> None:
        """Release what carries the call's output (the call is over, or abandoned)."""

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._stop_output()
        self._close_streams()
        if not self.finished and not self._link.dead:
            # Never waited for (a jail closing, a failed caller): have the agent sweep it anyway;
            # the next call waits for that (WarmJail._ready_agent; a per-call container just goes).
            message = {"op": "kill", "id": self.id, "grace": 0}
            threading.Thread(target=quietly, args=(lambda: self._link.send(message),), daemon=True).start()
        self._jail.call_done(self)

    def forget(self) -> None:
        self._link.calls.pop(self.id, None)


class PipeProcess(AgentCall):
    """A call over the socket: the command writes into our pipes, which we read like a local child's."""

    def __init__(self, jail: AgentJail, runtime: Runtime, link: Link, stdin: Stdin) -> None:
        self._pipes = CallPipes(stdin)
        super().__init__(jail, runtime, link, stdin)  # registered with the link only once it exists
        self.stdout, self.stderr = self._pipes.stdout, self._pipes.stderr

    def remote_fds(self) -> list[int]:
        return self._pipes.theirs

    def handed_over(self) -> None:
        self._pipes.handed_over()

    async def feed_stdin(self) -> None:
        await self._pipes.feed_stdin()

    def _close_streams(self) -> None:
        self._pipes.close()


class FramedProcess(AgentCall):
    """A call over the attach stream: its output comes back in the agent's frames."""

    def __init__(self, jail: AgentJail, runtime: Runtime, link: Link, stdin: Stdin) -> None:
        super().__init__(jail, runtime, link, stdin)
        out_send, out_recv = anyio.create_memory_object_stream[bytes](BUFFERED_CHUNKS)
        err_send, err_recv = anyio.create_memory_object_stream[bytes](BUFFERED_CHUNKS)
        self._sends: dict[bytes, MemoryObjectSendStream[bytes]] = {b"o": out_send, b"e": err_send}
        self._out, self._err = ChunkStream(out_recv), ChunkStream(err_recv)
        self.stdout, self.stderr = self._out, self._err
        self._draining = False  # killing: output nobody may read any more is dropped, not waited on
        self._blocked: anyio.CancelScope | None = None
        self._unacked = 0  # stdin bytes sent that the agent has not yet passed on (or dropped)
        self._credit = anyio.Event()

    def _output(self, kind: bytes, payload: bytes) -> None:
        if kind in self._sends:
            anyio.from_thread.run(self._deliver, self._sends[kind], payload, token=self._token)
        elif kind == b"i":
            anyio.from_thread.run_sync(self._credited, int(payload), token=self._token)

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

    def _credited(self, count: int) -> None:
        self._unacked -= count
        self._credit.set()
        self._credit = anyio.Event()

    def _end(self) -> None:
        for send in self._sends.values():
            send.close()
        super()._end()
        self._credit.set()

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

    def _stop_output(self) -> None:
        self._draining = True
        if self._blocked is not None:
            self._blocked.cancel()

    def _close_streams(self) -> None:
        # A call abandoned before its exit came (a jail closing under it) never reaches _end():
        # its send ends must close here too, or they are left for the collector (ResourceWarning).
        for send in self._sends.values():
            send.close()
        self._out.close()
        self._err.close()


class AgentJail(DockerJail):
    """What the agent's jails share: starting a container whose only process is the agent, a call
    through it, and a lost agent explained. :class:`WarmJail` keeps one such container for the
    session; :class:`~sandbox.backends.docker.percall.PerCallJail` takes a fresh one per call."""

    agent = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._no_socket: str | None = socket_wanted(str(self.client.api.base_url)) or gvisor.socket_refusal(
            self.oci_runtime
        )
        self.stream_note = self._no_socket or ""  # why the calls use the attach stream, if they do

    async def _launch(self) -> tuple[Runtime, Link]:
        """A new container with its agent started, linked and idle (the socket where we can)."""
        listener = None
        if self._no_socket is None:
            try:
                listener = await anyio.to_thread.run_sync(Listener, owner_of(self.user))  # 0700, the agent's
            except OSError as exc:  # a file system without sockets, a full disk: attach will do
                self.stream_note = f"cannot listen for the agent: {exc.strerror or exc}"
            except SandboxError as exc:  # no data directory
                self.stream_note = f"cannot listen for the agent: {exc.message}"
        try:
            return await self._start_agent(listener)
        except PeerRefused as exc:
            self._no_socket = self.stream_note = str(exc)
            return await self._start_agent(None)
        finally:
            if listener is not None:
                listener.close()

    async def _start_agent(self, listener: Listener | None) -> tuple[Runtime, Link]:
        config = self._config
        if listener is not None:
            config = with_agent_socket(config, listener.folder, AGENT_SOCKET)
        try:
            runtime, sock = await run_sync(
                "cannot start the jail's container", Runtime.create_attached, self.client, config, self.user
            )
        except BackendUnavailable as exc:
            if listener is None:
                raise
            # An engine that cannot bind our directory (a VM's, one that only shares some paths):
            # the attach stream needs no bind.
            self._no_socket = self.stream_note = f"the engine cannot bind the agent's socket: {exc.message}"
            listener.close()
            listener = None
            runtime, sock = await run_sync(
                "cannot start the jail's container", Runtime.create_attached, self.client, self._config, self.user
            )
        async with contextlib.AsyncExitStack() as cleanup_on_fail:
            cleanup_on_fail.push_async_callback(_remove, runtime)
            await self._way_out(runtime)
            attach = AttachLink(sock)
            cleanup_on_fail.callback(attach.close)
            link: Link = attach
            if listener is not None:
                link = await self._connect(runtime, attach, listener)
            cleanup_on_fail.pop_all()
        return runtime, link

    async def _connect(self, runtime: Runtime, attach: AttachLink, listener: Listener) -> Link:
        """The agent's word on the socket, then its connection, checked (see :mod:`.links`)."""
        seen = await anyio.to_thread.run_sync(attach.hello_seen.wait, HELLO_WAIT_S, abandon_on_cancel=True)
        if not seen or attach.hello is None:
            diagnostics = attach.diagnostics.decode(errors="replace").strip()
            why = f": {diagnostics.splitlines()[-1][:200]}" if diagnostics else ""
            raise BackendUnavailable(
                f"the container's agent did not start{why}",
                backend="docker",
                container=runtime.id,
            )
        if attach.hello != "socket":
            self.stream_note = attach.hello.removeprefix("attach: ")
            return attach
        pid = await run_sync("cannot find the container's process", runtime.pid)
        # gVisor: the gofer connects for the sandbox, a sibling of the Sentry (State.Pid) under the shim.
        conn = listener.accept(pid, siblings=self.oci_runtime is not None and self.oci_runtime.gvisor)
        self.stream_note = ""
        return SocketLink(conn, attach)

    async def _send_run(
        self,
        runtime: Runtime,
        link: Link,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: Stdin,
        runner: bool,
    ) -> AgentCall:
        """One ``run`` request to the agent on ``link``, with the call's pipe ends where it can take them."""
        # Over the attach stream (no fds) the runner is started as a program; over the socket it is
        # the agent's own, and a small request is served by the agent itself.
        sockets = isinstance(link, SocketLink)
        request, inline = run_request(
            self.profile, self.workspace, argv, env, cwd, stdin, runner=runner and sockets, inline=sockets
        )
        kind = PipeProcess if sockets else FramedProcess
        proc = kind(self, runtime, link, None if inline else stdin)
        request["id"] = proc.id
        fds = proc.remote_fds()
        if fds:
            request["fds"] = len(fds)
        with contextlib.ExitStack() as cleanup_on_fail:
            cleanup_on_fail.callback(proc.forget)
            cleanup_on_fail.callback(proc._close_streams)
            try:
                await run_sync("cannot start the command in the container", link.send, request, fds)
            finally:
                proc.handed_over()
            cleanup_on_fail.pop_all()
        return proc

    @abstractmethod
    async def discard(self, runtime: Runtime) -> None:
        """Remove a container we can no longer trust to be empty (its processes die with it)."""

    @abstractmethod
    def call_done(self, proc: AgentCall) -> None:
        """The call is over for its caller (released): free its slot, or its container."""

    async def agent_lost(self, proc: AgentCall) -> None:
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
        if self.oci_runtime is not None and self.oci_runtime.gvisor:
            message += f" ({gvisor.ENDS_SANDBOX})"
        raise BackendUnavailable(
            f"{message}; the call's exit status is unknown",
            backend="docker",
            container=runtime.id,
            exit_code=code,
            oom_killed=oom,
        )


class SerialCalls:
    """A warm agent's calls, one at a time: the slot, the call holding it, and one released before
    its exit came (the next call first gives it :data:`KILL_WAIT_S` to be swept, :func:`settled`)."""

    def __init__(self) -> None:
        self._slot = anyio.Semaphore(1)
        self._held: AgentCall | None = None
        self._pending: AgentCall | None = None

    def call_done(self, proc: AgentCall) -> None:
        if not proc.finished:
            self._pending = proc
        else:
            proc.forget()
        if self._held is proc:
            self._held = None
            self._slot.release()


class WarmJail(SerialCalls, AgentJail):
    """One container for the session's calls, one call at a time, through its agent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        AgentJail.__init__(self, *args, **kwargs)
        SerialCalls.__init__(self)
        self._warm: Runtime | None = None
        self._link: Link | None = None

    @property
    def container_id(self) -> str | None:
        return self._warm.id if self._warm else None

    @property
    def stream(self) -> str | None:
        """How the current agent's calls travel: ``socket`` (pipes passed to it) or ``attach``."""
        return self._link.stream if self._link is not None else None

    async def start(self) -> None:
        await self._new_agent()

    async def _new_agent(self) -> Runtime:
        self._warm, self._link = await self._launch()
        return self._warm

    async def _start(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None, stdin: Stdin, runner: bool = False
    ) -> AgentCall:
        await self._slot.acquire()
        with contextlib.ExitStack() as cleanup_on_fail:
            cleanup_on_fail.callback(self._slot.release)
            proc = await self._run_in_agent(argv, env, cwd, stdin, runner)
            cleanup_on_fail.pop_all()
        self._held = proc
        return proc

    async def _run_in_agent(
        self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None, stdin: Stdin, runner: bool
    ) -> AgentCall:
        runtime, link = await self._ready_agent()
        return await self._send_run(runtime, link, argv, env, cwd, stdin, runner)

    async def _ready_agent(self) -> tuple[Runtime, Link]:
        """The warm container with its agent idle; a new one if it died, was removed or is wedged."""
        pending, self._pending = self._pending, None
        if await settled(pending) is False and self._warm is not None:
            await self.discard(self._warm)
        link = self._link
        # A secret appeared (or went) since the container was sealed: its config is rebuilt and the
        # container replaced by one sealed anew.
        resealed = await self._resealed()
        if self._warm is not None and (resealed or self._warm.removed or link is None or link.dead or link.retired):
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

    def _release_calls(self) -> None:
        if self._held is not None:
            self._held.release()

    def _disconnect(self) -> None:
        if self._link is not None:
            self._link.close()
        self._warm = self._link = None


async def settled(pending: AgentCall | None) -> bool | None:
    """A call released before its exit came, given :data:`KILL_WAIT_S` to be swept by its agent:
    ``False`` when it was not (a wedged agent: its jail must go), ``None`` when there was none.
    Forgotten by its link either way."""
    if pending is None:
        return None
    if not pending.finished:
        with anyio.move_on_after(KILL_WAIT_S):
            await pending._exited.wait()
    pending.forget()
    return pending.finished


async def _remove(runtime: Runtime) -> None:
    """Remove a container whose agent we cannot drive; shielded, so a cancelled start leaves none."""
    with anyio.CancelScope(shield=True):
        await run_sync("cannot remove the container", runtime.remove)
