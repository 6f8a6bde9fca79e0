"""The agent inside a warm jail (Docker, bubblewrap): PID 1, starts commands on request, over a unix socket.

Stdlib only: its source is sent as the container's command (``python3 -I -S -c <source> <cpu>
<socket> [<seccomp>]``), so the image needs nothing of ours. ``<seccomp>``, on a local engine, is
the bubblewrap jail's filter (:mod:`sandbox.backends.seccomp`, base64 BPF): the agent loads it
first, on top of Docker's default profile, so commands get the same extra denials under both.
It runs as PID 1 of the container and as the command uid:

* PID 1 of a pid namespace gets no signal from inside the namespace that it has no handler for,
  SIGKILL and SIGSTOP included (the kernel marks it unkillable), so a command cannot kill or
  stop it; only SIGCHLD has a handler, and an extra SIGCHLD just wakes the loop.
* It makes itself non-dumpable first (:mod:`sandbox._jailside.hardening`), so processes of its
  own uid cannot ptrace it or open its ``/proc/1/{mem,fd,environ}`` (that needs CAP_SYS_PTRACE,
  and every capability is dropped).
* ``kill(-1, sig)`` sent by it reaches every process of its uid in the container except itself
  (and PID 1 is itself): that is the tree kill, for setsid'd and double-forked processes alike.
  Orphans are reparented to it, so it reaps them and they cannot pile up as zombies.

Two channels, one protocol (:mod:`sandbox._jailside.channel`): a unix socket (the executor's,
connected to; or, bubblewrap, a socketpair's end inherited as ``fd:N``), on which each ``run``
request brings the call's pipe ends as ``SCM_RIGHTS`` and the command writes straight into the
executor's pipes; or, the fallback, **attach**: requests on stdin, the command's output relayed
on stdout in frames.

Requests are JSON lines: ``{"op": "run", "id", "argv", "env", "cwd", "stdin", "fds"}``,
``{"op": "stdin", "id", "data": <base64>}``, ``{"op": "eof", "id"}`` (attach only),
``{"op": "kill", "id", "grace"}``. Replies are binary frames (``HEADER`` then the payload):
``o``/``e`` carry the command's stdout/stderr as it arrives (attach only); ``i`` (a decimal
count) credits stdin bytes passed on to the command, or dropped because it stopped reading, so
the executor keeps only a window of stdin in flight and this buffer stays bounded (attach only);
``x`` (JSON ``{"code", "oom"}``) comes once the command exited *and* nothing of the uid is left;
``!`` is a refused request. One call at a time; end of stdin or of the socket (the executor
detached or died) kills everything and ends the container.

**Held** (bubblewrap, socket only): a ``run`` request with ``"hold": true`` carries one more fd,
the last: a socket on which the command, forked but not yet exec'd, tells the executor its pid
and waits while the executor moves it into the call's cgroup and sets its rlimits, as ``bwrap
--block-fd`` holds a fresh jail's init (:func:`~sandbox._jailside.forked.be_placed`).

**The file tools** (``"py": "runner"`` instead of an ``argv``; the agent's program carries
:mod:`sandbox._jailside.runner`, socket mode only). With ``"inline": <request>`` (the runner's
JSON request in the message, no stdin pipe) the agent serves a Read, Write, Edit, LS or restore in
its own process: :func:`~sandbox._jailside.runner.serve_inline` resolves the path again in the
jail's view, writes the reply into the call's stdout pipe and the agent reports ``x`` with
``"inline": true``; no process is forked, so a bubblewrap spare stays the next call. What must not
run in the agent it declines: Glob and Grep (they walk trees), a file past 1 MiB or a directory
past 4000 names (the agent is outside the call's cgroup: its memory is nobody's limit), and paths
under ``/proc``, ``/sys`` and ``/dev`` (``/proc/self`` would be the agent). Declined, or sent
without ``"inline"``, the request runs as a command would: in a fork of the agent (the spare, or a
fork held and placed like one) that runs the runner's ``main()`` on the call's pipes, in a session
of its own, killed and swept like a command, with a memfd holding the request as its stdin when
the request came inline. No Python starts and nothing is compiled per call either way.

**A spare** (bubblewrap): ``{"op": "spare", "id", "fds": 1}`` with a hold socket, sent while no
call runs, forks the next call's process ahead of its call: it is held and placed exactly as a
``"hold"`` command is, then waits for its call (:func:`~sandbox._jailside.forked.wait_for_call`).
A command comes to it from the executor itself, and then ``{"op": "run", "id", "spare": "direct"}``
(no fds) tells us which call the spare became, so that starting it costs no hop through here;
if the command ended before that message came, :meth:`Agent.reap` kept its exit code for it. A
``run`` with ``"spare": true`` (and no hold fd: a file tool's request we declined) reaches it on
our socketpair. The fork and the hold happen while the jail is idle, not while a call waits. At
most one spare exists, only while no call runs (it *is* the next call), so the sweep after a call
never meets it.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import time

from sandbox._jailside.census import inherited, oom_kills, others
from sandbox._jailside.channel import READ_SIZE, Channel, connect, say
from sandbox._jailside.forked import Forked, be_placed, limit, run_runner, wait_for_call
from sandbox._jailside.hardening import confine_syscalls, nondumpable

TYPE_CHECKING = False  # typing's import costs each jail's start about 3 ms: annotations need none
if TYPE_CHECKING:
    import subprocess
    from typing import Any

OUT_LIMIT = 1 << 20  # stop reading the command's pipes while this much waits for the executor
TICK_S = 0.02


class Call:
    def __init__(self, cid: int, proc: subprocess.Popen[bytes] | Forked, oom_before: int | None = None) -> None:
        self.id = cid
        self.proc = proc
        self.status: int | None = None
        self.kill_at: float | None = None
        self.swept = False
        self.stdin = bytearray()
        self.stdin_eof = False
        self.oom_before = oom_kills() if oom_before is None else oom_before


class Agent(Channel):
    def __init__(self, cpu: int | None, sock: socket.socket | None = None, *, watch_stdin: bool = True) -> None:
        super().__init__(sock, watch_stdin=watch_stdin)
        self.cpu = cpu
        self.me = os.getpid()
        self.uid = os.getuid()
        self.call: Call | None = None
        self.spare: tuple[int, socket.socket] | None = None  # the next call's process, forked and held
        self.spare_oom = 0  # the oom count when the spare was forked: its call's baseline
        self.spare_ended: tuple[int, int] | None = None  # (pid, exit code) of a spare that ended, maybe as its call
        self.pipes: dict[int, bytes] = {}  # fd -> kind (o/e)
        self.retiring = False
        self.fingerprint = inherited()

    # -- requests

    def request(self, line: bytes) -> None:
        msg = json.loads(line)
        op, cid = msg.get("op"), int(msg.get("id", 0))
        call = self.call if self.call is not None and self.call.id == cid else None
        if op == "run":
            self.start(cid, msg)
        elif op == "spare":
            self.prepare(cid, msg)
        elif call is None:
            return  # a late message for a call that is over
        elif op == "stdin":
            data = base64.b64decode(msg["data"])
            if call.proc.stdin is None or call.proc.stdin.closed:
                self.credit(call, len(data))  # nowhere to go any more: the sender may go on
            else:
                call.stdin += data
                self.want_stdin(call)
        elif op == "eof":
            call.stdin_eof = True
            self.want_stdin(call)
        elif op == "kill" and call.kill_at is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGTERM)
            call.kill_at = time.monotonic() + max(0.0, float(msg.get("grace", 0)))

    def start(self, cid: int, msg: dict[str, Any]) -> None:
        fds = self.received(msg)
        try:
            self.spawn(cid, msg, fds)
        finally:
            for fd in fds:  # the command has its copies: ours would hold its pipes open
                os.close(fd)

    def prepare(self, cid: int, msg: dict[str, Any]) -> None:
        """Fork the next call's process now: held and placed while nothing runs (see the module doc)."""
        fds = self.received(msg)
        try:
            if self.spare is not None or self.call is not None or self.retiring or len(fds) != 1:
                self.emit(b"!", cid, b"no spare now: one is waiting, a call runs, or this jail is retiring")
                return
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                pid = os.fork()
            except OSError as exc:
                ours.close()
                theirs.close()
                self.emit(b"!", cid, f"cannot fork a spare: {exc.strerror or exc}".encode())
                return
            if pid == 0:
                gc.disable()  # a collection would write to every object: copies of the agent's pages
                wait_for_call(theirs.fileno(), fds[0], self.cpu)  # never returns
            theirs.close()
            self.spare, self.spare_ended, self.spare_oom = (pid, ours), None, oom_kills()
        finally:
            for fd in fds:
                os.close(fd)

    def spawn(self, cid: int, msg: dict[str, Any], fds: list[int]) -> None:
        if self.call is not None or self.retiring:
            self.emit(b"!", cid, b"busy: a call is still running, or this container is retiring")
            return
        if msg.get("spare") == "direct" and not fds:
            self.handed_directly(cid)
            return
        stdin = bool(msg.get("stdin"))
        hold = bool(msg.get("hold"))
        if self.sock is not None and len(fds) != 2 + stdin + hold:
            self.emit(b"!", cid, f"expected {2 + stdin + hold} pipe ends with the request, got {len(fds)}".encode())
            return
        if hold and self.sock is None:
            self.emit(b"!", cid, b"a held start needs the socket link")
            return
        held = fds[-1] if hold else None
        if msg.get("inline") is not None:
            if self.serve_inline(cid, msg, fds):
                return
            stdin = True  # declined: the request, in a memfd, is the forked runner's stdin
        if msg.get("spare") and not hold:
            self.hand_to_spare(cid, msg, fds)
            return
        if msg.get("py") == "runner" and fds:
            self.fork_runner(cid, msg, fds, held, stdin)
            return
        import subprocess  # only here (a call no spare took): its import is a tenth of the agent's start

        env = {str(k): str(v) for k, v in msg["env"].items()}
        with contextlib.suppress(OSError):
            os.makedirs(env.get("HOME", "/tmp/home"), exist_ok=True)
        out: int = subprocess.PIPE
        err: int = subprocess.PIPE
        inp: int = subprocess.PIPE if stdin else subprocess.DEVNULL
        if fds:  # socket mode: the executor's own pipes
            out, err, inp = fds[0], fds[1], fds[2] if stdin else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(
                [str(a) for a in msg["argv"]],
                env=env,
                cwd=msg["cwd"],
                start_new_session=True,
                stdin=inp,
                stdout=out,
                stderr=err,
                preexec_fn=(lambda: limit(self.cpu)) if held is None else lambda: be_placed(held, self.cpu),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            text = f"sandbox: cannot run {msg['argv'][0]}: {why}\n".encode()
            if fds:
                with contextlib.suppress(OSError):
                    os.write(fds[1], text)  # a few bytes into the empty stderr pipe: no wait
            else:
                self.emit(b"e", cid, text)
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            self.emit(b"x", cid, json.dumps({"code": code, "oom": False}).encode())
            return
        self.call = Call(cid, proc)
        if fds:
            return  # the executor reads the pipes itself
        for stream, kind in ((proc.stdout, b"o"), (proc.stderr, b"e")):
            assert stream is not None
            fd = stream.fileno()
            os.set_blocking(fd, False)
            self.pipes[fd] = kind
            self.sel.register(fd, selectors.EVENT_READ, "pipe")
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)

    def serve_inline(self, cid: int, msg: dict[str, Any], fds: list[int]) -> bool:
        """A file tool's request served in this process (see the module doc); ``False``: the spare runs it.

        The request came in the message, not on a stdin pipe: if the runner declines it here, a
        memfd holding it becomes the spare's stdin (``fds`` grows by it; our caller closes them all).
        """
        if msg.get("py") != "runner" or msg.get("stdin") or len(fds) != 2 + bool(msg.get("hold")):
            self.emit(b"!", cid, b"an inline request is the runner's, with no stdin pipe")
            return True
        text = str(msg["inline"])
        try:
            reply = importlib.import_module("sandbox._jailside.runner").serve_inline(json.loads(text))
        except Exception:  # whatever it is, the forked runner meets it again and reports it
            reply = None
        if reply is None:
            try:
                stdin = os.memfd_create("sandbox-request")
            except OSError as exc:  # out of fds or memory: refuse the call, the agent lives on
                self.emit(b"!", cid, f"cannot hand the request on: {exc.strerror or exc}".encode())
                return True
            fds.insert(2, stdin)  # after stdout and stderr, before a hold socket; our caller closes it
            os.write(stdin, text.encode())
            os.lseek(stdin, 0, os.SEEK_SET)
            msg["stdin"] = True
            return False
        data = memoryview(json.dumps(reply).encode())
        with contextlib.suppress(OSError):  # the executor stopped reading: the reply has nowhere to go
            os.set_blocking(fds[0], True)
            while data:
                data = data[os.write(fds[0], data) :]
        self.emit(b"x", cid, json.dumps({"code": 0, "oom": False, "inline": True}).encode())
        return True

    def handed_directly(self, cid: int) -> None:
        """The executor gave the spare its call itself, on the hold socket: the spare is call ``cid`` now.

        The spare may have run its command and ended before this message came: :meth:`reap` kept
        its exit code, which is then the call's (a spare killed before it read its call ends the
        same way, which is what the call gets to see).
        """
        spare, ended, self.spare, self.spare_ended = self.spare, self.spare_ended, None, None
        if spare is not None:
            spare[1].close()
            self.call = Call(cid, Forked(spare[0]), self.spare_oom)
        elif ended is not None:
            self.call = Call(cid, Forked(ended[0]), self.spare_oom)
            self.call.status = ended[1]
        else:
            self.emit(b"!", cid, b"no spare is waiting for this call")

    def hand_to_spare(self, cid: int, msg: dict[str, Any], fds: list[int]) -> None:
        """The call's request and pipe ends to the waiting spare, which becomes the call."""
        spare, self.spare = self.spare, None
        if spare is None or not fds:
            self.emit(b"!", cid, b"no spare is waiting for this call")
            return
        pid, link = spare
        data = json.dumps({k: msg.get(k) for k in ("argv", "env", "cwd", "stdin", "py")}).encode() + b"\n"
        try:
            link.setblocking(True)
            sent = socket.send_fds(link, [data], fds)
            if sent < len(data):  # (sendall sends even nothing: to a spare that read its line and let go, EPIPE)
                link.sendall(data[sent:])
        except OSError as exc:  # it died before its call: nothing ran
            self.emit(b"!", cid, f"the spare is gone: {exc.strerror or exc}".encode())
            return
        finally:
            link.close()
        self.call = Call(cid, Forked(pid))

    def fork_runner(self, cid: int, msg: dict[str, Any], fds: list[int], held: int | None, stdin: bool) -> None:
        try:
            pid = os.fork()
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.write(fds[1], f"sandbox: cannot fork the file tool: {exc.strerror or exc}\n".encode())
            self.emit(b"x", cid, json.dumps({"code": 126, "oom": False}).encode())
            return
        if pid == 0:
            run_runner(msg, fds, held, stdin, self.cpu)  # never returns
        self.call = Call(cid, Forked(pid))

    # -- the command's stdin and output

    def want_stdin(self, call: Call) -> None:
        pipe = call.proc.stdin
        if pipe is None or pipe.closed:
            return
        with contextlib.suppress(KeyError):
            self.sel.unregister(pipe.fileno())
        if call.stdin:
            self.sel.register(pipe.fileno(), selectors.EVENT_WRITE, "stdin")
        elif call.stdin_eof:
            pipe.close()

    def write_stdin(self, call: Call) -> None:
        pipe = call.proc.stdin
        assert pipe is not None
        try:
            sent = os.write(pipe.fileno(), call.stdin[:READ_SIZE])
            del call.stdin[:sent]
        except BlockingIOError:
            return
        except OSError:  # the command closed its stdin: the rest has nowhere to go
            sent = len(call.stdin)
            call.stdin.clear()
            call.stdin_eof = True
        self.credit(call, sent)
        self.want_stdin(call)

    def credit(self, call: Call, count: int) -> None:
        if count:
            self.emit(b"i", call.id, str(count).encode())

    def read_pipe(self, fd: int) -> None:
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return
        if data and self.call is not None:
            self.emit(self.pipes[fd], self.call.id, data)
            return
        self.sel.unregister(fd)
        del self.pipes[fd]
        os.close(fd)

    def pause_pipes(self, paused: bool) -> None:
        """Back-pressure: leave the pipes unread while the executor has not taken our output."""
        registered = self.sel.get_map()
        for fd in self.pipes:
            if paused and fd in registered:
                self.sel.unregister(fd)
            elif not paused and fd not in registered:
                self.sel.register(fd, selectors.EVENT_READ, "pipe")

    # -- processes

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            call = self.call
            if call is not None and pid == call.proc.pid:
                call.status = os.waitstatus_to_exitcode(status)
                call.proc.returncode = call.status
            elif self.spare is not None and pid == self.spare[0]:  # before its call, or given its call directly
                self.spare[1].close()
                self.spare, self.spare_ended = None, (pid, os.waitstatus_to_exitcode(status))

    def sweep(self) -> None:
        """SIGKILL every process of our uid until /proc shows none (fork races the first kill).

        Why a tree kill of its own here: the agent is PID 1 of the container, so ``kill(-1)``
        from it reaches every process of the uid but itself, with no ``docker exec`` (tens of
        milliseconds) per call, and it must hold the exit report until nothing is left, which
        only the process that reaps the orphans can tell. The host-side kills are
        ``sandbox.backends.confine.Tree`` (bwrap, host) and the per-call jail's sh sweep.
        """
        while True:
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)
            self.reap()
            if not others(self.me, self.uid):
                return
            time.sleep(0.001)

    def advance(self) -> None:
        call = self.call
        if call is None:
            return
        due = call.kill_at is not None and (time.monotonic() >= call.kill_at or not others(self.me, self.uid))
        if call.status is None and due:
            self.sweep()
        if call.status is not None and not call.swept:
            self.sweep()  # the call is over: nothing it started may outlive it
            call.swept = True
            if call.proc.stdin is not None and not call.proc.stdin.closed:
                with contextlib.suppress(KeyError):
                    self.sel.unregister(call.proc.stdin.fileno())
                call.proc.stdin.close()
        if call.swept and not self.pipes:
            oom = oom_kills() > call.oom_before
            # A call that changed what the next ones would inherit from us: this container is
            # spoilt, the executor starts another one and we end this one once the reply is out.
            self.retiring = inherited() != self.fingerprint
            reply = {"code": call.status, "oom": oom, "retire": self.retiring}
            self.emit(b"x", call.id, json.dumps(reply).encode())
            self.call = None

    # -- the loop

    def step(self) -> None:
        busy = self.call is not None and self.call.kill_at is not None and self.call.status is None
        for key, _ in self.sel.select(TICK_S if busy else None):
            what = key.data
            if what == "in":
                self.read_requests()
            elif what == "sock":
                self.read_socket()
            elif what == "wake":
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake, 4096)
            elif what == "pipe":
                self.read_pipe(key.fd)
            elif what == "stdin" and self.call is not None:
                self.write_stdin(self.call)
        self.reap()
        self.advance()
        self.flush()
        if self.retiring and not self.out:
            self.shutdown()
        self.pause_pipes(len(self.out) >= OUT_LIMIT)

    def run(self) -> None:
        # What exists now is the agent's for good: out of the collector's sight, so that neither
        # it nor a forked spare's collection writes to those objects (each write copies a page).
        gc.freeze()
        while True:
            self.step()


def main() -> None:
    # Python's own SIGINT handler would let a command interrupt PID 1; without one it is ignored.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    nondumpable()
    if len(sys.argv) > 3 and sys.argv[3]:
        confine_syscalls(sys.argv[3])
    cpu = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else None
    path = sys.argv[2] if len(sys.argv) > 2 else ""
    sock = None
    if path.startswith("fd:"):  # a socketpair's end, inherited (bubblewrap)
        sock = socket.socket(fileno=int(path[3:]))
        os.set_inheritable(sock.fileno(), False)
        agent = Agent(cpu, sock, watch_stdin=False)
        agent.emit(b"s", 0, b"socket")
        agent.flush()
        agent.run()
    if path:
        sock, mode = connect(path)
        say(b"s", mode.encode())
    Agent(cpu, sock).run()


if __name__ == "__main__":
    main()
