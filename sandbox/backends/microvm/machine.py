"""One QEMU ``microvm``: its command line, its start, its end.

The machine has no PCI bus, no firmware tables beyond ACPI's, no disk and **no network device**:
virtio-mmio devices only, namely

* 9p exports: ``root``, the image's root file system, read-only; ``ws``, the workspace (or its
  private copy), read-only in ``ro``; the session's scratch directory; plugin directories, read-only.
  QEMU's 9p server resolves every path component with ``O_NOFOLLOW`` beneath the export, so a
  link the guest plants leads nowhere on the host;
* one virtio-serial port (:data:`~sandbox.backends.microvm.assets.AGENT_PORT`) whose host end is one
  end of a socketpair of ours handed to QEMU as an fd (``-chardev socket,fd=N``): no path that
  another process could connect to, nothing to clean up; under an allowlist network a second one
  (:data:`~sandbox.backends.microvm.assets.NET_PORT`), the same way, for the connections to the
  egress proxy (:mod:`sandbox._jailside.vmnet`);
* the serial console, written to a file of ours (the guest kernel's messages: a panic's reason).

QEMU runs as the workspace owner (``-runas`` when we are root), under its own seccomp sandbox
(``-sandbox on``: no new privileges, no ``exec``, no resource control), in a process group of its
own, with ``-no-reboot``: when the guest's PID 1 ends or its kernel panics, QEMU exits. Killing
QEMU is the last resort of every kill: nothing of the guest survives its process.

Acceleration: KVM where ``/dev/kvm`` opens and is a hardware KVM (the CPU shows ``vmx`` or
``svm``); TCG (QEMU's own code translation) where it is not. A host whose ``/dev/kvm`` is PVM
(``/sys/module/kvm_pvm``, or a ``/dev/kvm`` on a CPU without either flag: a paravirtual KVM for
nested clouds) runs only PVM-built guest kernels, and Debian's is not one: there the machine is
emulated, much slower, and ``sandbox check`` says so.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sandbox.backends.microvm.assets import AGENT_PORT, NET_PORT

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sandbox.backends.microvm.assets import Assets

Accel = Literal["kvm", "tcg"]
QEMU = "qemu-system-x86_64"
ACCEL_ENV = "SANDBOX_MICROVM_ACCEL"  # kvm | tcg: force one (tests, a host we misjudge)
KERNEL_ARGS = (
    "console=ttyS0 panic=-1 reboot=t tsc_early_khz=2000000 lpj=4000000 rootfstype=ramfs i8042.noaux i8042.nokbd"
)
KVM_DEVICE = "/dev/kvm"


def qemu_path() -> str | None:
    return shutil.which(QEMU)


def accel() -> tuple[Accel, str]:
    """The acceleration this host gives a Debian guest kernel, and why."""
    forced = os.environ.get(ACCEL_ENV, "").strip().lower()
    if forced in ("kvm", "tcg"):
        return forced, f"{ACCEL_ENV}={forced}"  # type: ignore[return-value]
    if Path("/sys/module/kvm_pvm").exists():
        return "tcg", ("/dev/kvm is PVM (kvm_pvm), which runs only PVM-built guest kernels, not Debian's")
    try:
        fd = os.open(KVM_DEVICE, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return "tcg", f"{KVM_DEVICE}: {exc.strerror}"
    os.close(fd)
    if not cpu_virtualises():
        return "tcg", f"{KVM_DEVICE} opens but the CPU shows neither vmx nor svm (a paravirtual KVM)"
    return "kvm", "KVM"


def cpu_virtualises(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU shows hardware virtualisation (Intel VMX, AMD SVM) to this kernel."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as file:
            for line in file:
                if line.startswith("flags"):
                    return bool({"vmx", "svm"} & set(line.split(":", 1)[-1].split()))
    except OSError:
        return False
    return False


def argv(
    assets: Assets,
    *,
    workspace: Path,
    read_only: bool,
    memory_mib: int,
    cpus: int,
    chardev_fd: int,
    console: Path,
    kind: Accel,
    exports: Sequence[tuple[str, Path, bool]] = (),
    own_namespace: bool = False,
    net_fd: int | None = None,
) -> list[str]:
    qemu = qemu_path() or QEMU
    machine = "microvm,accel=kvm" if kind == "kvm" else "microvm,accel=tcg"
    cpu = "host,-cx16" if kind == "kvm" else "qemu64"
    command = [
        qemu,
        "-M", machine,
        "-cpu", cpu,
        "-m", str(memory_mib),
        "-smp", str(cpus),
        "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
        "-serial", f"file:{console}",
        "-kernel", str(assets.kernel),
        "-initrd", str(assets.initrd),
        "-append", KERNEL_ARGS,
        *_export("root", assets.rootfs, read_only=True),
        *_export("ws", workspace, read_only=read_only),
        "-device", "virtio-serial-device,max_ports=3",
        "-chardev", f"socket,id=agent,fd={chardev_fd}",
        "-device", f"virtserialport,chardev=agent,name={AGENT_PORT}",
        *(() if net_fd is None else (
            "-chardev", f"socket,id=net,fd={net_fd}",
            "-device", f"virtserialport,chardev=net,name={NET_PORT}",
        )),
        "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
    ]  # fmt: skip
    for tag, path, ro in exports:  # the scratch directory, plugin directories
        command += _export(tag, path, read_only=ro)
    if own_namespace:  # staged (sandbox.backends.microvm.pool): its binds live and die with QEMU
        command = ["unshare", "--mount", "--propagation", "private", "--", *command]
    return command


def _export(tag: str, path: Path, *, read_only: bool) -> list[str]:
    """A 9p export: QEMU's own file server, as whoever QEMU runs as (``security_model=none``)."""
    fsdev = f"local,id={tag},path={path},security_model=none,multidevs=remap" + (",readonly=on" if read_only else "")
    return ["-fsdev", fsdev, "-device", f"virtio-9p-device,fsdev={tag},mount_tag={tag}"]


_LIVE: set[Machine] = set()  # every QEMU this process started and has not killed yet
_LIVE_LOCK = threading.Lock()


@atexit.register
def _kill_all() -> None:
    """An executor that exits leaves no VM behind (one killed outright: each guest ends as its port does)."""
    with _LIVE_LOCK:
        machines = list(_LIVE)
    for vm in machines:
        vm.kill()


class Machine:
    """A started QEMU with our end of the agent's port; the console's folder is its own (made for
    it, removed with it)."""

    def __init__(
        self,
        command: list[str],
        ours: socket.socket,
        theirs: socket.socket,
        console: Path,
        owner: tuple[int, int],
        net: tuple[socket.socket | None, socket.socket | None] = (None, None),
    ) -> None:
        self.console = console
        self.sock = ours
        self.net = net[0]  # the network port's host end (an allowlist VM's), else None
        passed = [sock.fileno() for sock in (theirs, net[1]) if sock is not None]
        self._stderr: str | None = None
        self._console: str | None = None  # the console's tail, read as the VM went
        user: int | None = None
        group: int | None = None
        if os.geteuid() == 0 and owner[0] != 0:  # QEMU runs as the workspace's owner, never as root
            name = user_name(owner[0])
            if name is not None:
                # QEMU drops itself once its devices are open (-runas): the workspace's export is a
                # directory fd by then, so a path the owner cannot walk (a root-only parent) still works.
                # Its seccomp sandbox then allows the set*id calls of that drop (after it, as the
                # owner, no such call can raise it again).
                command = [part.replace("elevateprivileges=deny", "elevateprivileges=allow") for part in command]
                command += ["-runas", name]
            else:
                user, group = owner
        try:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=passed,
                start_new_session=True,
                user=user,
                group=group,
                extra_groups=[] if user is not None else None,
            )
        finally:
            for sock in (theirs, net[1]):
                if sock is not None:
                    sock.close()
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def pid(self) -> int:
        pid: int = self.proc.pid
        return pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ends_within(self, seconds: float) -> bool:
        """Whether QEMU has exited, or does within ``seconds`` (a port that just ended: killed, or
        the guest powered off, and QEMU not yet gone)."""
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stderr_tail(self) -> str:
        """What QEMU said on stderr, once it has ended (its reason for ending early)."""
        if self._stderr is None and self.proc.poll() is not None and self.proc.stderr is not None:
            with contextlib.suppress(OSError, ValueError):
                self._stderr = self.proc.stderr.read()[-2000:].decode(errors="replace").strip()
        return self._stderr or ""

    def console_tail(self, lines: int = 5) -> str:
        """The guest's last console lines (a panic's reason), kept once the VM is gone."""
        text = self._console
        if text is None:
            with contextlib.suppress(OSError):
                text = self.console.read_text(errors="replace")[-8192:]
        return "\n".join((text or "").strip().splitlines()[-lines:])

    def kill(self) -> None:
        """QEMU's process group killed and reaped: the guest, whatever it runs, is gone."""
        with _LIVE_LOCK:
            _LIVE.discard(self)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for sock in (self.sock, self.net):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # a reader of it (the network's relay) sees its end
                with contextlib.suppress(OSError):
                    sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.stderr_tail()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        if self._console is None:  # its folder (the console, a staging directory) goes with it
            self._console = self.console_tail(20)
            shutil.rmtree(self.console.parent, ignore_errors=True)


def user_name(uid: int) -> str | None:
    """``-runas``'s argument (QEMU 7.2 takes a user's name), ``None`` for a uid with no name."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def start(
    command_for: Mapping[str, object], assets: Assets, console: Path, owner: tuple[int, int], *, net: bool = False
) -> Machine:
    """QEMU started with one end of a new socketpair as the agent port's host end (and with ``net``,
    of another as the network port's: :attr:`Machine.net`)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    net_ours, net_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) if net else (None, None)
    for sock in (theirs, net_theirs):
        if sock is not None:
            os.set_inheritable(sock.fileno(), True)
    net_fd = None if net_theirs is None else net_theirs.fileno()
    command = argv(assets, chardev_fd=theirs.fileno(), console=console, net_fd=net_fd, **command_for)  # type: ignore[arg-type]
    try:
        return Machine(command, ours, theirs, console, owner, net=(net_ours, net_theirs))
    except BaseException:
        ours.close()
        for sock in (net_ours, net_theirs):
            if sock is not None:
                sock.close()
        raise
