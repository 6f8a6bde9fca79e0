"""A warm container's links to its agent: a unix socket carrying pipe ends, or the attach stream.

**The socket** (a local engine, the default). Before creating the container the host listens on
a unix socket in a directory of its own, ``<data dir>/run/agent-XXXX/agent.sock`` (or a
``/tmp/sbx-agent-XXXX`` directory when that path is too long for a socket address): the data
directory is ``0700`` and ours, the directory ``0700`` and the socket ``0600``, both handed to the
container's command uid when we are root (as an ordinary user, that uid is ours): the agent can
reach it and no other host user can, not even to connect first (issue 31, category 7). The
directory is bound **read-only** at :data:`AGENT_DIR` in the container (connecting to a socket
needs no write access to its file system); the agent connects to it first thing, before anything
else runs in the container, and tells us on its attach stream.

*Who may connect.* A jailed command runs as the agent's uid and could try to connect to the
socket too, so the host accepts **exactly one** connection and checks it: ``SO_PEERCRED`` gives
the peer's pid as the kernel sees it from our pid namespace, which must be the container's
first process (``State.Pid``: the agent, PID 1 inside). Only then is the connection used; the
listener is closed and the socket and its directory are removed at once, so a command that
later connects to the path finds nothing there (and could not have run earlier: commands start
only on our requests, which follow the check). The agent in turn trusts the one socket it
connected to, in a directory the container cannot write. The host never connects to anything
in the container, so a command that plants a socket of its own in its view gets no peer.
A pid that does not match (our process sees the container from another pid namespace, say)
makes the jail start over on the attach stream rather than trust the connection. What a command
can see: the empty, unreadable mount point, and (the kernel files an accepted connection under
the connecting side's network namespace) our socket's host path in ``/proc/net/unix``, a name
that leads nowhere in the container.

*What travels on it.* Requests as JSON lines, each ``run`` with its call's pipe ends as
``SCM_RIGHTS`` (:func:`socket.send_fds`): the write ends of the stdout and stderr pipes, and the
read end of stdin's; the agent's replies (exit status, refusals) as frames. The output itself
never crosses the socket: the command writes into our pipes, which we read like a local child's
(:class:`~sandbox.backends.child.FdReceiveStream`). The attach stream stays open beside it: it
carries the agent's start-up word and its stderr (diagnostics when it dies), and its end (the
daemon lost the container) ends the socket link too.

**The attach stream** (the fallback: a remote engine, whose daemon cannot bind our directory;
a socket the agent cannot reach; ``SANDBOX_DOCKER_STREAMS=attach``): requests go to the agent's
stdin, and the command's output comes back in frames through dockerd, at dockerd's pace.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from docker.utils.socket import frames_iter

from sandbox.backends.agentlink import FdLink, Link

__all__ = [
    "AttachLink",
    "Link",
    "Listener",
    "PeerRefused",
    "SocketLink",
    "owner_of",
    "socket_wanted",
    "stale_listener_dirs",
]
from sandbox.backends.docker.streams import STDOUT, unwrap_socket
from sandbox.datadir import subdir
from sandbox.errors import BackendUnavailable, SandboxError

if TYPE_CHECKING:
    from collections.abc import Sequence


AGENT_DIR = "/run/sandbox-agent"  # where the container sees the socket's directory
SOCKET_NAME = "agent.sock"
AGENT_SOCKET = f"{AGENT_DIR}/{SOCKET_NAME}"
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes
HELLO_WAIT_S = 30  # the agent's first word: Python's start-up in a busy container
STALE_LISTENER_S = 3600  # a listener's directory this old belongs to no start under way
DIAGNOSTICS = 4096  # the tail of the agent's own stderr kept for error messages
STREAMS_ENV = "SANDBOX_DOCKER_STREAMS"  # "attach" forces the fallback (tests, odd engines)
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class AttachLink(Link):
    """A warm container's attach stream: the agent's start-up word and stderr, and in attach mode
    its requests and frames.

    One thread reads the multiplexed stream for the jail's life and routes each frame to its
    call; a full stream blocks it (back-pressure through the daemon to the agent, which then
    stops reading the command's pipes). Requests are written from worker threads.
    """

    stream = "attach"

    def __init__(self, sock: Any) -> None:
        super().__init__()
        self.sock = sock
        raw = unwrap_socket(sock)
        if raw is None:
            raise BackendUnavailable("this Docker connection cannot carry the agent's requests", backend="docker")
        raw.settimeout(None)  # an idle session is not a dead daemon; close() unblocks the reader
        self._raw = raw
        self._diagnostics = b""
        self.hello: str | None = None  # the agent's first word when it was given a socket
        self.hello_seen = threading.Event()
        self.also_ends: Link | None = None  # the socket link, which cannot outlive this stream
        threading.Thread(target=self._run, name="docker-agent-link", daemon=True).start()

    @property
    def diagnostics(self) -> bytes:
        return self._diagnostics

    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        if fds:
            raise BackendUnavailable("the attach stream cannot carry file descriptors", backend="docker")
        with self._lock:
            self._raw.sendall(self.line(message))

    def _said(self, kind: bytes, payload: bytes) -> None:
        if kind == b"s":
            self.hello = payload.decode(errors="replace")
            self.hello_seen.set()

    def _run(self) -> None:
        buffer = bytearray()
        error: BaseException | None = None
        try:
            for stream_id, data in frames_iter(self.sock, tty=False):  # type: ignore[no-untyped-call]
                if stream_id == STDOUT:
                    buffer += data
                    self._parse(buffer)
                else:
                    self._diagnostics = (self._diagnostics + data)[-DIAGNOSTICS:]
        except (OSError, ValueError) as exc:  # the daemon died or we closed the socket
            error = exc
        finally:
            self.hello_seen.set()
            self.ended(error)
            if self.also_ends is not None:
                self.also_ends.ended(error)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)
            self.sock.close()
            self._raw.close()


class SocketLink(FdLink):
    """The agent's connection to our socket (:class:`~sandbox.backends.agentlink.FdLink`), tied to the attach stream."""

    def __init__(self, sock: socket.socket, attach: AttachLink) -> None:
        self.attach = attach
        super().__init__(sock, "docker-agent-socket")
        attach.also_ends = self
        if attach.dead:
            self.ended(attach.error)

    @property
    def diagnostics(self) -> bytes:
        return self.attach.diagnostics

    def close(self) -> None:
        super().close()
        self.attach.close()


def owner_of(user: str) -> tuple[int, int] | None:
    """``"uid:gid"`` (a container's command user) as numbers; ``None`` when it is not numeric."""
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or not (gid or uid).isdigit():
        return None
    return int(uid), int(gid or uid)


def _private_to(folder: Path, path: Path, owner: tuple[int, int] | None) -> None:
    """The directory ``0700`` and the socket ``0600``, both the container's command uid's when we are
    root (we reach them anyway): nobody else on the host can connect, not even to refuse the agent."""
    folder.chmod(0o700)
    path.chmod(0o600)
    if owner is not None and os.geteuid() == 0 and owner[0] != 0:
        os.chown(path, *owner)
        os.chown(folder, *owner)


def socket_wanted(base_url: str) -> str | None:
    """Why this engine gets the attach stream, or ``None`` for the socket."""
    if os.environ.get(STREAMS_ENV, "").strip().lower() == "attach":
        return f"{STREAMS_ENV}=attach"
    if base_url != "http+docker://localhost":  # docker-py's name for a local unix socket
        return f"a remote engine ({base_url}) cannot bind a directory of this host"
    return None


class Listener:
    """Our end before the agent connects: a unix socket in a directory of its own (see the module doc)."""

    def __init__(self, owner: tuple[int, int] | None = None) -> None:
        folder = Path(tempfile.mkdtemp(prefix="agent-", dir=subdir("run")))
        if len(str(folder / SOCKET_NAME)) > MAX_SOCKET_PATH:
            folder.rmdir()
            folder = Path(tempfile.mkdtemp(prefix="sbx-agent-"))
        self.folder = folder
        self.path = folder / SOCKET_NAME
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.bind(str(self.path))
            _private_to(folder, self.path, owner)
            self.sock.listen(1)
            self.sock.setblocking(False)
        except BaseException:
            self.close()
            raise

    def accept(self, agent_pid: int, siblings: bool = False) -> socket.socket:
        """The one connection we take: the agent's, proven by its pid; the listener is gone after it.

        ``siblings`` (gVisor): the container's processes are not the host's, and its runtime's gofer
        connects on the sandbox's behalf; a peer with the same parent as ``agent_pid`` (the Sentry,
        under the container's shim) is then the container's, and nothing but the agent runs in it yet.
        """
        try:
            conn, _ = self.sock.accept()
        except BlockingIOError:
            raise PeerRefused("the container's agent said it connected, but no connection was waiting") from None
        finally:
            self.close()
        pid, _uid, _gid = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        if pid != agent_pid and not (siblings and _same_parent(pid, agent_pid)):
            conn.close()
            raise PeerRefused(f"the socket's peer is pid {pid}, not the container's agent (pid {agent_pid})")
        return conn

    def close(self) -> None:
        self.sock.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _parent(pid: int) -> int | None:
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after its last ')'.
    fields = stat_line.rpartition(")")[2].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def _same_parent(pid: int, other: int) -> bool:
    """Whether two host processes are children of one process, which is neither init nor us."""
    parent = _parent(pid)
    return parent is not None and parent not in {0, 1, os.getpid()} and parent == _parent(other)


def stale_listener_dirs(older_than_s: float = STALE_LISTENER_S) -> list[Path]:
    """Remove the socket directories of listeners a killed executor left (returns them).

    A listener lives only while its container starts (the agent's word and one accept, bounded by
    :data:`HELLO_WAIT_S` and the SDK's timeouts), so a directory older than ``older_than_s`` is
    nobody's. Telling by connecting is not an option: the listener takes exactly one connection.
    """
    found = [*Path(tempfile.gettempdir()).glob("sbx-agent-*")]
    with contextlib.suppress(SandboxError):  # no data directory: nothing of ours in it either
        found += subdir("run").glob("agent-*")
    cutoff = time.time() - older_than_s
    removed = []
    for folder in found:
        with contextlib.suppress(OSError):
            st = folder.lstat()
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mtime < cutoff:
                shutil.rmtree(folder)
                removed.append(folder)
    return removed


class PeerRefused(Exception):
    """The one connection to the listener was not the agent's (or none came): the jail uses the attach stream."""
