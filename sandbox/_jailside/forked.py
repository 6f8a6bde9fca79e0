"""The agent's forked children, from the fork to the call: held, placed, then become the call.

Apart from :mod:`sandbox._jailside.agent` because none of it runs in the agent: each function
here runs in a child it forked -- a command before its exec, a spare waiting for its call, a file
tool's runner run without an exec -- which has left the agent's loop behind for good and ends in
an exec or in ``os._exit``, never back in the agent's code.

A held child (:func:`be_placed`) writes one byte on its hold socket, whose other end has
``SO_PASSCRED`` (the kernel tells the executor its pid as the host sees it), and waits for ``1``:
meanwhile the executor moves it into the call's cgroup and sets its rlimits. Anything but ``1``
(the executor refused, or died) and the call never runs.

A spare (:func:`wait_for_call`), once placed, touches what becoming a call writes to (so that
the fork's copies of those pages are made now) and waits on two sockets: its hold socket and its
link to the agent. A command comes on the hold socket, from the executor itself: the request
line with the call's pipe ends. A file tool's request the agent declined comes on the link.
Either way the child takes its session, its stdio, directory and environment (:func:`become`)
and execs (:func:`exec_argv`) or runs the runner (:func:`runner_main`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import resource
import select
import signal
import socket
import sys

from sandbox._jailside.channel import MAX_FDS, READ_SIZE

TYPE_CHECKING = False  # typing's import costs each jail's start about 3 ms: annotations need none
if TYPE_CHECKING:
    from typing import Any, NoReturn


class Forked:
    """What the agent's ``Call`` reads of a ``Popen``, for a child that runs code of ours without exec."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stdin: Any = None
        self.returncode: int | None = None


def limit(cpu: int | None) -> None:
    # CPU seconds count per process: the agent lives for the session, so only commands get it.
    if cpu is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))


def be_placed(fd: int, cpu: int | None) -> None:
    """In the forked command, before exec: be seen by the executor, wait until it placed us."""
    limit(cpu)
    os.set_blocking(fd, True)
    os.write(fd, b"p")  # the kernel attaches our pid as the executor sees it (SO_PASSCRED)
    if os.read(fd, 1) != b"1":
        raise RuntimeError("the executor did not release the command")  # Popen: SubprocessError


def run_runner(msg: dict[str, Any], fds: list[int], held: int | None, stdin: bool, cpu: int | None) -> NoReturn:
    """In the forked child: become the call's process, then run the runner on its pipes."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if held is not None:
            be_placed(held, cpu)
        become(msg, fds, stdin)
        os.chdir(msg["cwd"])
        code = runner_main()
    except BaseException:  # whatever it is, it goes to the call's stderr
        import traceback

        with contextlib.suppress(BaseException):
            traceback.print_exc()
    os._exit(code)


def wait_for_call(link_fd: int, hold: int, cpu: int | None) -> NoReturn:
    """In the forked spare: be held and placed, then wait for the call and become it.

    The call comes from the executor itself on the hold socket (a command: the agent only
    learns of it, see :meth:`~sandbox._jailside.agent.Agent.handed_directly`, so that starting
    it costs no hop through the agent), or from the agent on our link (a file tool's request the
    agent declined).
    """
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in map(int, os.listdir("/proc/self/fd")):  # the agent's link, selector, wake pipe...
            if fd > 2 and fd not in (link_fd, hold):
                with contextlib.suppress(OSError):
                    os.close(fd)
        be_placed(hold, cpu)
        rehearse()
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
        become(msg, fds, stdin)
        if msg.get("py") == "runner":
            os.chdir(msg["cwd"])
            code = runner_main()
        else:
            exec_argv(msg)
    except BaseException:  # whatever it is, it goes to the call's stderr (or the agent's)
        import traceback

        with contextlib.suppress(BaseException):
            traceback.print_exc()
    os._exit(code)


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


def become(msg: dict[str, Any], fds: list[int], stdin: bool) -> None:
    """In a forked child: the call's session and stdio (its pipes), nothing else of the agent's."""
    os.setsid()
    os.dup2(fds[2] if stdin else os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in (0, 1, 2):
        os.set_blocking(fd, True)
    os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in msg["env"].items()})


def exec_argv(msg: dict[str, Any]) -> NoReturn:
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


def runner_main() -> int:
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
