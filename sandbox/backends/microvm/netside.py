"""The host's half of a microVM's allowlist network: the relay to the proxy, the session CA's files.

A microVM has no network device. Its guest's connections come over a virtio-serial port of their
own (:mod:`sandbox._jailside.vmnet`, whose :class:`~sandbox._jailside.vmnet.Mux` is both halves);
:func:`relay` connects each one to the session's filtering proxy, on a thread of ours until the
port ends. With a broker (``[secrets]``, request rules) the guest must also trust the session's CA:
:class:`TrustFiles` copies the CA's files out of the proxy's socket directory into a directory of
the VM's own, exported read-only at :data:`~sandbox.network.places.JAIL_DIR`, where the variables
of :meth:`Egress.env <sandbox.network.egress.Egress.env>` name them. QEMU reads that copy as the
workspace's owner; the proxy's socket itself is never shown to it, nor opened to its uid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox._jailside.vmnet import Mux
from sandbox.network.places import BUNDLE_FILE, JAIL_DIR, SOCKET, SYSTEM_BUNDLE

if TYPE_CHECKING:
    from sandbox.backends.microvm.machine import Machine
    from sandbox.network.egress import Egress


def relay(vm: Machine, egress: Egress) -> None:
    """Each connection the guest opens, connected to the egress proxy's unix socket, on a thread
    until the port ends (the VM's :meth:`~sandbox.backends.microvm.machine.Machine.kill` shuts it)."""
    assert vm.net is not None
    folder = egress.socket_dir

    def connect() -> socket.socket:
        if folder is None or not egress.alive:
            raise OSError("the egress proxy has stopped")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(folder / SOCKET))
        except BaseException:
            sock.close()
            raise
        return sock

    fd = os.dup(vm.net.fileno())  # ours to close once the reader is done: no descriptor closed under it

    def serve() -> None:
        try:
            Mux(fd, connect).serve()
        finally:
            os.close(fd)

    threading.Thread(target=serve, name=f"microvm-net-{vm.pid}", daemon=True).start()


class TrustFiles:
    """The session CA's files for one jail: :meth:`sync` before each call (a live change of the
    secrets rewrites them), :meth:`remove` with the jail."""

    def __init__(self, egress: Egress, owner: tuple[int, int]) -> None:
        self._egress = egress
        self.folder = Path(tempfile.mkdtemp(prefix="sbx-vm-trust-"))  # QEMU (the owner) cannot enter ours
        self.folder.chmod(0o755)
        if os.geteuid() == 0:
            os.chown(self.folder, *owner)
        self._seen: dict[str, tuple[int, int]] = {}
        self.sync()

    def sync(self) -> None:
        """Copy what changed in the proxy's socket directory (its files, never its socket)."""
        source = self._egress.socket_dir
        if source is None:
            return
        for entry in os.scandir(source):
            if entry.name == SOCKET or not entry.is_file(follow_symlinks=False):
                continue
            stat = entry.stat(follow_symlinks=False)
            if self._seen.get(entry.name) == (stat.st_mtime_ns, stat.st_size):
                continue
            staged = self.folder / f".{entry.name}.new"
            shutil.copyfile(entry.path, staged)
            staged.chmod(0o444)
            staged.replace(self.folder / entry.name)
            self._seen[entry.name] = (stat.st_mtime_ns, stat.st_size)

    @property
    def bundled(self) -> bool:
        """Whether the session's CA bundle is here (bound over the guest's system bundle at its boot)."""
        return (self.folder / BUNDLE_FILE).is_file()

    def export(self) -> tuple[Path, str, bool]:
        return self.folder, JAIL_DIR, True

    def bundle_bind(self) -> list[tuple[str, str, bool]]:
        """The guest's bind of the session bundle over its system one (tools that read no variable)."""
        return [(f"{JAIL_DIR}/{BUNDLE_FILE}", SYSTEM_BUNDLE, True)] if self.bundled else []

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            shutil.rmtree(self.folder)
