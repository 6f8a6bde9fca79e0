"""The microVM's network mux (sandbox/_jailside/vmnet.py), both halves over a socketpair for the port.

The guest's half accepts TCP connections on loopback; the host's connects each to a unix server of
the test's (an echo, a server that never reads, or none at all), as it connects to the egress
proxy. The microVM's own egress suite (tests/integration/test_egress.py on ``microvm``) runs the
real thing through a guest.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

import pytest

from sandbox._jailside import vmnet

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path


def _serve(path: Path, handle: Callable[[socket.socket], None]) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(64)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server


def _echo(conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError):  # (a connection the mux ends midway)
        while data := conn.recv(65536):
            conn.sendall(data)
        conn.sendall(b"<bye>")  # after the client's end of data: half-close kept


class Pair:
    """A guest mux listening on loopback and a host mux connecting to ``target``, joined by a socketpair."""

    def __init__(self, target: Path) -> None:
        self.guest_end, self.host_end = socket.socketpair()
        self.host = vmnet.Mux(self.host_end.fileno(), connect=lambda: _unix(target))
        self.guest = vmnet.Mux(self.guest_end.fileno())
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        for mux in (self.host, self.guest):
            threading.Thread(target=mux.serve, daemon=True).start()
        threading.Thread(target=vmnet.accept_into, args=(self.listener, self.guest), daemon=True).start()

    def client(self) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=20)
        return sock

    def close(self) -> None:
        for sock in (self.listener, self.guest_end, self.host_end):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _unix(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        raise
    return sock


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[Pair]:
    server = _serve(tmp_path / "echo.sock", _echo)
    pair = Pair(tmp_path / "echo.sock")
    yield pair
    pair.close()
    server.close()


def _receive_all(sock: socket.socket) -> bytes:
    data = bytearray()
    while chunk := sock.recv(65536):
        data += chunk
    return bytes(data)


def test_many_megabytes_each_way_arrive_whole_past_the_window(echo: Pair) -> None:
    payload = os.urandom(5 << 20)  # twenty windows
    with echo.client() as sock:
        received: list[bytes] = []
        reader = threading.Thread(target=lambda: received.append(_receive_all(sock)))
        reader.start()
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        reader.join(60)
    assert received == [payload + b"<bye>"]


def test_connections_are_apart_and_a_stalled_one_stops_only_itself(tmp_path: Path) -> None:
    stalled = threading.Event()

    def handle(conn: socket.socket) -> None:
        first = conn.recv(1)
        if first == b"s":  # never reads again: its direction fills its window and stops there
            stalled.wait(60)
            conn.close()
            return
        conn.sendall(first + conn.recv(100))
        conn.close()

    server = _serve(tmp_path / "s.sock", handle)
    pair = Pair(tmp_path / "s.sock")
    try:
        slow = pair.client()
        slow.setblocking(False)
        sent = 0
        with contextlib.suppress(BlockingIOError):
            while sent < 64 << 20:
                sent += slow.send(b"s" * 65536)
        assert sent < 64 << 20  # back-pressure reached the client
        for n in range(5):
            with pair.client() as sock:
                sock.sendall(f"hello {n}".encode())
                assert sock.recv(100) == f"hello {n}".encode()
        stalled.set()
        slow.close()
    finally:
        pair.close()
        server.close()


def test_a_reply_written_as_the_server_resets_still_arrives(tmp_path: Path) -> None:
    """The proxy refuses over its caps with a reply, then closes with the request unread (a reset):
    the reply reaches the client whole before its connection ends."""
    reply = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"

    def refuse(conn: socket.socket) -> None:
        conn.recv(1, socket.MSG_PEEK)
        conn.sendall(reply)
        conn.close()  # the request unread: the relay's next read is a reset

    server = _serve(tmp_path / "refuse.sock", refuse)
    pair = Pair(tmp_path / "refuse.sock")
    try:
        for _ in range(20):
            with pair.client() as sock:
                sock.sendall(b"GET http://evil.test/ HTTP/1.1\r\n\r\n" + b"x" * 4096)
                got = b""
                with contextlib.suppress(ConnectionResetError):
                    while chunk := sock.recv(65536):
                        got += chunk
                assert got == reply
    finally:
        pair.close()
        server.close()


def test_no_proxy_behind_means_the_connection_is_closed_at_once(tmp_path: Path) -> None:
    pair = Pair(tmp_path / "nothing.sock")
    try:
        with pair.client() as sock:
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(100) == b""
        assert _until(lambda: not pair.guest.connections and not pair.host.connections)
    finally:
        pair.close()


def test_the_port_ending_ends_every_connection(echo: Pair) -> None:
    socks = [echo.client() for _ in range(3)]
    for sock in socks:
        sock.sendall(b"x")
        assert sock.recv(10) == b"x"
    echo.host_end.shutdown(socket.SHUT_RDWR)  # the VM (or the executor) is gone
    for sock in socks:
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(10) == b""
        sock.close()
    assert _until(lambda: echo.guest.ended.is_set() and not echo.guest.connections)


# -- the host's half against a guest that breaks the protocol (what a taken-over guest kernel could send)


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[tuple[socket.socket, vmnet.Mux, threading.Event]]:
    never = threading.Event()

    def sink(conn: socket.socket) -> None:  # takes the connection, never reads
        never.wait(60)
        conn.close()

    server = _serve(tmp_path / "sink.sock", sink)
    guest, host_end = socket.socketpair()
    host = vmnet.Mux(host_end.fileno(), connect=lambda: _unix(tmp_path / "sink.sock"))
    thread = threading.Thread(target=host.serve, daemon=True)
    thread.start()
    yield guest, host, never
    never.set()
    guest.close()
    thread.join(10)
    host_end.close()
    server.close()


def _frames(sock: socket.socket, until: bytes, timeout: float = 20) -> list[tuple[bytes, int, int]]:
    sock.settimeout(timeout)
    seen: list[tuple[bytes, int, int]] = []
    while True:
        try:
            header = sock.recv(vmnet.HEADER.size, socket.MSG_WAITALL)
        except TimeoutError:
            raise AssertionError(f"no {until!r} frame within {timeout} s after {seen}") from None
        assert len(header) == vmnet.HEADER.size, seen
        kind, cid, length = vmnet.HEADER.unpack(header)
        if kind == b"d":
            sock.recv(length, socket.MSG_WAITALL)
        seen.append((kind, cid, length))
        if kind == until:
            return seen


def test_a_guest_sending_past_its_credit_loses_that_connection(
    hostile: tuple[socket.socket, vmnet.Mux, threading.Event],
) -> None:
    guest, host, _ = hostile
    guest.sendall(vmnet.HEADER.pack(b"o", 7, 0))
    assert _until(lambda: 7 in host.connections)
    chunk = b"z" * vmnet.CHUNK
    # The sink never reads: what the socket's buffers cannot take stays queued, past the window.
    for _ in range(64):
        guest.sendall(vmnet.HEADER.pack(b"d", 7, len(chunk)) + chunk)
    assert (b"c", 7, 0) in _frames(guest, until=b"c")
    assert _until(lambda: not host.connections)
    assert not host.ended.is_set()  # the port stays: other connections go on


def test_a_connection_closed_while_its_connect_waits_leaves_nothing() -> None:
    """The guest breaks its credit before the host has reached the proxy: the socket the connect
    then returns is closed at once, and no thread is left writing to it."""
    release = threading.Event()
    connected: list[socket.socket] = []
    peers: list[socket.socket] = []

    def slow_connect() -> socket.socket:
        release.wait(20)
        sock, peer = socket.socketpair()
        connected.append(sock)
        peers.append(peer)
        return sock

    guest, host_end = socket.socketpair()
    host = vmnet.Mux(host_end.fileno(), connect=slow_connect)
    threading.Thread(target=host.serve, daemon=True).start()
    try:
        guest.sendall(vmnet.HEADER.pack(b"o", 3, 0))
        chunk = b"z" * vmnet.CHUNK
        for _ in range(vmnet.WINDOW // vmnet.CHUNK + 1):
            guest.sendall(vmnet.HEADER.pack(b"d", 3, len(chunk)) + chunk)
        assert (b"c", 3, 0) in _frames(guest, until=b"c")
        release.set()
        assert _until(lambda: not host.connections)
        assert _until(lambda: connected and connected[0].fileno() == -1)
    finally:
        release.set()
        for sock in (guest, host_end, *peers):
            sock.close()


def test_a_guest_cannot_open_more_than_the_cap(hostile: tuple[socket.socket, vmnet.Mux, threading.Event]) -> None:
    guest, host, _ = hostile
    for cid in range(1, vmnet.MAX_CONNECTIONS + 2):
        guest.sendall(vmnet.HEADER.pack(b"o", cid, 0))
    assert (b"c", vmnet.MAX_CONNECTIONS + 1, 0) in _frames(guest, until=b"c")
    assert len(host.connections) <= vmnet.MAX_CONNECTIONS


@pytest.mark.parametrize("frame", [vmnet.HEADER.pack(b"?", 1, 0), vmnet.HEADER.pack(b"d", 1, vmnet.CHUNK + 1)])
def test_a_frame_that_breaks_the_format_ends_the_port(
    hostile: tuple[socket.socket, vmnet.Mux, threading.Event], frame: bytes
) -> None:
    guest, host, _ = hostile
    guest.sendall(vmnet.HEADER.pack(b"o", 1, 0))
    assert _until(lambda: 1 in host.connections)
    guest.sendall(frame)
    assert _until(host.ended.is_set)
    assert _until(lambda: not host.connections)


def _until(check: Callable[[], object], timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
