"""The jail's half of the allowlist network: TCP on the jail's loopback, relayed to a unix socket.

A jail under ``network.mode = "allowlist"`` keeps its empty network namespace: its only
interface is its own ``lo``. The filtering proxy runs on the host and is reachable from inside
only through a unix socket bound into the jail; this program, started in the jail before the
user's command, listens on ``127.0.0.1:PORT`` (and ``[::1]:PORT`` where the jail has IPv6) and
relays each accepted connection byte for byte to that socket, so the usual proxy variables
(``http_proxy=http://127.0.0.1:PORT``) lead to the proxy and nowhere else. It decides nothing:
every judgement is the proxy's.

Usage: ``python3 -I -S -c "$(program('netfwd'))" --listen 127.0.0.1:3128 [--listen [::1]:3128]
--to SOCK [--ready-fd N] [-- ARGV]`` (see :func:`sandbox._jailside.program`). With ``-- ARGV`` it
binds, forks the forwarder and execs ARGV in its own process: how the jail launcher starts every
command of an allowlist jail (:mod:`sandbox.network.egress`). Once every listener is bound
it writes one line, ``ready ADDR...`` (the addresses it listens on, ports resolved when ``0`` was
asked), to fd ``N`` or to stdout, and closes that fd, so a launcher waits for the line (or EOF,
meaning failure) without polling. A ``--listen`` address the jail cannot bind (no IPv6) is
skipped while another is bound.

Each direction of a connection is one thread, which returns when its direction ends, so a
finished connection leaves no thread behind. End of data from one side becomes
``shutdown(SHUT_WR)`` on the other (half-close is kept); an error on either side shuts down both.
When the unix socket cannot be reached (the proxy died), the client's connection is reset at
once and nothing else is tried. The program exits on SIGTERM, SIGINT or its parent's death
(``PR_SET_PDEATHSIG``: the kernel means the parent *thread*, so start it from the process that
becomes the user's command, as ``sh -c 'netfwd & exec cmd'`` does, not from a worker thread).

Copying uses ``splice(2)`` through a pipe where ``os.splice`` exists (Python 3.10+), else
``recv_into``/``sendall`` with 256 KiB buffers; on loopback splice measured as fast or faster in
both directions, markedly so towards the proxy. ``--copy pass`` (what the launcher asks for) copies
nothing: each accepted connection is handed to the proxy itself over the unix socket
(``SCM_RIGHTS``), which then relays it straight to the server, one hop fewer.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import selectors
import signal
import socket
import struct
import sys
import threading

BUFFER = 256 * 1024
PIPE_SIZE = 256 * 1024
STACK_SIZE = 256 * 1024
PR_SET_PDEATHSIG = 1
# An address a jail may lack: without IPv6, [::1] is skipped rather than fatal.
UNAVAILABLE = {errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT}


def parse_address(text: str) -> tuple[socket.AddressFamily, str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{text!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        return socket.AF_INET6, host[1:-1], int(port)
    return socket.AF_INET, host, int(port)


def listener(family: socket.AddressFamily, host: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def listeners(addresses: list[str]) -> list[socket.socket]:
    """Bind every address; one the jail cannot have is skipped if another is bound.

    Port 0 on the first address picks a free port, and later port-0 addresses take the same one,
    so ``127.0.0.1`` and ``[::1]`` agree.
    """
    bound: list[socket.socket] = []
    skipped: list[OSError] = []
    for text in addresses:
        family, host, port = parse_address(text)
        port = port or (bound[0].getsockname()[1] if bound else 0)
        try:
            bound.append(listener(family, host, port))
        except OSError as exc:
            if exc.errno not in UNAVAILABLE:
                raise
            skipped.append(exc)
    if not bound:
        raise skipped[0]
    return bound


def show(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"


def die_with_parent() -> None:
    """SIGTERM on the parent's death; the check after prctl closes the race with an early death."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError, ImportError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        raise SystemExit(0)


def pipe_pair() -> tuple[int, int]:
    read_end, write_end = os.pipe()
    with contextlib.suppress(OSError, AttributeError):
        # A bigger pipe moves more per splice; above the unprivileged maximum the default stays.
        import fcntl

        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    return read_end, write_end


def splice_copy(src: socket.socket, dst: socket.socket) -> None:
    """Move bytes src -> dst through a pipe in the kernel, without copying them into Python."""
    read_end, write_end = pipe_pair()
    try:
        while moved := os.splice(src.fileno(), write_end, PIPE_SIZE):
            while moved:
                moved -= os.splice(read_end, dst.fileno(), moved)
    finally:
        os.close(read_end)
        os.close(write_end)


def plain_copy(src: socket.socket, dst: socket.socket) -> None:
    buffer = bytearray(BUFFER)
    view = memoryview(buffer)
    while count := src.recv_into(buffer):
        dst.sendall(view[:count])


class Connection:
    """One relayed connection: a thread per direction, the sockets closed once both are done."""

    def __init__(self, client: socket.socket, upstream: socket.socket, copy: str) -> None:
        self.client, self.upstream = client, upstream
        self.copy = splice_copy if copy == "splice" else plain_copy
        self.lock = threading.Lock()
        self.running = 2

    def start(self) -> None:
        threading.Thread(target=self.relay, args=(self.upstream, self.client), daemon=True).start()
        self.relay(self.client, self.upstream)

    def relay(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            self.copy(src, dst)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            # A reset or a closed peer on either side ends both directions: the other thread's
            # blocking call returns once its sockets are shut down.
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        finally:
            self.finished()

    def finished(self) -> None:
        with self.lock:
            self.running -= 1
            last = self.running == 0
        if last:
            self.client.close()
            self.upstream.close()


def reset(sock: socket.socket) -> None:
    """Close with an RST, so the client sees a failure at once rather than an empty answer."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def serve_one(client: socket.socket, target: str, copy: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(target)
    except OSError:
        upstream.close()
        reset(client)
        return
    if copy == "pass":
        hand_over(client, upstream)
        return
    Connection(client, upstream, copy).start()


def hand_over(client: socket.socket, upstream: socket.socket) -> None:
    """Give the proxy the connection itself (``SCM_RIGHTS``, after one zero byte): it then relays
    between the client and the server with no hop through this program."""
    try:
        socket.send_fds(upstream, [b"\0"], [client.fileno()])
    except OSError:
        reset(client)
    else:
        client.close()
    finally:
        upstream.close()


def serve(socks: list[socket.socket], target: str, copy: str, stop: int) -> None:
    with selectors.DefaultSelector() as selector:
        selector.register(stop, selectors.EVENT_READ)
        for sock in socks:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if not isinstance(key.fileobj, socket.socket):
                    return
                accept(key.fileobj, target, copy)


def accept(sock: socket.socket, target: str, copy: str) -> None:
    try:
        client, _ = sock.accept()
    except (BlockingIOError, ConnectionAbortedError):
        return
    client.setblocking(True)
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=serve_one, args=(client, target, copy), daemon=True).start()


def signal_pipe() -> int:
    """A pipe that becomes readable on SIGTERM or SIGINT, waking the accept loop."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    return read_end


def announce(socks: list[socket.socket], fd: int | None) -> None:
    line = ("ready " + " ".join(show(sock) for sock in socks) + "\n").encode()
    if fd is None:
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
        return
    os.write(fd, line)
    os.close(fd)


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="netfwd", description="Relay TCP on loopback to a unix socket.")
    parser.add_argument("--listen", action="append", required=True, help="HOST:PORT or [HOST6]:PORT")
    parser.add_argument("--to", required=True, help="the unix socket to relay to")
    parser.add_argument("--ready-fd", type=int, help="write the ready line here (default: stdout)")
    default = "splice" if hasattr(os, "splice") else "plain"
    parser.add_argument("--copy", choices=("splice", "plain", "pass"), default=default, help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- ARGV: run it with the forwarder beside it")
    return parser.parse_args(argv)


def run_beside(args: argparse.Namespace, command: list[str]) -> int:
    """Bind, fork the forwarder, exec ``command`` in this process: the jail launcher's way.

    The listeners exist before the command starts (connections wait in the backlog until the
    child accepts them), the forwarder holds none of the call's output pipes, and it dies with
    the command (``PR_SET_PDEATHSIG`` names this process, which becomes the command).
    """
    socks = listeners(args.listen)
    if os.fork() == 0:
        try:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            stop = signal_pipe()
            die_with_parent()
            threading.stack_size(STACK_SIZE)
            serve(socks, args.to, args.copy, stop)
        finally:
            os._exit(0)
    for sock in socks:
        sock.close()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"{command[0]}: {exc.strerror}\n")
        return 127 if exc.errno == errno.ENOENT else 126


def main(argv: list[str]) -> int:
    args = arguments(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command:
        return run_beside(args, command)
    stop = signal_pipe()
    die_with_parent()
    threading.stack_size(STACK_SIZE)
    socks = listeners(args.listen)
    announce(socks, args.ready_fd)
    serve(socks, args.to, args.copy, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
