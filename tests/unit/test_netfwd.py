"""The jail-side forwarder, run as the jail runs it, on loopback against a unix-socket server.

Each test starts ``netfwd`` the way the launcher does (``python3 -I -S -c`` with the text of
:func:`sandbox._jailside.program`), waits for its ``ready`` line on a pipe, and talks TCP to it
while a thread plays the host-side proxy on a unix socket. Both copy paths (``splice`` through
a pipe, and plain ``recv``/``sendall``) get the byte-for-byte checks. Nothing here needs root.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

from sandbox import _jailside

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

PROGRAM = _jailside.program("netfwd")
MIB = 1024 * 1024
# Bounds on how long a step may take before the test fails; no step waits for them to pass.
DEADLINE_S = 10.0


class UnixServer:
    """The host-side proxy's stand-in: each accepted connection is handed to ``handler`` in a thread."""

    def __init__(self, path: Path, handler: Callable[[socket.socket], object]) -> None:
        self.path, self.handler = path, handler
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(16)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.run, args=(conn,), daemon=True).start()

    def run(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            self.handler(conn)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(DEADLINE_S)


def echo(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


class Forwarder:
    def __init__(self, target: Path, *args: str, copy: str | None = None, parent: list[str] | None = None) -> None:
        read_end, write_end = os.pipe()
        argv = [sys.executable, "-I", "-S", "-c", PROGRAM, "--to", str(target), "--ready-fd", str(write_end), *args]
        if copy:
            argv += ["--copy", copy]
        self.proc = subprocess.Popen(
            [*(parent or []), *argv],
            pass_fds=(write_end,),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        os.close(write_end)
        with os.fdopen(read_end, "rb") as ready:
            self.line = ready.readline().decode()
        self.addresses = self.line.split()[1:]

    @property
    def port(self) -> int:
        return int(self.addresses[0].rsplit(":", 1)[1])

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=DEADLINE_S)
        return sock

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.communicate(timeout=DEADLINE_S)


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    return tmp_path / "proxy.sock"


@pytest.fixture
def echo_server(sock_path: Path) -> Iterator[UnixServer]:
    server = UnixServer(sock_path, echo)
    yield server
    server.close()


@contextlib.contextmanager
def forwarder(target: Path, *args: str, copy: str | None = None) -> Iterator[Forwarder]:
    fwd = Forwarder(target, "--listen", "127.0.0.1:0", *args, copy=copy)
    try:
        assert fwd.line.startswith("ready "), fwd.proc.stderr
        yield fwd
    finally:
        fwd.stop()


def send_then_close(sock: socket.socket, data: bytes) -> None:
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


@pytest.mark.parametrize("copy", ["splice", "plain"])
@pytest.mark.usefixtures("echo_server")
def test_relays_a_mebibyte_each_way_byte_for_byte(sock_path: Path, copy: str) -> None:
    data = os.urandom(MIB)
    with forwarder(sock_path, copy=copy) as fwd, fwd.connect() as sock:
        sender = threading.Thread(target=send_then_close, args=(sock, data))
        sender.start()
        echoed = read_all(sock)
        sender.join()
    assert hashlib.sha256(echoed).hexdigest() == hashlib.sha256(data).hexdigest()


def count_then_answer(conn: socket.socket) -> None:
    conn.sendall(b"received %d" % len(read_all(conn)))


@pytest.mark.parametrize("copy", ["splice", "plain"])
def test_client_half_close_reaches_the_proxy_and_the_answer_still_comes_back(sock_path: Path, copy: str) -> None:
    server = UnixServer(sock_path, count_then_answer)
    with forwarder(sock_path, copy=copy) as fwd, fwd.connect() as sock:
        sock.sendall(b"x" * 1000)
        sock.shutdown(socket.SHUT_WR)
        assert read_all(sock) == b"received 1000"
    server.close()


def test_proxy_half_close_reaches_the_client_which_can_still_send(sock_path: Path) -> None:
    received: queue.Queue[bytes] = queue.Queue()

    def greet_then_listen(conn: socket.socket) -> None:
        conn.sendall(b"hello")
        conn.shutdown(socket.SHUT_WR)
        received.put(read_all(conn))

    server = UnixServer(sock_path, greet_then_listen)
    with forwarder(sock_path) as fwd, fwd.connect() as sock:
        assert read_all(sock) == b"hello"
        sock.sendall(b"still here")
        sock.shutdown(socket.SHUT_WR)
        assert received.get(timeout=DEADLINE_S) == b"still here"
    server.close()


def sees_end(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def connected_then_ended(fwd: Forwarder) -> bool:
    """Whether the forwarder ended our connection: seen by a read, or before our connect() returned
    (a reset that comes first is connect()'s error: at once too, seen on a loaded CI)."""
    try:
        sock = fwd.connect()
    except ConnectionResetError:
        return True
    with sock:
        return sees_end(sock)


def test_a_missing_proxy_socket_ends_the_client_connection_at_once(sock_path: Path) -> None:
    with forwarder(sock_path) as fwd:
        started = time.monotonic()
        assert connected_then_ended(fwd)
        assert time.monotonic() - started < 1.0


def test_a_proxy_that_drops_the_connection_ends_the_client_connection(sock_path: Path) -> None:
    server = UnixServer(sock_path, lambda conn: conn.recv(1))
    with forwarder(sock_path) as fwd, fwd.connect() as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert sees_end(sock)
    server.close()


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def eventually(condition: Callable[[], bool]) -> bool:
    """Poll ``condition`` until it holds or the deadline passes: a thread's exit has no event to wait on."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.usefixtures("echo_server")
def test_finished_connections_leave_no_thread_behind(sock_path: Path) -> None:
    with forwarder(sock_path) as fwd:
        baseline = threads_of(fwd.proc.pid)
        for _ in range(20):
            with fwd.connect() as sock:
                sock.sendall(b"ping")
                sock.shutdown(socket.SHUT_WR)
                assert read_all(sock) == b"ping"
        assert eventually(lambda: threads_of(fwd.proc.pid) == baseline)


@pytest.mark.usefixtures("echo_server")
def test_listens_on_ipv6_loopback_too_when_the_jail_has_it(sock_path: Path) -> None:
    with forwarder(sock_path, "--listen", "[::1]:0") as fwd:
        if len(fwd.addresses) == 1:
            pytest.skip("no IPv6 loopback here: [::1] was skipped, as the forwarder does in such a jail")
        assert fwd.addresses[1] == f"[::1]:{fwd.port}"
        with socket.create_connection(("::1", fwd.port), timeout=DEADLINE_S) as sock:
            sock.sendall(b"six")
            sock.shutdown(socket.SHUT_WR)
            assert read_all(sock) == b"six"


def test_a_port_in_use_fails_without_a_ready_line(sock_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        fwd = Forwarder(sock_path, "--listen", f"127.0.0.1:{taken.getsockname()[1]}")
        _, err = fwd.proc.communicate(timeout=DEADLINE_S)
    assert (fwd.line, fwd.proc.returncode != 0) == ("", True), err


@pytest.mark.usefixtures("echo_server")
def test_sigterm_ends_it_with_connections_open(sock_path: Path) -> None:
    with forwarder(sock_path) as fwd, fwd.connect() as sock:
        sock.sendall(b"open")
        assert sock.recv(4) == b"open"
        fwd.proc.send_signal(signal.SIGTERM)
        assert fwd.proc.wait(timeout=DEADLINE_S) == 0


PARENT = """
import subprocess, sys
child = subprocess.Popen(sys.argv[1:], pass_fds=[int(sys.argv[sys.argv.index("--ready-fd") + 1])])
print(child.pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.usefixtures("echo_server")
def test_it_exits_when_its_parent_dies(sock_path: Path) -> None:
    parent = [sys.executable, "-I", "-c", PARENT]
    fwd = Forwarder(sock_path, "--listen", "127.0.0.1:0", parent=parent)
    assert fwd.line.startswith("ready ")
    assert fwd.proc.stdout is not None
    pidfd = os.pidfd_open(int(fwd.proc.stdout.readline()))
    try:
        fwd.proc.kill()
        fwd.stop()
        readable, _, _ = select.select([pidfd], [], [], DEADLINE_S)
        assert readable == [pidfd], "the forwarder outlived its parent"
    finally:
        os.close(pidfd)


def test_a_client_reset_ends_the_proxy_side_too(sock_path: Path) -> None:
    ended: queue.Queue[bool] = queue.Queue()
    server = UnixServer(sock_path, lambda conn: ended.put(sees_end(conn)))
    with forwarder(sock_path) as fwd:
        sock = fwd.connect()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        assert ended.get(timeout=DEADLINE_S)
    server.close()


# -- pass: the connection itself handed to the proxy (what the launcher uses) --------------------


def adopt_and_echo(conn: socket.socket) -> None:
    """The proxy's side of ``--copy pass``: one zero byte with the client's socket, then talk to it."""
    data, fds, _, _ = socket.recv_fds(conn, 1, 1)
    assert data == b"\0" and len(fds) == 1
    with socket.socket(fileno=fds[0]) as client:
        echo(client)


def test_pass_hands_the_connection_itself_to_the_proxy(sock_path: Path) -> None:
    server = UnixServer(sock_path, adopt_and_echo)
    data = os.urandom(MIB)
    try:
        with forwarder(sock_path, copy="pass") as fwd, fwd.connect() as sock:
            sender = threading.Thread(target=send_then_close, args=(sock, data))
            sender.start()
            echoed = read_all(sock)
            sender.join()
            assert eventually(lambda: threads_of(fwd.proc.pid) == 1)  # no relay thread: the proxy relays
    finally:
        server.close()
    assert echoed == data


def test_pass_without_a_proxy_resets_the_client(sock_path: Path) -> None:
    with forwarder(sock_path, copy="pass") as fwd:
        assert connected_then_ended(fwd)


def run_beside(listen: str, to: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """The forwarder run to completion as ``--listen LISTEN --to TO -- COMMAND``."""
    argv = [sys.executable, "-I", "-S", "-c", PROGRAM, "--listen", listen, "--to", str(to), "--", *command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE_S, check=False)


def test_run_beside_a_command_listens_before_the_command_starts(sock_path: Path) -> None:
    """``-- ARGV``: bound first, the command exec'd in the forwarder's own process, which the
    forwarder outlives by nothing (it dies with the command)."""
    server = UnixServer(sock_path, echo)
    probe = (
        "import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5); "
        "s.sendall(b'ping'); print(s.recv(4).decode())"
    )
    port = free_port()
    try:
        done = run_beside(f"127.0.0.1:{port}", sock_path, sys.executable, "-c", probe, str(port))
    finally:
        server.close()
    assert (done.returncode, done.stdout.strip()) == (0, "ping"), done.stderr
    assert eventually(lambda: not listening(port))


def test_run_beside_a_missing_command_exits_127(sock_path: Path) -> None:
    done = run_beside("127.0.0.1:0", sock_path, "/no/such/command")
    assert done.returncode == 127 and "/no/such/command" in done.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0
