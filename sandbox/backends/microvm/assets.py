"""What a microVM boots: a Debian kernel, a small initramfs and the image's root file system.

Built offline from Debian packages, once, into the image cache (:func:`sandbox.image.cache_dir`):

* **the kernel**: ``linux-image-amd64``'s kernel package, fetched with ``apt-get download`` and
  unpacked with ``dpkg-deb``; its compressed ``vmlinuz`` is unpacked to the ELF ``vmlinux``, which
  QEMU starts at its PVH entry point (no real-mode set-up code: that is what nested
  virtualisation handles worst).
* **the initramfs**: ``busybox-static``'s busybox, the virtio, virtio-serial, 9p and overlay
  modules of that kernel, :data:`INIT` and :mod:`sandbox._jailside.vmboot`, written as a newc
  cpio archive by :func:`cpio` (no ``cpio`` tool needed).
* **the root file system**: the Docker image's debootstrap rootfs (:func:`sandbox.image.rootfs_tarball`,
  the same packages as ``sandbox-runtime``), unpacked into a directory the guest mounts read-only
  over 9p, under a tmpfs overlay that holds its mount points and is then made read-only too.

:func:`ensure` builds what is missing (as root: debootstrap needs it) and returns the paths;
:func:`find` only looks. Everything is keyed by the kernel's version and a hash of the init's
and the boot program's text, so a new product version never boots an old initramfs.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

from sandbox import _jailside, image
from sandbox.imagehost import BuildError, is_root, log

KERNEL_META = "linux-image-amd64"
BUSYBOX = "busybox-static"
# Loaded in this order by the init (each after what it depends on).
MODULES = (
    "kernel/drivers/virtio/virtio_ring.ko",
    "kernel/drivers/virtio/virtio.ko",
    "kernel/drivers/virtio/virtio_mmio.ko",
    "kernel/drivers/char/virtio_console.ko",
    "kernel/fs/netfs/netfs.ko",
    "kernel/fs/fscache/fscache.ko",
    "kernel/net/9p/9pnet.ko",
    "kernel/net/9p/9pnet_virtio.ko",
    "kernel/fs/9p/9p.ko",
    "kernel/fs/overlayfs/overlay.ko",
)
AGENT_PORT = "sandbox.agent"  # the virtio-serial port's name (QEMU's virtserialport name=)
NET_PORT = "sandbox.net"  # an allowlist VM's second port: its connections to the egress proxy

INIT = r"""#!/bin/busybox sh
# The microVM's init (sandbox.backends.microvm.assets): modules, the image's root read-only
# under a tmpfs overlay, the agent's port as fds 0 and 1, then vmboot as PID 1.
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
for m in $(cat /modules); do $B insmod "/lib/modules/$m" || { echo "init: insmod $m failed"; $B poweroff -f; }; done
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 root /lower || $B poweroff -f
$B mount -t tmpfs -o mode=0755,size=16m rw /rw
$B mkdir -p /rw/upper /rw/work
$B mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work root /newroot || $B poweroff -f
port=
for try in $($B seq 200); do  # the port shows once the device's control queue has named it
  for p in /sys/class/virtio-ports/*; do
    [ "$($B cat "$p/name" 2>/dev/null)" = "__PORT__" ] && port=/newroot/dev/${p##*/}
  done
  [ -n "$port" ] && break
  $B usleep 20000
done
[ -n "$port" ] || { echo "init: no agent port"; $B poweroff -f; }
$B mount --move /dev /newroot/dev
$B mount --move /proc /newroot/proc
$B mount --move /sys /newroot/sys
$B ip link set lo up
boot=$($B cat /vmboot.py)
exec $B switch_root /newroot /usr/bin/python3 -I -S -c "$boot" <>"$port" >&0 2>/newroot/dev/console
""".replace("__PORT__", AGENT_PORT)


class Assets(NamedTuple):
    kernel: Path  # the ELF vmlinux
    initrd: Path
    rootfs: Path
    version: str  # the kernel's


def _text_key() -> str:
    digest = hashlib.sha256(INIT.encode())
    digest.update(_jailside.source("vmboot").encode())
    digest.update("\n".join(MODULES).encode())
    return digest.hexdigest()[:12]


def _home() -> Path:
    return image.cache_dir() / "microvm"


def find() -> Assets | None:
    """The built assets of this version, or ``None``."""
    home = _home()
    marker = home / f"current-{_text_key()}"
    try:
        version, root_key = marker.read_text().split()
    except (OSError, ValueError):
        return None
    found = Assets(
        home / f"vmlinux-{version}", home / f"initrd-{version}-{_text_key()}.gz", home / f"rootfs-{root_key}", version
    )
    if not all(path.exists() for path in found[:3]):
        return None
    return found


def ensure() -> Assets:
    """The assets, built where missing (the first time: a few minutes and a download)."""
    found = find()
    if found is not None:
        return found
    home = _home()
    home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home, prefix="build-") as tmp:
        work = Path(tmp)
        package = _kernel_package()
        kernel_dir = _unpack(package, work / "kernel")
        version = package.removeprefix("linux-image-")
        vmlinux = home / f"vmlinux-{version}"
        if not vmlinux.exists():
            _vmlinux(next((kernel_dir / "boot").glob("vmlinuz-*")), vmlinux)
        busybox = _unpack(BUSYBOX, work / "busybox") / "bin" / "busybox"
        initrd = home / f"initrd-{version}-{_text_key()}.gz"
        modules = next((kernel_dir / "lib" / "modules").iterdir())
        _initrd(initrd, busybox, modules)
    root_key = image.rootfs_key()
    rootfs = home / f"rootfs-{root_key}"
    if not rootfs.exists():
        _rootfs(image.rootfs_tarball(), rootfs)
    (home / f"current-{_text_key()}").write_text(f"{version} {root_key}\n")
    for stale in (*home.glob("current-*"), *home.glob("initrd-*")):  # what older versions booted
        if _text_key() not in stale.name:
            stale.unlink(missing_ok=True)
    found = find()
    assert found is not None
    log(f"microVM assets ready in {home}")
    return found


def _kernel_package() -> str:
    """The kernel package ``linux-image-amd64`` stands for (``linux-image-6.1.0-50-amd64``)."""
    done = subprocess.run(["apt-cache", "depends", KERNEL_META], capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        name = line.strip().removeprefix("Depends:").strip()
        if name.startswith("linux-image-") and name != KERNEL_META:
            return name
    raise BuildError(f"apt does not know {KERNEL_META}: {done.stderr.strip() or 'no such package'}")


def _unpack(package: str, target: Path) -> Path:
    target.mkdir(parents=True)
    log(f"apt-get download {package}")
    done = subprocess.run(["apt-get", "download", package], cwd=target, capture_output=True, text=True, check=False)
    debs = list(target.glob("*.deb"))
    if done.returncode != 0 or not debs:
        raise BuildError(f"apt-get download {package} failed: {done.stderr.strip()[-500:]}")
    tree = target / "tree"
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(tree)], check=True)
    debs[0].unlink()
    return tree


def _vmlinux(vmlinuz: Path, target: Path) -> None:
    """The ELF kernel inside an xz-compressed bzImage (Debian's)."""
    data = vmlinuz.read_bytes()
    start = data.find(b"\xfd7zXZ\x00")
    if start < 0:
        raise BuildError(f"{vmlinuz} holds no xz-compressed kernel")
    elf = lzma.LZMADecompressor().decompress(data[start:])
    if not elf.startswith(b"\x7fELF"):
        raise BuildError(f"{vmlinuz} did not unpack to an ELF kernel")
    partial = target.with_suffix(".partial")
    partial.write_bytes(elf)
    partial.replace(target)


def _initrd(target: Path, busybox: Path, modules: Path) -> None:
    entries: list[tuple[str, int, bytes]] = [
        (name, stat.S_IFDIR | 0o755, b"")
        for name in ("bin", "dev", "proc", "sys", "lower", "rw", "newroot", "lib", "lib/modules")
    ]
    entries.append(("bin/busybox", stat.S_IFREG | 0o755, busybox.read_bytes()))
    names = []
    for rel in MODULES:
        path = modules / rel
        if not path.exists():
            raise BuildError(f"the kernel package has no {rel}")
        names.append(path.name)
        entries.append((f"lib/modules/{path.name}", stat.S_IFREG | 0o644, path.read_bytes()))
    entries.append(("modules", stat.S_IFREG | 0o644, " ".join(names).encode()))
    entries.append(("init", stat.S_IFREG | 0o755, INIT.encode()))
    entries.append(("vmboot.py", stat.S_IFREG | 0o644, _jailside.source("vmboot").encode()))
    partial = target.with_suffix(".partial")
    with gzip.open(partial, "wb", compresslevel=1) as out:
        out.write(cpio(entries))
    partial.replace(target)


def cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of ``(name, mode, data)`` entries, owned by root."""
    out = io.BytesIO()

    def record(ino: int, name: str, mode: int, data: bytes) -> None:
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out.write(b"070701" + b"".join(b"%08X" % value for value in fields))
        out.write(encoded)
        out.write(b"\0" * (-(110 + len(encoded)) % 4))
        out.write(data)
        out.write(b"\0" * (-len(data) % 4))

    for ino, (name, mode, data) in enumerate(entries, start=1):
        record(ino, name, mode, data)
    record(0, "TRAILER!!!", 0, b"")
    return out.getvalue()


def _rootfs(tarball: Path, target: Path) -> None:
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    argv = ["tar", "-C", str(partial), "-xf", str(tarball)]
    if is_root():
        argv.insert(1, "--numeric-owner")
    subprocess.run(argv, check=True)
    for name in ("proc", "sys", "dev", "tmp", "run"):
        (partial / name).mkdir(exist_ok=True)
    os.chmod(partial, 0o755)
    partial.rename(target)
