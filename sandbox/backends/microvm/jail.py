"""A session's microVM: one guest, its agent as PID 1, the calls over the virtio-serial port.

The guest boots (:mod:`.machine`), :mod:`sandbox._jailside.vmboot` takes our word on the port (the
workspace, the seal's binds, the uid, the rlimits, the agent's program), shows the workspace and
becomes the agent of :mod:`sandbox._jailside.agent`, in the mode Docker's attach stream uses: requests
as JSON lines, the command's stdout and stderr back in frames, stdin credited in a window
(:class:`~sandbox.backends.docker.warm.FramedProcess`, which this jail's calls are). The port is a
byte stream with the kernel's socket buffers and virtio's rings between us: a full buffer on our
side stops QEMU reading the ring, which stops the agent reading the command's pipes.

The agent kills each call's tree (``kill(-1)`` as the command uid, until none is left) before it
reports the exit. If it cannot (a wedged agent, a guest that panicked, QEMU killed from outside),
the VM goes: QEMU's process group is killed, and nothing the guest ran can outlive its process.
The next call gets a new VM.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from sandbox import _jailside
from sandbox._jailside.vmboot import EMPTY_DIR, EMPTY_FILE
from sandbox.backends import seal
from sandbox.backends.agentlink import AGENT_PROGRAM, FdLink, run_request
from sandbox.backends.base import Jail
from sandbox.backends.bwrap_argv import tmp_inodes
from sandbox.backends.docker.warm import FramedProcess, SerialCalls, settled
from sandbox.backends.microvm import machine, pool
from sandbox.backends.microvm.assets import NET_PORT
from sandbox.backends.microvm.netside import TrustFiles, relay
from sandbox.envrules import SANDBOX_HOME
from sandbox.errors import BackendUnavailable
from sandbox.network.places import PORT
from sandbox.threads import soon

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from sandbox.backends.base import Process, Stdin
    from sandbox.backends.microvm.assets import Assets
    from sandbox.backends.seal import Seal
    from sandbox.mounts import CopyTree
    from sandbox.network.egress import Egress
    from sandbox.profile import Profile

BOOT_WAIT_S = {"kvm": 10.0, "tcg": 60.0}  # the agent's word after ours (the boot is over by then)
GUEST_OVERHEAD_MIB = 160  # the guest kernel, its page cache and the agent, beside what commands may use
MIN_MEMORY_MIB = 256
LOST_WAIT_S = 2.0  # a port that ended: QEMU's exit, if it is going, comes within this
RLIMITS = {"file_size": "RLIMIT_FSIZE", "nofile": "RLIMIT_NOFILE", "cpu_time_s": "RLIMIT_CPU"}
RELAY_UID = 65534  # the guest's relay runs as nobody (as 65533 if nobody is the command's uid)


class VMLink(FdLink):
    """Our end of the agent's port: frames in, requests out; ``s`` once the agent runs, ``!`` if it cannot."""

    stream = "vm"

    def __init__(self, sock: Any) -> None:
        self.refusal: str | None = None
        super().__init__(sock, "microvm-agent")

    def _said(self, kind: bytes, payload: bytes) -> None:
        if kind == b"!":
            self.refusal = payload.decode(errors="replace")
        if kind in (b"s", b"!"):
            self.hello.set()


class Guest:
    """One running VM: the ``runtime`` a :class:`FramedProcess` names (``id``, ``running``)."""

    def __init__(self, vm: machine.Machine, link: VMLink) -> None:
        self.vm = vm
        self.link = link
        self.id = f"microvm-{vm.pid}"
        self.removed = False
        self.bundled = False  # booted with the session's CA bundle over the system one

    def running(self) -> list[int]:
        return []  # the guest's processes are not the host's: none of them is a host pid

    def remove(self) -> None:
        self.removed = True
        self.link.close()
        self.vm.kill()

    def ended_why(self) -> str:
        tail = self.vm.console_tail(3)
        qemu = self.vm.stderr_tail()
        why = [part for part in (qemu, tail) if part]
        return "; ".join(why)[-600:]


class MicroVMJail(SerialCalls, Jail):
    backend = "microvm"

    def __init__(
        self,
        workspace: Path,
        profile: Profile,
        source: Path,
        tree: CopyTree | None,
        owner: tuple[int, int],
        assets: Assets,
        sealed: Seal,
        exports: Sequence[tuple[Path, str, bool]] = (),
        shared: Sequence[tuple[str, str]] = (),
        egress: Egress | None = None,
        trust: TrustFiles | None = None,
    ) -> None:
        self.workspace = workspace
        self.egress = egress  # an allowlist's proxy: the guest's connections go to it (relay)
        self._trust = trust  # the session CA's files, one of the exports
        self.profile = profile
        self.tree = tree
        self.owner = owner
        self._source = source
        self._assets = assets
        self._sealed = sealed
        self._shared = tuple(shared)
        # The seal is searched again before each call (seal.Watch): when it moved, the guest that was
        # told the old one is destroyed and the next call boots one told the new one.
        self._watch = seal.watch(profile, workspace, source, tree, sealed, self._shared)
        # (host directory, guest path, read-only), each a 9p export of its own: tags x0, x1, ...
        self._exports = [(f"x{n}", host, guest, ro) for n, (host, guest, ro) in enumerate(exports)]
        self._accel, self.accel_note = machine.accel()
        self._guest: Guest | None = None
        SerialCalls.__init__(self)
        self.leftover: Path | None = None  # a directory of ours to remove once the copy in it is gone

    # -- the guest

    @property
    def guest(self) -> Guest | None:
        return self._guest

    async def start(self) -> None:
        self._guest = await self._boot()

    def _word(self) -> tuple[dict[str, Any], bytes]:
        limits = self.profile.limits
        rlimits = {RLIMITS[name]: getattr(limits, name) for name in RLIMITS if getattr(limits, name) is not None}
        rw = self.mount != "ro"
        # The workspace's secrets masked (a copy's too: what a call writes at a masked path stays
        # covered), git's paths read-only in rw; the plugin directories' secrets masked as well
        # (the directories themselves are exports).
        binds = seal.binds(str(self.workspace), self._sealed, EMPTY_DIR, EMPTY_FILE, rw=self.mount == "rw")
        masks = seal.shared_binds(self._shared, self.profile.policy.deny_read, EMPTY_DIR, EMPTY_FILE)
        binds += [bind for bind in masks if bind[0] in (EMPTY_DIR, EMPTY_FILE)]
        binds += self._trust.bundle_bind() if self._trust is not None else []
        program = AGENT_PROGRAM.encode()
        word = {
            "uid": self.owner[0],
            "gid": self.owner[1],
            "workspace": str(self.workspace),
            "mode": "rw" if rw else "ro",
            "binds": [list(bind) for bind in binds],
            "exports": [[tag, guest, ro] for tag, _host, guest, ro in self._exports],
            "dirs": [SANDBOX_HOME],
            "tmp_size": str(limits.tmp_size or 256 << 20),
            "tmp_inodes": tmp_inodes(limits.tmp_size or 256 << 20),  # an inode flood stops where bwrap's does
            "rlimits": rlimits,
            "memory": limits.memory,
            "pids": limits.pids,
            "argv": ["", ""],
            "program": len(program),
        }
        if self.egress is not None:  # the relay's program follows the agent's
            relay_program = _jailside.program("vmnet", "netfwd").encode()
            word["net"] = {
                "port": NET_PORT,
                "uid": RELAY_UID if self.owner[0] != RELAY_UID else RELAY_UID - 1,
                "listen": [f"127.0.0.1:{PORT}", f"[::1]:{PORT}"],
                "program": len(relay_program),
            }
            program += relay_program
        return word, program

    def _machine_size(self) -> tuple[int, int]:
        limits = self.profile.limits
        memory = MIN_MEMORY_MIB if limits.memory is None else max(MIN_MEMORY_MIB, int(limits.memory) >> 20)
        cpus = max(1, min(os.cpu_count() or 1, round(limits.cpus))) if limits.cpus else 1
        return memory + GUEST_OVERHEAD_MIB, cpus

    def _kind(self) -> pool.Kind:
        memory, cpus = self._machine_size()
        return pool.Kind(self.owner, memory, cpus, self._accel, str(self._assets.kernel), self.egress is not None)

    def _booted(self, kind: pool.Kind) -> pool.Booted:
        """A VM at its first word: the pool's (staged), else one booted now (blocking)."""
        if pool.staged(self.owner[0]):
            pooled = pool.POOL.take(kind)
            if pooled is not None:
                try:
                    return self._staged(pooled)
                except OSError:  # its mount namespace predates a mount the session's directories lie under
                    pass
            return self._staged(pool.boot(self._assets, kind))
        exports = [(tag, host, ro) for tag, host, _guest, ro in self._exports]
        # An ordinary user's VM exports the session's directories from its start (no mounts).
        return pool.boot(self._assets, kind, self._source, exports)

    def _staged(self, booted: pool.Booted) -> pool.Booted:
        """``booted`` with the session's directories in its export (bound in QEMU's own mount
        namespace); discarded if one cannot be."""
        try:
            pool.stage(booted, "ws", self._source, self.mount == "ro", self.owner)
            for tag, host, _guest, ro in self._exports:
                pool.stage(booted, tag, host, ro, self.owner)
        except BaseException:
            booted.discard()
            raise
        return booted

    async def _boot(self) -> Guest:
        kind = self._kind()
        try:
            booted = await anyio.to_thread.run_sync(self._booted, kind)
        except (pool.BootFailed, OSError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise BackendUnavailable(f"the microVM did not start: {why}", backend="microvm") from exc
        vm = booted.vm
        guest = Guest(vm, VMLink(vm.sock))
        guest.bundled = self._trust is not None and self._trust.bundled
        with contextlib.ExitStack() as cleanup_on_fail:
            cleanup_on_fail.callback(guest.remove)
            if self.egress is not None:
                relay(vm, self.egress)
            word, program = self._word()
            word["staged"] = booted.staging is not None
            await anyio.to_thread.run_sync(guest.link.sock.sendall, json.dumps(word).encode() + b"\n" + program)
            wait = BOOT_WAIT_S[self._accel]
            said = await anyio.to_thread.run_sync(guest.link.hello.wait, wait, abandon_on_cancel=True)
            if guest.link.refusal is not None or guest.link.dead or not said:
                why = guest.link.refusal or (
                    f"the guest did not start within {wait:.0f}s" if not said else "the guest ended as it started"
                )
                await anyio.to_thread.run_sync(vm.kill)
                ended = guest.ended_why()
                raise BackendUnavailable(
                    f"the microVM did not start: {why}" + (f" ({ended})" if ended else ""), backend="microvm"
                )
            cleanup_on_fail.pop_all()
        pool.POOL.refill(self._assets, kind)  # the next session's VM boots while this one works
        return guest

    async def _resealed(self) -> bool:
        """Search the seal again before a call (cached, cheap); say whether it moved."""
        sealed = await soon(self._watch.changed, inline=self._watch.quick)
        if sealed is None:
            return False
        self._sealed = sealed
        return True

    async def _ready(self) -> Guest:
        pending, self._pending = self._pending, None
        if await settled(pending) is False and self._guest is not None:
            await self.discard(self._guest)
        guest = self._guest
        resealed = await self._resealed()  # a secret appeared (or went) since the guest was told
        if self._trust is not None:  # a live change of the secrets rewrote the CA's files
            self._trust.sync()  # on the loop: a scandir of a few entries, copies only after a change
            resealed = resealed or (guest is not None and self._trust.bundled and not guest.bundled)
        if guest is not None and (resealed or guest.removed or guest.link.dead or guest.link.retired):
            await self.discard(guest)
        if self._guest is None:
            self._guest = await self._boot()
        return self._guest

    # -- calls

    async def _start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: Stdin,
        runner: bool = False,  # noqa: ARG002
    ) -> Process:
        # The runner runs as a program in the guest (the agent serves none inline over a byte stream).
        await self._slot.acquire()
        with contextlib.ExitStack() as cleanup_on_fail:
            cleanup_on_fail.callback(self._slot.release)
            guest = await self._ready()
            request, _ = run_request(self.profile, self.workspace, argv, env, cwd, stdin, runner=False, inline=False)
            proc = VMCall(self, guest, guest.link, stdin)  # type: ignore[arg-type]
            request["id"] = proc.id
            try:
                await anyio.to_thread.run_sync(guest.link.send, request)
            except OSError as exc:
                proc.forget()
                proc._close_streams()
                raise BackendUnavailable(
                    f"cannot start the command in the microVM: {exc.strerror or exc}", backend="microvm"
                ) from exc
            cleanup_on_fail.pop_all()
        self._held = proc
        return proc

    async def discard(self, runtime: Guest) -> None:
        if self._guest is runtime:
            self._guest = None
        if not runtime.removed:
            await anyio.to_thread.run_sync(runtime.remove)

    async def agent_lost(self, proc: FramedProcess) -> None:
        guest: Guest = proc.runtime  # type: ignore[assignment]
        alive = not await anyio.to_thread.run_sync(guest.vm.ends_within, LOST_WAIT_S)
        await self.discard(guest)
        why = guest.ended_why()
        what = "the microVM's agent stopped answering" if alive else "the microVM ended (QEMU exited)"
        raise BackendUnavailable(
            f"{what} during the call; its exit status is unknown" + (f": {why}" if why else ""),
            backend="microvm",
            vm=guest.id,
        )

    async def _shutdown(self) -> None:
        if self._held is not None:
            self._held.release()
        guest, self._guest = self._guest, None
        if guest is not None and not guest.removed:
            await anyio.to_thread.run_sync(guest.remove)

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            if self.leftover is not None:
                shutil.rmtree(self.leftover, ignore_errors=True)
            if self._trust is not None:
                self._trust.remove()


class VMCall(FramedProcess):
    """A call in the guest: the attach stream's frames, over the port."""

    backend = "microvm"
    agent = "the microVM's agent"
