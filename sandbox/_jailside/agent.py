"""The agent inside a warm jail (Docker, bubblewrap): PID 1, starts commands on request, over a unix socket.

Stdlib only: its source is sent as the container's command (``python3 -I -S -c <source> <cpu>
<socket> [<seccomp>]``), so the image needs nothing of ours. ``<seccomp>``, on a local engine, is
the bubblewrap jail's filter (:mod:`sandbox.backends.seccomp`, base64 BPF): the agent loads it
first, on top of Docker's default profile, so commands get the same extra denials under both.
It runs as PID 1 of the container and as the command uid:

* PID 1 of a pid namespace gets no signal from inside the namespace that it has no handler for,
  SIGKILL and SIGSTOP included (the kernel marks it unkillable), so a command cannot kill or
  stop it; only SIGCHLD has a handler, and an extra SIGCHLD just wakes the loop.
* It makes itself non-dumpable first, so processes of its own uid cannot ptrace it or open its
  ``/proc/1/{mem,fd,environ}`` (that needs CAP_SYS_PTRACE, and every capability is dropped).
* ``kill(-1, sig)`` sent by it reaches every process of its uid in the container except itself
  (and PID 1 is itself): that is the tree kill, for setsid'd and double-forked processes alike.
  Orphans are reparented to it, so it reaps them and they cannot pile up as zombies.

Two channels, one protocol. **Socket** (a local engine): ``<socket>`` names a unix socket the
executor listens on, in a host directory bound read-only into the container; the agent connects
to it before anything else runs, says ``s`` ``socket`` on stdout, and from then on reads its
requests from that socket and writes its replies to it. Each ``run`` request arrives with the
call's pipe ends as ``SCM_RIGHTS``: stdout's and stderr's write ends (and stdin's read end when
the call has stdin), which the command gets as its fds 1, 2 (and 0) and the agent closes at
once: the command writes straight into the executor's pipes, no byte of output passes through
here or through dockerd. **Attach** (the fallback: a remote engine, a socket that cannot be
reached, ``<socket>`` empty): the agent says ``s`` ``attach: <why>`` (when a socket was named)
and the requests come on stdin, the command's output goes back on stdout in frames.

Requests are JSON lines: ``{"op": "run", "id", "argv", "env", "cwd", "stdin", "fds"}``,
``{"op": "stdin", "id", "data": <base64>}``, ``{"op": "eof", "id"}`` (attach only),
``{"op": "kill", "id", "grace"}``. Replies are binary frames (``HEADER`` then the payload):
``o``/``e`` carry the command's stdout/stderr as it arrives (attach only); ``i`` (a decimal
count) credits stdin bytes passed on to the command, or dropped because it stopped reading, so
the executor keeps only a window of stdin in flight and this buffer stays bounded (attach only);
``x`` (JSON ``{"code", "oom"}``) comes once the command exited *and* nothing of the uid is left;
``!`` is a refused request. One call at a time; end of stdin or of the socket (the executor
detached or died) kills everything and ends the container.

**Inherited socket** (bubblewrap: ``<socket>`` is ``fd:N``): one end of a socketpair the executor
made before starting ``bwrap --as-pid-1``, so there is no path to connect to nor any peer to
check. The agent says ``s`` ``socket`` on the socket itself (its stdin is not watched). A ``run``
request with ``"hold": true`` carries one more fd, the last: a socket on which the command,
forked but not yet exec'd, writes one byte (the executor has ``SO_PASSCRED`` set, so the kernel
tells it the command's pid as the host sees it) and then waits for ``1``: meanwhile the
executor moves it into the call's cgroup and sets its rlimits, as ``bwrap --block-fd`` holds a
fresh jail's init. Anything but ``1`` (the executor refused, or died) and the command never runs.

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
``"hold"`` command is (the executor learns its pid from the kernel, moves it into the next
call's cgroup, sets its rlimits, writes ``1``), then it touches what becoming a call writes to
(so that the fork's copies of those pages are made now) and waits on two sockets: its hold
socket and a socketpair of ours. A command comes on the hold socket, from the executor itself:
the request line with the call's pipe ends, and then ``{"op": "run", "id", "spare": "direct"}``
(no fds) tells us which call the spare became, so that starting it costs no hop through here;
if the command ended before that message came, :meth:`Agent.reap` kept its exit code for it. A
``run`` with ``"spare": true`` (and no hold fd: a file tool's request we declined) reaches it on
our socketpair. Either way it takes its session, its stdio, directory and environment and execs
(or runs the runner). The fork and the hold happen while the jail is idle, not while a call
waits. At most one spare exists, only while no call runs (it *is* the next call), so the sweep
after a call never meets it.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import gc
import importlib
import json
import os
import resource
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any, NoReturn

HEADER = struct.Struct(">cII")  # kind, call id, payload length
READ_SIZE = 1 << 16
OUT_LIMIT = 1 << 20  # stop reading the command's pipes while this much waits for the executor
TICK_S = 0.02
CONNECT_S = 5.0
MAX_FDS = 4  # stdout, stderr, stdin, the hold socket (bubblewrap)
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_NO_NEW_PRIVS = 22, 2, 38
OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
RLIMITS = tuple(getattr(resource, name) for name in sorted(dir(resource)) if name.startswith("RLIMIT_"))


def inherited() -> tuple[object, ...]:
    """What commands inherit from the agent that a process of its uid may change on it anyway.

    prlimit(2), setpriority(2) and sched_setaffinity(2) ask only for a matching uid, not for
    ptrace access, so being non-dumpable does not protect these.
    """
    limits = tuple(resource.getrlimit(r) for r in RLIMITS)
    return limits, os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0))


def oom_kills() -> int:
    """The container's memory cgroup oom_kill count (v2 or v1 file, whichever is shown)."""
    for path in OOM_FILES:
        with contextlib.suppress(OSError), open(path, encoding="ascii") as fh:
            for line in fh:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    return 0


def others(me: int, uid: int) -> bool:
    """Whether a live (not zombie) process of ``uid`` other than ``me`` is in the container."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/stat", "rb") as fh:
            state = fh.read().rpartition(b")")[2].split()[0]
            if state in (b"Z", b"X"):
                continue
            if owner(entry) == uid:
                return True
    return False


def owner(pid: str) -> int:
    with open(f"/proc/{pid}/status", "rb") as fh:
        for line in fh:
            if line.startswith(b"Uid:"):
                return int(line.split()[1])
    return -1


class Forked:
    """What :class:`Call` reads of a ``Popen``, for a child that runs code of ours without exec."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stdin: Any = None
        self.returncode: int | None = None


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


class Agent:
    def __init__(self, cpu: int | None, sock: socket.socket | None = None, *, watch_stdin: bool = True) -> None:
        self.cpu = cpu
        self.sock = sock  # the executor's socket, or None: requests on stdin, replies on stdout
        self.out_fd = sock.fileno() if sock is not None else 1
        self.fds: list[int] = []  # pipe ends received with requests, oldest first
        self.me = os.getpid()
        self.uid = os.getuid()
        self.sel = selectors.DefaultSelector()
        self.inbuf = b""
        self.out = bytearray()
        self.call: Call | None = None
        self.spare: tuple[int, socket.socket] | None = None  # the next call's process, forked and held
        self.spare_oom = 0  # the oom count when the spare was forked: its call's baseline
        self.spare_ended: tuple[int, int] | None = None  # (pid, exit code) of a spare that ended, maybe as its call
        self.pipes: dict[int, bytes] = {}  # fd -> kind (o/e)
        self.writing = False
        self.retiring = False
        self.fingerprint = inherited()
        wake_r, wake_w = os.pipe()
        for fd in (0, 1, wake_r, wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.wake = wake_r
        # stdin: the requests in attach mode; in socket mode only its end matters (we are detached).
        if watch_stdin:
            self.sel.register(0, selectors.EVENT_READ, "in")
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")
        if sock is not None:
            sock.setblocking(False)
            self.sel.register(sock.fileno(), selectors.EVENT_READ, "sock")

    # -- output to the executor

    def emit(self, kind: bytes, cid: int, payload: bytes) -> None:
        self.out += HEADER.pack(kind, cid, len(payload))
        self.out += payload

    def flush(self) -> None:
        while self.out:
            try:
                sent = os.write(self.out_fd, self.out)
            except BlockingIOError:
                break
            except OSError:  # the executor is gone
                self.shutdown()
            del self.out[:sent]
        want = bool(self.out)
        if want != self.writing:
            if self.sock is not None:  # one fd, read and written: change its events
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
                self.sel.modify(self.out_fd, events, "sock")
            elif want:
                self.sel.register(1, selectors.EVENT_WRITE, "out")
            else:
                self.sel.unregister(1)
            self.writing = want

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

    def received(self, msg: dict[str, Any]) -> list[int]:
        """The fds that came with this request (socket mode), oldest first."""
        count = int(msg.get("fds", 0)) if self.sock is not None else 0
        fds, self.fds = self.fds[:count], self.fds[count:]
        return fds

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
                self.wait_for_call(theirs.fileno(), fds[0])  # never returns
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
                preexec_fn=self.limit if held is None else lambda: self.held(held),
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

    def wait_for_call(self, link_fd: int, hold: int) -> NoReturn:
        """In the forked spare: be held and placed, then wait for the call and become it.

        The call comes from the executor itself on the hold socket (a command: the agent only
        learns of it, see :meth:`handed_directly`, so that starting it costs no hop through the
        agent), or from the agent on our link (a file tool's request the agent declined).
        """
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in map(int, os.listdir("/proc/self/fd")):  # the agent's link, selector, wake pipe...
                if fd > 2 and fd not in (link_fd, hold):
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self.held(hold)
            self.rehearse()
            ends = [socket.socket(fileno=link_fd), socket.socket(fileno=hold)]
            ready, _, _ = select.select(ends, [], [])
            # The executor's call first: it is written whole before the agent hears of it and closes
            # our link, so that a link that ended meanwhile is no reason to give up.
            source = ends[1] if ends[1] in ready else ends[0]
            source.setblocking(True)
            data, fds, _flags, _addr = socket.recv_fds(source, READ_SIZE, MAX_FDS)
            while data and not data.endswith(b"\n") and (chunk := source.recv(READ_SIZE)):
                data += chunk  # one line, the end of which needs no wait for the sender to finish
            if not data:
                os._exit(0)  # discarded: the executor gave us up, or the agent or its jail is going away
            for end in ends:
                end.close()
            msg = json.loads(data)
            with contextlib.suppress(OSError):
                os.makedirs(str(msg["env"].get("HOME", "/tmp/home")), exist_ok=True)
            stdin = bool(msg.get("stdin"))
            self.become(msg, fds, stdin)
            if msg.get("py") == "runner":
                os.chdir(msg["cwd"])
                code = self.runner()
            else:
                self.exec(msg)
        except BaseException:  # whatever it is, it goes to the call's stderr (or the agent's)
            import traceback

            with contextlib.suppress(BaseException):
                traceback.print_exc()
        os._exit(code)

    @staticmethod
    def rehearse() -> None:
        """In the spare, while idle: write once to what becoming the call writes to.

        A fork shares the agent's pages until it writes to one, then copies it (a page fault
        each): made now, those copies cost the call nothing (about half a millisecond of a
        ``true`` here)."""
        msg = json.loads(json.dumps({"argv": ["true"], "env": dict(os.environ), "cwd": "/", "stdin": False}))
        env = {str(k): str(v) for k, v in msg["env"].items()}
        os.environ.clear()
        os.environ.update(env)
        os.get_exec_path(env)
        resource.getrlimit(resource.RLIMIT_NOFILE)

    def become(self, msg: dict[str, Any], fds: list[int], stdin: bool) -> None:
        """In a forked child: the call's session and stdio (its pipes), nothing else of ours."""
        os.setsid()
        os.dup2(fds[2] if stdin else os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (0, 1, 2):
            os.set_blocking(fd, True)
        os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in msg["env"].items()})

    def exec(self, msg: dict[str, Any]) -> NoReturn:
        """Exec the call's argv as ``subprocess.Popen`` would, or say why not as the agent does."""
        argv = [str(a) for a in msg["argv"]]
        for sig in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):  # Popen's restore_signals
            if hasattr(signal, sig):
                signal.signal(getattr(signal, sig), signal.SIG_DFL)
        try:
            os.chdir(msg["cwd"])
            os.execvpe(argv[0], argv, dict(os.environ))
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.write(2, f"sandbox: cannot run {argv[0]}: {exc.strerror or exc}\n".encode())
            os._exit(127 if isinstance(exc, FileNotFoundError) else 126)

    def runner(self) -> int:
        """Run the file tools' runner on our stdio (the call's pipes); its exit code."""
        code = 0
        try:
            sys.stdin, sys.stdout, sys.stderr = (open(0), open(1, "w"), open(2, "w"))  # noqa: SIM115
            # Defined in sys.modules by the agent's program (sandbox._jailside.program): no package to import.
            importlib.import_module("sandbox._jailside.runner").main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            import traceback

            code = 1
            with contextlib.suppress(BaseException):
                traceback.print_exc()
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        return code

    def fork_runner(self, cid: int, msg: dict[str, Any], fds: list[int], held: int | None, stdin: bool) -> None:
        try:
            pid = os.fork()
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.write(fds[1], f"sandbox: cannot fork the file tool: {exc.strerror or exc}\n".encode())
            self.emit(b"x", cid, json.dumps({"code": 126, "oom": False}).encode())
            return
        if pid == 0:
            self.run_runner(msg, fds, held, stdin)  # never returns
        self.call = Call(cid, Forked(pid))

    def run_runner(self, msg: dict[str, Any], fds: list[int], held: int | None, stdin: bool) -> NoReturn:
        """In the forked child: become the call's process, then run the runner on its pipes."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            if held is not None:
                self.held(held)
            self.become(msg, fds, stdin)
            os.chdir(msg["cwd"])
            code = self.runner()
        except BaseException:  # whatever it is, it goes to the call's stderr
            import traceback

            with contextlib.suppress(BaseException):
                traceback.print_exc()
        os._exit(code)

    def held(self, fd: int) -> None:
        """In the forked command, before exec: be seen by the executor, wait until it placed us."""
        self.limit()
        os.set_blocking(fd, True)
        os.write(fd, b"p")  # the kernel attaches our pid as the executor sees it (SO_PASSCRED)
        if os.read(fd, 1) != b"1":
            raise RuntimeError("the executor did not release the command")  # Popen: SubprocessError

    def limit(self) -> None:
        # CPU seconds count per process: the agent lives for the session, so only commands get it.
        if self.cpu is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (self.cpu, self.cpu))

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

    def shutdown(self) -> NoReturn:
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        sys.exit(0)

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

    def read_requests(self) -> None:
        try:
            data = os.read(0, READ_SIZE)
        except BlockingIOError:
            return
        if not data:
            self.shutdown()
        if self.sock is None:
            self.take(data)

    def read_socket(self) -> None:
        assert self.sock is not None
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, READ_SIZE, MAX_FDS)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        # The kernel ends a read at a message that carries fds: they come with its first byte,
        # so they are here before the request line they belong to is complete.
        self.fds += fds
        if not data:
            self.shutdown()
        self.take(data)

    def take(self, data: bytes) -> None:
        self.inbuf += data
        *lines, self.inbuf = self.inbuf.split(b"\n")
        for line in lines:
            if line.strip():
                self.request(line)

    def run(self) -> None:
        # What exists now is the agent's for good: out of the collector's sight, so that neither
        # it nor a forked spare's collection writes to those objects (each write copies a page).
        gc.freeze()
        while True:
            self.step()


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]  # struct sock_fprog


def confine_syscalls(encoded: str) -> None:
    """The executor's seccomp filter (base64 BPF), stacked on the engine's own profile before
    anything else runs: it binds this agent and every command it starts. Fails closed."""
    program = base64.b64decode(encoded)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _Fprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    for what, args in (
        ("PR_SET_NO_NEW_PRIVS", (PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)),
        ("PR_SET_SECCOMP", (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)),
    ):
        if libc.prctl(*args) != 0:
            sys.stderr.write(f"sandbox agent: prctl({what}) failed: errno {ctypes.get_errno()}\n")
            sys.exit(71)


def nondumpable() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.stderr.write(f"sandbox agent: prctl(PR_SET_DUMPABLE) failed: errno {ctypes.get_errno()}\n")
        sys.exit(70)


def connect(path: str) -> tuple[socket.socket | None, str]:
    """The executor's socket, connected before any command runs; else why not (attach mode)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_S)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        return None, f"attach: cannot connect to {path}: {exc.strerror or exc}"
    return sock, "socket"


def say(kind: bytes, payload: bytes) -> None:
    """One frame on stdout, blocking (before the loop: the executor reads the attach stream)."""
    data = HEADER.pack(kind, 0, len(payload)) + payload
    while data:
        data = data[os.write(1, data) :]


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
