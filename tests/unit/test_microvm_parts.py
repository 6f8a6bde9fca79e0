"""The microvm backend's pure parts: the initramfs's cpio, QEMU's command line, the pool's bookkeeping.

The VMs themselves are tests/integration/test_microvm.py's.
"""

from __future__ import annotations

import stat
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox.backends.microvm import assets, machine, pool

if TYPE_CHECKING:
    import pytest


def _read_cpio(data: bytes) -> dict[str, tuple[int, bytes]]:
    """name -> (mode, data) of a newc archive, as the kernel reads it."""
    found: dict[str, tuple[int, bytes]] = {}
    offset = 0
    while True:
        assert data[offset : offset + 6] == b"070701"
        fields = [int(data[offset + 6 + 8 * i : offset + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        name_at = offset + 110
        name = data[name_at : name_at + namesize - 1].decode()
        body_at = name_at + namesize + (-(110 + namesize) % 4)
        if name == "TRAILER!!!":
            return found
        found[name] = (mode, data[body_at : body_at + size])
        offset = body_at + size + (-size % 4)


def test_the_initramfs_archive_is_what_the_kernel_reads() -> None:
    entries = [
        ("bin", stat.S_IFDIR | 0o755, b""),
        ("bin/busybox", stat.S_IFREG | 0o755, b"\x7fELF" + b"x" * 1001),
        ("init", stat.S_IFREG | 0o755, assets.INIT.encode()),
    ]
    found = _read_cpio(assets.cpio(entries))
    assert found == {name: (mode, data) for name, mode, data in entries}


def test_the_init_finds_the_agent_port_by_name_and_powers_off_on_any_failure() -> None:
    assert f'= "{assets.AGENT_PORT}" ]' in assets.INIT
    assert assets.INIT.count("poweroff -f") >= 4
    assert "switch_root /newroot /usr/bin/python3 -I -S" in assets.INIT


def _argv(tmp_path: Path, **kw: Any) -> list[str]:
    found = assets.Assets(tmp_path / "vmlinux", tmp_path / "initrd", tmp_path / "rootfs", "6.1")
    spec: dict[str, Any] = {
        "workspace": tmp_path / "ws",
        "read_only": False,
        "memory_mib": 512,
        "cpus": 1,
        "chardev_fd": 7,
        "console": tmp_path / "console.log",
        "kind": "tcg",
        **kw,
    }
    return machine.argv(found, **spec)


def test_the_machine_has_no_network_device_and_qemu_sandboxes_itself(tmp_path: Path) -> None:
    argv = _argv(tmp_path)
    text = " ".join(argv)
    assert "-nodefaults" in argv and "-no-reboot" in argv
    assert "-netdev" not in argv and "-nic" not in argv and "virtio-net" not in text
    assert argv[argv.index("-sandbox") + 1].startswith("on,obsolete=deny,elevateprivileges=deny,spawn=deny")
    assert "socket,id=agent,fd=7" in argv  # a socketpair's end: no path anyone could connect to
    fsdevs = [argv[i + 1] for i, part in enumerate(argv) if part == "-fsdev"]
    assert fsdevs[0].startswith("local,id=root,") and "readonly=on" in fsdevs[0]
    assert fsdevs[1].startswith("local,id=ws,") and "readonly=on" not in fsdevs[1]


def test_ro_exports_the_workspace_read_only_and_staging_runs_qemu_in_its_own_namespace(tmp_path: Path) -> None:
    argv = _argv(tmp_path, read_only=True, exports=[("x0", tmp_path / "scratch", False)], own_namespace=True)
    fsdevs = [argv[i + 1] for i, part in enumerate(argv) if part == "-fsdev"]
    assert "readonly=on" in fsdevs[1] and fsdevs[2].startswith("local,id=x0,") and "readonly" not in fsdevs[2]
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]


def test_the_acceleration_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(machine.ACCEL_ENV, "tcg")
    assert machine.accel() == ("tcg", f"{machine.ACCEL_ENV}=tcg")


def test_a_cpu_without_vmx_or_svm_is_not_a_hardware_kvm(tmp_path: Path) -> None:
    # A paravirtual /dev/kvm (PVM) on a CPU that shows neither flag runs only PVM-built kernels:
    # Debian's crawls there, so the machine must be emulated instead.
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu vme hypervisor lm\n")
    assert not machine.cpu_virtualises(str(info))
    info.write_text("processor\t: 0\nflags\t\t: fpu vmx lm\n")
    assert machine.cpu_virtualises(str(info))
    assert not machine.cpu_virtualises(str(tmp_path / "absent"))


def test_the_pool_boots_ahead_only_for_a_kind_asked_for_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    booted: list[pool.Kind] = []
    done = threading.Event()

    class FakeVM:
        pid = 4242
        sock = None

        def alive(self) -> bool:
            return True

        def kill(self) -> None:
            pass

    def fake_boot(_assets: object, kind: pool.Kind) -> pool.Booted:
        booted.append(kind)
        done.set()
        return pool.Booted(FakeVM(), Path("/nonexistent/stage"))  # type: ignore[arg-type]

    monkeypatch.setattr(pool, "staged", lambda _uid: True)
    monkeypatch.setattr(pool, "boot", fake_boot)
    monkeypatch.setattr(pool, "peer_closed", lambda _sock: False)
    monkeypatch.delenv(pool.POOL_ENV, raising=False)
    spares = pool.Pool()
    kind = pool.Kind((1000, 1000), 512, 1, "tcg", "vmlinux")
    spares.refill(None, kind)  # type: ignore[arg-type]
    assert not done.wait(0.2) and spares.take(kind) is None  # once: a one-shot run boots nothing ahead
    spares.refill(None, kind)  # type: ignore[arg-type]
    assert done.wait(5)
    for _ in range(100):
        taken = spares.take(kind)
        if taken is not None:
            break
        threading.Event().wait(0.02)
    assert taken is not None and booted == [kind]
    spares.close()
