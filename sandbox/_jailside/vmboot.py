"""The microVM's first Python: PID 1 of the guest, root until it becomes the agent.

Stdlib only. The guest's init (a shell script in the initramfs, :mod:`sandbox.backends.microvm.assets`)
loads the virtio modules, mounts the image's root file system (9p, read-only) under a tmpfs
overlay, opens the agent's virtio-serial port as fds 0 and 1 and starts this program as PID 1.
It waits for the executor's word on the port, which may come long after the boot (a VM of the
pool boots before anyone asks for it):

``{"uid", "gid", "workspace", "mode", "binds", "exports", "dirs", "tmp_size", "tmp_inodes", "memory", "pids", "rlimits",
"argv", "program", "net"}``
as one JSON line, then ``program`` bytes: the agent's program (:mod:`sandbox._jailside.agent`); with
``net`` (``{"port", "uid", "listen", "program"}``, an allowlist network), its ``program`` bytes
next: the relay of :mod:`sandbox._jailside.vmnet`, started as ``uid`` on its own port.

With it this program shows the workspace (the ``ws`` 9p export) at its own absolute path, read-only
in ``ro``, makes its seal's binds (git's paths read-only, secrets masked), makes the private
``/tmp`` and home, remounts the root read-only, starts the allowlist's relay, puts itself in the
jail's cgroup (``memory``, ``pids``), sets the rlimits, drops to the command uid for good (no capabilities, no new
privileges) and runs the agent in this same process: the agent is PID 1 as in a warm container.
Anything that fails is told on the port as a ``!`` frame of call 0 and the guest powers off
(PID 1 exits: the kernel panics, and QEMU, started with ``-no-reboot``, ends).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import select
import struct
import sys
import time
from typing import Any

HEADER = struct.Struct(">cII")  # the agent's frame header (sandbox._jailside.channel.HEADER)
MAX_WORD = 1 << 20
BOOT_WORD_S = 30.0  # to write ``s boot``: the executor reads it at once, if it is still there
MAX_PROGRAM = 1 << 24
PR_SET_NO_NEW_PRIVS = 38
LIBC = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MNT_DETACH = 2
CGROUP = "/sys/fs/cgroup"
STAGE = "/run/sandbox-stage"  # a staged VM's one export (sandbox.backends.microvm.pool)
CLONE_NEWCGROUP = 0x02000000
EMPTY_DIR = "/run/sandbox-empty"  # what a masked directory shows
EMPTY_FILE = "/run/sandbox-empty-file"  # what a masked file shows
PORTS = "/sys/class/virtio-ports"
NET_READY_S = 20.0


def frame(kind: bytes, payload: bytes) -> None:
    data = HEADER.pack(kind, 0, len(payload)) + payload
    while data:
        data = data[os.write(1, data) :]


def read_exact(count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = os.read(0, count - len(data))
        if not chunk:
            raise OSError("the executor left before its word was whole")
        data += chunk
    return bytes(data)


def read_word() -> dict[str, Any]:
    line = bytearray()
    while not line.endswith(b"\n"):
        chunk = os.read(0, 1)
        if not chunk:
            raise OSError("the executor left before its word")
        line += chunk
        if len(line) > MAX_WORD:
            raise ValueError("the executor's word is too long")
    word: dict[str, Any] = json.loads(line)
    return word


def mount(source: str, target: str, fstype: str | None = None, flags: int = 0, data: str = "") -> None:
    """mount(2) itself: no ``mount`` program, no process per mount (each costs a fork on an emulated CPU)."""
    fs = fstype.encode() if fstype else None
    if LIBC.mount(source.encode(), target.encode(), fs, flags, data.encode() if data else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def bind(source: str, target: str, read_only: bool) -> None:
    mount(source, target, None, MS_BIND)
    if read_only:
        mount("none", target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def mount_point(target: str, is_dir: bool) -> bool:
    """Make a mask's mount point that is not there (a copy leaves masked entries out; a secret went
    meanwhile): what a call later writes at that path is covered too. False on a read-only workspace."""
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if is_dir:
            os.mkdir(target)
        else:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    except OSError as exc:
        if exc.errno == errno.EROFS:
            return False
        raise
    return True


def detach(target: str) -> None:
    if LIBC.umount2(target.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {target}: {os.strerror(err)}")


def private_dir(path: str, size: str, inodes: int, uid: int, gid: int) -> None:
    os.makedirs(path, exist_ok=True)
    mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},nr_inodes={inodes},mode=0700")
    os.chown(path, uid, gid)


def show(word: dict[str, Any]) -> None:
    uid, gid = int(word["uid"]), int(word["gid"])
    # First the private places: a workspace may lie beneath one of them (under /tmp, say).
    size = str(word.get("tmp_size") or "256m")
    inodes = int(word.get("tmp_inodes") or 65536)
    private_dir("/tmp", size, inodes, uid, gid)
    os.chmod("/tmp", 0o1777)
    for path in word.get("dirs", []):  # the home, and what else the command uid owns
        if path.startswith("/tmp/"):  # within /tmp's tmpfs: under its caps, as bubblewrap's home is
            os.makedirs(path, mode=0o700, exist_ok=True)
            os.chown(path, uid, gid)
        else:
            private_dir(path, size, inodes, uid, gid)
    workspace = word["workspace"]
    os.makedirs(workspace, exist_ok=True)
    options = "trans=virtio,version=9p2000.L,msize=262144,cache=none"
    shown = [("ws", workspace, word["mode"] == "ro"), *word.get("exports", [])]
    if word.get("staged"):
        # One export, the executor's staging directory, holding each directory by its tag (bound
        # there in QEMU's own mount namespace after the boot); its mount point is root's alone.
        os.makedirs(STAGE, mode=0o700, exist_ok=True)
        mount("ws", STAGE, "9p", MS_NOSUID | MS_NODEV, options)
    for tag, path, read_only in shown:  # the workspace, the scratch directory, plugin directories
        os.makedirs(path, exist_ok=True)
        if word.get("staged"):
            bind(f"{STAGE}/{tag}", path, read_only)
        else:
            mount(tag, path, "9p", MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0), options)
    if word.get("staged"):  # the binds stay; the staging directory itself leaves the command's view
        detach(STAGE)
    # The seal (sandbox.backends.seal.binds): in rw, git's protected paths bound read-only onto
    # themselves; the masked secrets covered by an empty directory or file. Ours, in the guest's
    # root: the command (not root) can neither unmount them nor write beneath them.
    os.makedirs(EMPTY_DIR, mode=0o555, exist_ok=True)
    with open(EMPTY_FILE, "wb"):
        pass
    os.chmod(EMPTY_FILE, 0o444)
    for source, target, read_only in word.get("binds", []):
        if not os.path.lexists(target) and not mount_point(target, source == EMPTY_DIR):
            continue  # a read-only workspace without it: nothing there to mask, nor can anything be made
        bind(source, target, read_only)
    mount("none", "/", None, MS_REMOUNT | MS_RDONLY)


def port_device(name: str) -> str:
    """The device of the virtio-serial port QEMU named ``name``."""
    for entry in sorted(os.listdir(PORTS)):
        try:
            with open(f"{PORTS}/{entry}/name", encoding="ascii") as fh:
                if fh.read().strip() == name:
                    return f"/dev/{entry}"
        except OSError:
            continue
    raise OSError(f"no virtio-serial port named {name}")


def network(net: dict[str, Any], program: bytes) -> None:
    """The allowlist's mux (:mod:`sandbox._jailside.vmnet`): its port opened as root, then its own
    process as a uid of its own, listening before the agent (and any command) runs."""
    port = os.open(port_device(net["port"]), os.O_RDWR | os.O_CLOEXEC)
    ready, told = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the guest's child
        code = 0
        try:
            null = os.open("/dev/null", os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)  # the agent's port is the agent's alone
            os.dup2(port, 3)
            os.dup2(told, 4)
            os.closerange(5, 4096)
            uid = int(net["uid"])
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            if LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                os._exit(71)
            listen = [arg for address in net["listen"] for arg in ("--listen", address)]
            sys.argv = ["sandbox-vmnet", "--port-fd", "3", "--ready-fd", "4", *listen]
            exec(compile(program, "sandbox/_jailside/vmnet-program", "exec"), {"__name__": "__main__"})
        except BaseException:
            code = 70
        os._exit(code)
    os.close(port)
    os.close(told)
    try:
        readable, _, _ = select.select([ready], [], [], NET_READY_S)
        said = os.read(ready, 64) if readable else b""
    finally:
        os.close(ready)
    if said != b"ready\n":
        raise OSError("the network's relay did not start")


def write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as fh:
        fh.write(text)


def confine(word: dict[str, Any]) -> None:
    """The jail's cgroup: ``memory.max`` and ``pids.max`` over the agent and what it runs (one call
    at a time), seen as the root of a cgroup namespace of its own, so the agent reads its
    ``memory.events`` where a container's agent does (:mod:`sandbox._jailside.census`). PID 1 is
    never the OOM killer's choice: a call over the limit loses its own process, the agent stays."""
    mount("cgroup2", CGROUP, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    write(f"{CGROUP}/cgroup.subtree_control", "+memory +pids")
    jail = f"{CGROUP}/jail"
    os.mkdir(jail)
    if word.get("memory"):
        write(f"{jail}/memory.max", str(int(word["memory"])))
        write(f"{jail}/memory.swap.max", "0")
    if word.get("pids"):
        write(f"{jail}/pids.max", str(int(word["pids"])))
    write(f"{jail}/cgroup.procs", str(os.getpid()))
    if LIBC.unshare(CLONE_NEWCGROUP) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWCGROUP)")
    detach(CGROUP)
    mount("cgroup2", CGROUP, "cgroup2", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def become(word: dict[str, Any]) -> None:
    for name, value in (word.get("rlimits") or {}).items():
        limit = getattr(resource, name)
        resource.setrlimit(limit, (int(value), int(value)))
    uid, gid = int(word["uid"]), int(word["gid"])
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # every uid non-zero: the capabilities are gone with root
    if LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    os.chdir(word["workspace"])


def booted() -> None:
    """``s boot`` on the port, the word may come now (or when a session takes this VM). A port whose
    host end is gone blocks a write for ever: an executor that died while we booted ends us here."""
    data = HEADER.pack(b"s", 0, 4) + b"boot"
    os.set_blocking(1, False)
    deadline = time.monotonic() + BOOT_WORD_S
    while data:
        try:
            data = data[os.write(1, data) :]
        except BlockingIOError:
            if time.monotonic() > deadline:
                sys.exit(71)
            select.select([], [1], [], 1.0)
    os.set_blocking(1, True)


def main() -> None:
    booted()
    try:
        word = read_word()
        program = read_exact(min(int(word["program"]), MAX_PROGRAM))
        net = word.get("net")
        relay = read_exact(min(int(net["program"]), MAX_PROGRAM)) if net else b""
        show(word)
        if net:
            network(net, relay)
        confine(word)
        become(word)
    except Exception as exc:  # told to the executor, then the guest ends
        frame(b"!", f"the microVM could not start its agent: {exc}".encode(errors="replace"))
        sys.exit(70)
    frame(b"s", b"ready")
    sys.argv = ["sandbox-agent", *word["argv"]]
    code = compile(program, "sandbox/_jailside/agent-program", "exec")
    exec(code, {"__name__": "__main__"})  # the executor's own agent, as docker runs it


if __name__ == "__main__":
    main()
