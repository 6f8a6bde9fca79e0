"""Booted microVMs waiting for their session, and the one boot every VM starts with.

A guest boots without knowing its session: :mod:`sandbox._jailside.vmboot` says ``s boot`` on the
port and waits for the executor's word. So a VM can boot *before* a session asks for one, and
a session then costs a word and a few mounts instead of a boot.

What the boot cannot know is the workspace, and QEMU's 9p exports are fixed when it starts. As
root, a VM is therefore started in a mount namespace of its own (``unshare --mount``) and exports
one **staging** directory of ours; a session's directories (the workspace or its copy, the
scratch directory, plugin directories) are bind-mounted into it *in QEMU's namespace*
(``nsenter --mount``), read-only ones read-only on the host's side too, and the guest binds them
at their places. Those mounts live and die with QEMU's namespace: nothing is left on the host when
QEMU ends, however it ends. An ordinary user cannot mount, so there every VM exports its session's
directories from its start, and none is booted ahead.

:class:`Pool` keeps up to :data:`POOL_ENV` (default 1) booted VMs per kind (owner uid, memory,
vCPUs, acceleration, kernel, network port) once a kind has been asked for twice, boots a replacement in a thread
when one is taken, and kills the ones left when the process exits (a VM whose executor is gone
powers off anyway: its port ends).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from sandbox.backends.microvm import machine

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandbox.backends.microvm.assets import Assets

POOL_ENV = "SANDBOX_MICROVM_POOL"
DEFAULT_POOL = 1
MAX_KINDS = 4  # kinds kept booted at once; the oldest kind's VMs go first
BOOT_WAIT_S = {"kvm": 30.0, "tcg": 120.0}  # the guest's first word (TCG emulates every instruction)
HEADER = struct.Struct(">cII")  # the agent's frame header (sandbox._jailside.channel.HEADER)
STAGED_TAG = "ws"


class Kind(NamedTuple):
    owner: tuple[int, int]
    memory_mib: int
    cpus: int
    accel: str
    kernel: str
    net: bool = False  # with the network port (an allowlist session's)


class Booted(NamedTuple):
    """A VM at ``s boot``: QEMU (which owns its folder: the console, a staging directory) and, as
    root, the directory it exports."""

    vm: machine.Machine
    staging: Path | None  # root: the directory QEMU exports, in its own mount namespace

    def discard(self) -> None:
        self.vm.kill()  # its folder with it


class BootFailed(Exception):
    """The guest did not reach ``s boot`` (the reason, with QEMU's and the console's last words)."""


def staged(uid: int) -> bool:
    """Whether VMs for ``uid`` are staged: as root, for a uid QEMU can ``-runas`` (a named one)."""
    tools = shutil.which("unshare") is not None and shutil.which("nsenter") is not None
    return os.geteuid() == 0 and uid != 0 and tools and machine.user_name(uid) is not None


def boot(
    assets: Assets, kind: Kind, workspace: Path | None = None, exports: Sequence[tuple[str, Path, bool]] = ()
) -> Booted:
    """Start one VM and wait for its ``s boot`` (blocking). ``workspace`` and ``exports`` only where
    the VM is not staged (an ordinary user); a staged one exports its staging directory instead."""
    folder = Path(tempfile.mkdtemp(prefix="sbx-vm-"))  # QEMU (the owner) cannot enter our data directory
    try:
        console = folder / "console.log"
        console.touch()
        staging = None
        if workspace is None:
            staging = folder / "stage"
            staging.mkdir()
        if os.geteuid() == 0:
            for path in (folder, console, *([staging] if staging else [])):
                os.chown(path, *kind.owner)
        spec = {
            "workspace": staging or workspace,
            "read_only": False,
            "memory_mib": kind.memory_mib,
            "cpus": kind.cpus,
            "kind": kind.accel,
            "exports": exports,
            "own_namespace": staging is not None,
        }
        vm = machine.start(spec, assets, console, kind.owner, net=kind.net)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    booted = Booted(vm, staging)
    try:
        _wait_for_boot(vm, BOOT_WAIT_S.get(kind.accel, 120.0))
    except BaseException:
        booted.discard()
        raise
    return booted


def _wait_for_boot(vm: machine.Machine, wait: float) -> None:
    """Read the guest's ``s boot`` frame, the first bytes on the port."""
    vm.sock.settimeout(wait)
    data = b""
    try:
        while len(data) < HEADER.size + 4:
            chunk = vm.sock.recv(HEADER.size + 4 - len(data))
            if not chunk:
                break
            data += chunk
    except (TimeoutError, OSError) as exc:
        vm.kill()
        raise BootFailed(f"the guest did not boot within {wait:.0f}s ({_last_words(vm)})") from exc
    finally:
        with contextlib.suppress(OSError):
            vm.sock.settimeout(None)
    if data != HEADER.pack(b"s", 0, 4) + b"boot":
        vm.kill()
        raise BootFailed(f"the guest ended as it booted ({_last_words(vm)})")


def _last_words(vm: machine.Machine) -> str:
    return "; ".join(part for part in (vm.stderr_tail(), vm.console_tail(3)) if part)[-600:] or "no message"


def stage(booted: Booted, name: str, host: Path, read_only: bool, owner: tuple[int, int]) -> None:
    """Show ``host`` in the staged VM's export as ``name``: a bind mount in QEMU's namespace."""
    assert booted.staging is not None
    target = booted.staging / name
    target.mkdir()
    os.chown(target, *owner)
    pid = str(booted.vm.pid)
    _run(["nsenter", "-t", pid, "-m", "--", "mount", "--bind", str(host), str(target)])
    if read_only:  # the host's side read-only too: not even a guest kernel taken over writes through it
        _run(["nsenter", "-t", pid, "-m", "--", "mount", "-o", "remount,bind,ro", str(target)])


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv[5:])}: {done.stderr.strip() or f'exit status {done.returncode}'}")


class Pool:
    """Booted, staged VMs by kind (root only); see the module doc."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[Kind, list[Booted]] = {}
        self._starting: dict[Kind, int] = {}
        self._asked: dict[Kind, int] = {}
        self._closed = False
        atexit.register(self.close)

    @staticmethod
    def size() -> int:
        try:
            return max(0, int(os.environ.get(POOL_ENV, DEFAULT_POOL)))
        except ValueError:
            return DEFAULT_POOL

    def take(self, kind: Kind) -> Booted | None:
        """A booted VM of ``kind`` (its port still unread), or ``None``."""
        with self._lock:
            ready = self._ready.get(kind, [])
            while ready:
                booted = ready.pop(0)
                if booted.vm.alive() and not peer_closed(booted.vm.sock):
                    return booted
                threading.Thread(target=booted.discard, daemon=True).start()
        return None

    def refill(self, assets: Assets, kind: Kind) -> None:
        """Boot VMs of ``kind`` in the background until :meth:`size` wait, once this process has
        asked for that kind twice (a one-shot ``sandbox run`` boots nothing it will not use)."""
        if not staged(kind.owner[0]):
            return
        with self._lock:
            self._asked[kind] = self._asked.get(kind, 0) + 1
            if self._asked[kind] < 2:
                return
            if self._closed or len(self._ready.get(kind, [])) + self._starting.get(kind, 0) >= self.size():
                return
            self._starting[kind] = self._starting.get(kind, 0) + 1
            dropped: list[Booted] = []
            while kind not in self._ready and len(self._ready) >= MAX_KINDS:  # dicts keep their order
                dropped += self._ready.pop(next(iter(self._ready)))
        for booted in dropped:
            booted.discard()
        threading.Thread(target=self._boot, args=(assets, kind), name="microvm-pool", daemon=True).start()

    def _boot(self, assets: Assets, kind: Kind) -> None:
        booted = None
        try:
            booted = boot(assets, kind)
        except (BootFailed, OSError):
            pass  # the next session boots its own and says why
        finally:
            with self._lock:
                self._starting[kind] -= 1
                if booted is not None and not self._closed:
                    self._ready.setdefault(kind, []).append(booted)
                    booted = None
        if booted is not None:
            booted.discard()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spares = [booted for ready in self._ready.values() for booted in ready]
            self._ready.clear()
        for booted in spares:
            booted.discard()


POOL = Pool()


def peer_closed(sock: socket.socket) -> bool:
    """Whether the guest's end has gone (a spare that powered off while it waited)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
