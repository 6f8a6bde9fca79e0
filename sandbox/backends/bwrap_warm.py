"""The warm bubblewrap jail: one ``bwrap`` per session, the agent as its PID 1 (``[bwrap] lifecycle = "session"``).

The jail is built once, with the same arguments as a per-call jail (mounts, masks, seccomp
filter, namespaces, ``--die-with-parent``), and ``--as-pid-1`` so that its command, the agent of
:mod:`sandbox._jailside.agent` (``<python> -I -S -c <source> "" fd:N``, ``<python>`` the host's
verified interpreter by its absolute path, :mod:`sandbox.backends.jailpython`), is the pid namespace's
init: the kernel gives it no signal from inside the namespace it has no handler for, and it is
non-dumpable, so a command (same uid) can neither kill, stop nor ptrace it, nor open its
``/proc/1/fd``. The host talks to it over a socketpair whose other end it inherited: no path in
any file system, no peer to check. A call is a request on that socket with the call's pipe ends
as ``SCM_RIGHTS`` (:class:`~sandbox.backends.agentlink.FdLink`, the same code as Docker's
socket link): the command writes straight into our pipes, and costs a fork in the jail, not a
namespace set-up.

**Cgroup placement (the kernel's tree kill).** Each run request carries one more fd, a socket
whose other end has ``SO_PASSCRED``: the agent forks the command, which writes one byte there
before it execs and waits. The kernel stamps that byte with the writer's pid *as our namespace
sees it*, so we learn the command's host pid without trusting the agent's word; we move it into
the call's cgroup and set its rlimits (:func:`~sandbox.backends.confine.confine`, as for a fresh
jail's held init) and only then write ``1``: nothing of the call runs outside its cgroup (the
hold socket: :mod:`sandbox.backends.bwrap_spare`).

**A spare, forked and placed while the jail is idle** (:mod:`sandbox.backends.bwrap_spare`).
When the jail starts and whenever a call is over, our placer thread (one per jail, so that a
call's end waits for none of this) asks the agent for a *spare*: it forks the next call's
process at once, which writes its byte on a hold socket as above and waits; the thread reads the
byte, moves the process into the next call's cgroup, sets its rlimits and writes ``1``, and the
spare then waits for its request. The next call writes that request, with its pipe ends,
straight to the spare on the same hold socket and then tells the agent which call the spare
became: the fork, the cgroup attach and a hop through the agent are all off its path, and the
agent still reaps the command, sweeps and reports. The attach matters most: on cgroup v1 moving
a task takes the kernel's threadgroup lock, whose first writer after an idle spell waits for an
RCU grace period (about 10 ms here), which is exactly what an agent's calls, spaced by the
model's thinking, would otherwise pay each time. Nothing of the spare runs before it is placed,
and it runs nothing but the next call's command.

**File tools served by the agent.** A Read, Write, Edit or LS whose request is small rides in the
run message (``"inline"``, :func:`~sandbox.backends.agentlink.run_request`) and the agent serves it in
its own process, in the jail's view, the path resolved again there: no fork, no hold, no cgroup,
and the spare stays the next call. The request still names the spare, so that what the agent
declines (see :mod:`sandbox._jailside.agent`: Glob and Grep, files past 1 MiB, paths under
``/proc``) runs in it as a command would, placed in its cgroup. The agent is outside the call's
cgroup, which is why it declines whatever could make it big; an operation stuck in the agent
(a hung network file system) is a call that does not answer: the timeout replaces the jail.

**Kill.** The agent sweeps each call (TERM, grace, ``kill(-1, SIGKILL)`` until ``/proc`` shows
nothing but itself) and reports the exit only then. When it does not answer in time, or died, we
kill by cgroup (``cgroup.kill`` / freeze and kill) and then the whole jail (killing PID 1 kills
its pid namespace, :mod:`sandbox.backends.bwrap_agent`); the next call gets a new jail. Without
a cgroup (an ordinary user without delegation) the kernel-side fallback is the pid namespace:
the call's processes die with the jail, which is replaced whenever the agent fails to sweep.

**A seal that moves.** Before each call the jail's seal is searched again (cached: a ``stat`` per
directory when nothing moved, :class:`~sandbox.backends.seal.Watch`); when a secret appeared since
the jail was built (created on the host, or written by an earlier call), the jail is replaced by
one sealed anew before the call runs.

**What a warm jail gives up.** One jail for the session: ``/tmp``, the jail's home and (for
``copy``/``overlay``) the private tree keep what earlier calls wrote; the environment of each
call is built afresh from the profile, but nothing stops a call from leaving files that a later
one reads. Processes never survive their call. Jail-wide limits: the per-call cgroup holds each
call's memory/pids/cpu; the agent itself (one Python process) sits in the executor's cgroup.
``tmp_size`` bounds ``/tmp`` for the whole session, not per call.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from sandbox import _jailside
from sandbox.backends import bwrap_start, cgroups, confine
from sandbox.backends.agentlink import AGENT_MODULES, AGENT_PROGRAM, AgentReplies, CallPipes, FdLink, run_request
from sandbox.backends.base import Process
from sandbox.backends.bwrap_agent import Agent
from sandbox.backends.bwrap_jail import BwrapJail, kill_bwrap, read_init_pid
from sandbox.backends.bwrap_spare import HOLD_WAIT_S, Placer, Spare, held_pid, hold_pair
from sandbox.backends.child import Child
from sandbox.backends.environment import base_env
from sandbox.errors import BackendUnavailable
from sandbox.threads import off_loop

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sandbox.backends.base import Stdin

KILL_WAIT_S = 5.0  # beyond the grace: an agent this late is wedged, and its jail is killed


class WarmBwrapJail(BwrapJail):
    """One bwrap for the session's calls, one call at a time, through its agent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._agent: Agent | None = None
        self._slot = anyio.Semaphore(1)
        self._held: WarmCall | None = None
        self._spare: Spare | None = None
        self._placer = Placer()

    async def start(self) -> None:
        self._agent = await self._new_agent()
        self._ask_spare()

    def _ask_spare(self) -> None:
        """Have the next call's process forked and placed now, by our placer thread (see the module doc)."""
        agent = self._agent
        if agent is None or self._spare is not None or not agent.usable:
            return
        spare = self._spare = Spare(agent)
        self._placer.submit(lambda: spare.make(self._pool, self.profile))

    async def _take_spare(self, agent: Agent) -> Spare | None:
        """The spare, placed, if it belongs to ``agent``; else ``None`` (and it is given up)."""
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        if not spare.placed.is_set():  # asked for a moment ago: let it finish rather than fork again
            try:
                await anyio.to_thread.run_sync(spare.placed.wait, HOLD_WAIT_S, abandon_on_cancel=True)
            except BaseException:  # cancelled meanwhile: nobody else holds it now
                with anyio.CancelScope(shield=True):
                    await self._give_up(spare)
                raise
        if spare.agent is agent and spare.pid is not None and confine.alive(spare.pid):
            return spare  # (it could still die before the agent hands it the call: that call fails, structured)
        await self._give_up(spare)
        return None

    async def _give_up(self, spare: Spare) -> None:
        spare.abandon()  # a spare still waiting reads the end and exits
        if not spare.placed.is_set():
            await anyio.to_thread.run_sync(spare.placed.wait, HOLD_WAIT_S, abandon_on_cancel=True)
        spare.close()
        if spare.group is not None:
            self._pool.give_back(spare.group)

    async def _new_agent(self) -> Agent:
        host_end, jail_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            return await self._start_agent(host_end, jail_end)
        except BaseException:
            host_end.close()  # the link's, once it exists: closing it twice is harmless
            raise

    async def _start_agent(self, host_end: socket.socket, jail_end: socket.socket) -> Agent:
        with contextlib.ExitStack() as theirs:
            theirs.callback(jail_end.close)
            code = _jailside.code_fd(*AGENT_MODULES)  # its bytecode: no compiling at each start
            theirs.callback(os.close, code)
            with self._start_fds(block=False) as fds:
                cmd = self._agent_command(fds, jail_end.fileno(), code)
                with confine.starting("cannot start bwrap"):
                    proc = Child(cmd, pass_fds=(*fds.theirs, jail_end.fileno(), code))
                fds.handed_over()
                theirs.close()
                async with contextlib.AsyncExitStack() as cleanup_on_fail:
                    cleanup_on_fail.push_async_callback(kill_bwrap, proc)
                    init_pid = await read_init_pid(fds.info_r, proc)
                    if self.egress is not None and self.egress.transparent:
                        with anyio.CancelScope(shield=True):
                            await off_loop(self.egress.attach, init_pid)
                    link = FdLink(host_end, "bwrap-agent")
                    agent = Agent(proc, init_pid, link)
                    cleanup_on_fail.push_async_callback(agent.kill)
                    seen = await anyio.to_thread.run_sync(
                        link.hello.wait, bwrap_start.START_TIMEOUT_S, abandon_on_cancel=True
                    )
                    if not seen or link.dead:
                        raise BackendUnavailable(
                            f"the jail's agent did not start ({await agent.diagnostics()})", backend="bwrap"
                        )
                    cleanup_on_fail.pop_all()
        return agent

    def _agent_command(self, fds: bwrap_start.StartFds, sock_fd: int, code_fd: int) -> list[str]:
        # The agent's own PATH is the system's: each call brings its own environment (the
        # workspace's tool directories first, for the user's commands), never the agent.
        env = base_env(self.profile, None, workspace=None)
        program = [
            self.python,  # by its verified absolute path: the PATH above starts with the workspace's
            "-I",
            "-S",
            "-c",
            AGENT_PROGRAM,
            f"{_jailside.CODE_ARG}{code_fd}",
            "",  # no CPU limit for the agent: the host sets each command's rlimits
            f"fd:{sock_fd}",
        ]
        return bwrap_start.command(self._prefix, fds, program, chdir="/", env=env, as_pid_1=True)

    async def _ready_agent(self) -> Agent:
        agent = self._agent
        # A secret appeared (or went) since the jail was sealed: its arguments are rebuilt and the
        # jail replaced by one sealed anew (its spare goes with it: it belongs to the old agent).
        resealed = await self._resealed()
        if agent is not None and (resealed or not agent.usable):
            self._agent = None
            await agent.kill()
            agent = None
        if agent is None:
            agent = self._agent = await self._new_agent()
        return agent

    async def _start(  # type: ignore[override]  # a call through the agent, not a LocalProcess of bwrap's
        self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None, stdin: Stdin, runner: bool = False
    ) -> WarmCall:
        await self._slot.acquire()
        with contextlib.ExitStack() as cleanup_on_fail:
            cleanup_on_fail.callback(self._slot.release)
            agent = await self._ready_agent()
            spare = await self._take_spare(agent)
            group = spare.group if spare is not None else self._pool.take()
            if group is not None:
                cleanup_on_fail.callback(self._pool.give_back, group)
            # A file tool: served by the agent itself when small, the spare kept for the next call;
            # else by a fork of the agent (the spare), as a command is. Inline needs the spare to decline to.
            request, inline = run_request(
                self.profile, self.workspace, argv, env, cwd, stdin, runner=runner, inline=spare is not None
            )
            call = WarmCall(self, agent, group, None if inline else stdin, spare)
            cleanup_on_fail.callback(call.abandon)
            request["id"] = call.id
            fds = call.remote_fds()
            request["fds"] = len(fds)
            try:
                if spare is not None and not inline:
                    # The spare takes its call from us, on its hold socket; the agent only learns of it
                    # (afterwards: a command that ends first is reported all the same).
                    await call.hand_to_spare(request, fds)
                    agent.link.send({"op": "run", "id": call.id, "spare": "direct"})
                else:
                    request["spare" if spare is not None else "hold"] = True
                    agent.link.send(request, fds)  # a small line on an idle socket: it does not block
            except OSError as exc:
                agent.doomed = True
                raise BackendUnavailable(
                    f"cannot reach the jail's agent: {exc.strerror or exc}", backend="bwrap"
                ) from exc
            finally:
                call.handed_over()
            if call.pid is None:
                await call.place()
            cleanup_on_fail.pop_all()
        self._held = call
        return call

    async def agent_lost(self, call: WarmCall) -> None:
        """The agent's socket ended mid-call: say why, structured; the next call gets a new jail."""
        agent = call.agent
        agent.doomed = True
        why = await agent.diagnostics()
        if self._agent is agent:
            self._agent = None
        await agent.kill()
        raise BackendUnavailable(
            f"the jail's agent died during the call ({why}); the call's exit status is unknown, "
            "and the next call gets a new jail",
            backend="bwrap",
        )

    def call_done(self, call: WarmCall) -> None:
        if call.inline and call.spare is not None:  # untouched: it is still the next call
            if self._spare is None and self._held is call:
                self._spare, call.cgroup = call.spare, None
            else:  # not wanted: it reads the end of its hold socket and exits (or dies with its cgroup)
                call.spare.close()
        if call.cgroup is not None:
            self._pool.give_back(call.cgroup)
            call.cgroup = None
        if self._held is call:
            self._held = None
            if call.finished and self._agent is call.agent:
                self._ask_spare()
            self._slot.release()

    async def _shutdown(self) -> None:
        held = self._held
        if held is not None:
            await held.kill_tree(0)
            held.release()
        agent, self._agent = self._agent, None  # no spare is asked for from here on
        self._placer.stop()  # (its thread ends once the spare in the making is made)
        spare, self._spare = self._spare, None
        if spare is not None:
            await self._give_up(spare)
        if agent is not None:
            await agent.kill()
        await self._pool.aclose()


class WarmCall(AgentReplies, Process):
    """One call in the warm jail: our pipes, its cgroup, the agent's exit report."""

    def __init__(
        self,
        jail: WarmBwrapJail,
        agent: Agent,
        cgroup: cgroups.CallCgroup | None,
        stdin: Stdin,
        spare: Spare | None = None,
    ) -> None:
        self.jail = jail
        self.agent = agent
        self.cgroup = cgroup
        self.pid: int | None = None  # the command's host pid, once placed (a spare's: already)
        self._pipes = CallPipes(stdin)
        self.stdout, self.stderr = self._pipes.stdout, self._pipes.stderr
        self._hold_theirs: socket.socket | None = None
        self.spare = spare  # kept when the agent serves the call itself
        if spare is None:
            self._hold, self._hold_theirs = hold_pair()
        else:
            assert spare.hold is not None  # a placed spare has its hold socket
            self._hold, self.pid = spare.hold, spare.pid
        self._token = anyio.lowlevel.current_token()
        self._exited = anyio.Event()
        self._result: dict[str, Any] | None = None
        self._refused: str | None = None
        self._lost = False
        self._unanswered = False  # we killed it all ourselves: the agent did not answer a kill
        self._released = False
        self.returncode: int | None = None
        self.id = agent.link.next_id()
        if not agent.link.register(self.id, self):
            self._lost = True
            self._exited.set()

    @property
    def finished(self) -> bool:
        return self._exited.is_set()

    @property
    def inline(self) -> bool:
        """The agent served this call in its own process: the spare (and its cgroup) never ran it."""
        return bool(self._result and self._result.get("inline"))

    def remote_fds(self) -> list[int]:
        return [*self._pipes.theirs, *([self._hold_theirs.fileno()] if self._hold_theirs is not None else [])]

    async def hand_to_spare(self, request: dict[str, Any], fds: list[int]) -> None:
        """The request and the call's pipe ends to the waiting spare itself, which becomes the call."""
        data = memoryview(FdLink.line(request))  # one line: the spare reads up to its end
        try:
            data = data[socket.send_fds(self._hold, [data], fds) :]  # an idle, empty socket: it takes them
            if data:  # a long argv: the spare reads as we write
                with anyio.fail_after(HOLD_WAIT_S):
                    while data:
                        await anyio.wait_writable(self._hold)
                        with contextlib.suppress(BlockingIOError):
                            data = data[self._hold.send(data) :]
        except (OSError, TimeoutError) as exc:  # it died since we looked, or it does not read
            self.agent.doomed = True
            why = f"did not take its call within {HOLD_WAIT_S:g} s" if isinstance(exc, TimeoutError) else "is gone"
            raise BackendUnavailable(f"the jail's spare {why}: nothing of the call ran", backend="bwrap") from exc

    def handed_over(self) -> None:
        self._pipes.handed_over()
        if self._hold_theirs is not None:
            self._hold_theirs.close()

    async def place(self) -> None:
        """Learn the command's host pid from the kernel, confine it, release it; or learn why it did not start."""
        try:
            with anyio.fail_after(HOLD_WAIT_S):
                pid = await self._held_pid()
        except TimeoutError as exc:
            self.agent.doomed = True
            raise BackendUnavailable(
                f"the jail's agent did not start the command within {HOLD_WAIT_S:g} s", backend="bwrap"
            ) from exc
        if pid is None:  # refused, failed to fork, or the agent died: wait() tells which
            return
        self.pid = pid
        try:
            confine.confine(pid, self.jail.profile, self.cgroup, "bwrap")
        except BaseException:
            self.agent.doomed = True  # a command held in a jail we could not confine: the jail goes
            raise
        self._hold.send(b"1")

    async def _held_pid(self) -> int | None:
        while True:
            await anyio.wait_readable(self._hold)
            try:
                return held_pid(self._hold)
            except BlockingIOError:
                continue

    # -- from the link's reader thread (frames routed by AgentReplies)

    def _exit(self, result: dict[str, Any]) -> None:
        self._result = result
        if result.get("retire"):
            self.agent.link.retired = True  # the call tampered with the agent: the next one gets a new jail
        self._exited.set()

    def _end(self) -> None:
        self._exited.set()

    def lost(self) -> None:
        self._lost = True
        self._exited.set()

    # -- the Process interface

    async def feed_stdin(self) -> None:
        await self._pipes.feed_stdin()

    async def wait(self) -> int:
        await self._exited.wait()
        if self._result is not None:
            code = self._result.get("code")
            if not isinstance(code, int):
                raise BackendUnavailable("the jail's agent reported no exit status", backend="bwrap")
            self.returncode = code
            return code
        if self._refused is not None:
            self.agent.doomed = True
            raise BackendUnavailable(f"the jail's agent refused the call: {self._refused}", backend="bwrap")
        if self._unanswered:
            raise BackendUnavailable(
                "the jail's agent did not answer the kill request: the call's processes were killed with its "
                "cgroup and the jail; its exit status is unknown, and the next call gets a new jail",
                backend="bwrap",
            )
        await self.jail.agent_lost(self)
        raise AssertionError("unreachable")  # agent_lost always raises

    async def kill_tree(self, grace: float) -> None:
        if self.finished and not self._lost:
            return
        with anyio.CancelScope(shield=True):
            if not self._lost and not self.agent.link.dead:
                with contextlib.suppress(OSError):
                    self.agent.link.send({"op": "kill", "id": self.id, "grace": grace})
                with anyio.move_on_after(grace + KILL_WAIT_S):
                    await self._exited.wait()
            if not self.finished or self._lost:
                await self._kill_without_agent()

    async def _kill_without_agent(self) -> None:
        """The agent did not answer (or died): the kernel's kills, by cgroup, then the whole jail."""
        self.agent.doomed = True
        if self.cgroup is not None:
            give_up = anyio.current_time() + confine.KILL_WAIT_S
            while self.cgroup.pids() and anyio.current_time() < give_up:
                self.cgroup.kill()
                await anyio.sleep(0.002)
        if self.jail._agent is self.agent:
            self.jail._agent = None
        await self.agent.kill()
        self._lost = self._unanswered = True
        self._exited.set()

    def running_pids(self) -> list[int]:
        if self.cgroup is not None:
            return sorted(p for p in self.cgroup.pids() if confine.alive(p))
        if not self.agent.tree.root_alive():
            return []
        import psutil

        with contextlib.suppress(psutil.Error):
            return sorted(c.pid for c in psutil.Process(self.agent.tree.root_pid).children(recursive=True))
        return []

    def oom_killed(self) -> bool:
        if self.cgroup is not None and not self.inline and self.cgroup.oom_killed():
            return True
        return bool(self._result and self._result.get("oom"))

    def peak_memory(self) -> int | None:
        return self.cgroup.peak_memory() if self.cgroup is not None and not self.inline else None

    def abandon(self) -> None:
        """A start that failed half-way: nothing of it may run, and the jail is not trusted again."""
        if not self.finished:
            self.agent.doomed = True
        self._close()
        self.agent.link.calls.pop(self.id, None)

    def _close(self) -> None:
        self._pipes.close()
        if not (self.spare is not None and self.inline):  # a spare left untouched waits on its hold socket
            self._hold.close()
        if self._hold_theirs is not None:
            self._hold_theirs.close()

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._close()
        if not self.finished:
            # Never waited for: the next call would find the agent busy; a new jail is cheaper than waiting.
            self.agent.doomed = True
            threading.Thread(target=self._kill_later, daemon=True).start()
        self.agent.link.calls.pop(self.id, None)
        self.jail.call_done(self)

    def _kill_later(self) -> None:
        with contextlib.suppress(OSError):
            self.agent.link.send({"op": "kill", "id": self.id, "grace": 0})
