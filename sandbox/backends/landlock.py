"""The Landlock backend: a jail for hosts where namespaces cannot be had.

bubblewrap needs unprivileged user namespaces, which an unprivileged container, Ubuntu 24.04's
AppArmor default and hardened hosts refuse. Landlock needs nothing: an unprivileged process
restricts itself, and what it starts inherits the restriction. Each call starts our launcher
(:mod:`sandbox._jailside.landlock`) on the host, held until it is in the call's cgroups with its
rlimits; it then drops every privilege, restricts itself and loads the seccomp filter, and runs
the command as its child, adopting every orphan of it (a subreaper), so that nothing the call
starts can outlive it: when the command ends, or the host kills the call, the launcher's
``kill(-1)`` reaches exactly its own jail (Landlock scopes signals to the jail, ABI 6).

**What the command may touch** (every right this kernel's Landlock knows is handled; only these
paths get any, each by its real path, symlinks never granted):

- the system directories, read and execute; ``/etc`` read, but not what only its owner may read
  (shadow, private keys: the jail may run as root); ``/proc`` read (other processes' environ,
  fds and memory stay refused: Landlock keeps the jail from ptrace-reading what is outside it);
  a few devices (``/dev/null``, ``zero``, ``full``, ``random``, ``urandom``);
- the workspace: ``ro`` read, with the masked secrets left out (their names still list);
  ``rw`` everything, and only when nothing in it is sealed (a secret to hide, a ``.git`` whose
  hooks and config must stay read-only): Landlock grants a tree whole and cannot take part of it
  back, so such a workspace is refused, never weakened: use ``copy``, ``ro`` or another backend;
- ``copy``: the private copy (the masked secrets left out, their places empty), everything. With
  no mount namespace it cannot be shown at the workspace's path: the jail sees it at its own, its
  commands start there, and the file tools' paths are translated both ways (:meth:`LandlockJail.to_view`,
  :meth:`~LandlockJail.from_view`); a command naming the workspace's own path is refused by the
  rules. The changeset and its guarded apply are every backend's;
- the session's scratch directory, and a private directory of its own (``HOME`` and ``TMPDIR``;
  ``/tmp`` itself is not writable).

``overlay`` is refused (no mount namespace).

**Network**: TCP ``bind`` and ``connect`` are Landlock's to refuse (ABI 4); ``none`` allows neither,
``allowlist`` allows ``connect`` to the egress proxy's port only, which listens on this host's
loopback. The seccomp filter's ``landlock`` variant refuses every other socket: UDP, raw,
netlink, ``AF_UNIX`` (Landlock does not yet confine connecting to a socket file such as
``/var/run/docker.sock``), and TCP fast open (a connect by ``sendto``).

**What it does not cover**, with no pid, mount or network namespace: the command sees the host's
process list and other processes' command lines in ``/proc``, the host's network interfaces and
connections (``/proc/net``), and which paths exist (``stat`` needs no right); a port number is
allowed on every address, not only loopback's. ``sandbox check`` says so.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import stat
import tempfile
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio

from sandbox import _jailside, datadir
from sandbox._jailside import landlock as launcher
from sandbox.backends import (
    bwrap_argv,
    cgroups,
    confine,
    jailpython,
    landlock_audit,
    landlock_spare,
    local,
    seal,
    seccomp,
)
from sandbox.backends.base import Backend
from sandbox.backends.child import Child
from sandbox.backends.environment import base_env, host_files
from sandbox.errors import BackendUnavailable, GuaranteeUnavailable, InvalidArgument
from sandbox.guarantees import Report
from sandbox.mounts import CopyTree
from sandbox.threads import off_loop

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from sandbox.network.egress import Egress
    from sandbox.profile import Profile
    from sandbox.snapshots import Snapshot

MOUNTS = ("ro", "rw", "copy")
MIN_ABI = launcher.MIN_ABI
"""Signals scoped to the jail (Linux 6.12): without it, a command could signal every process of
its user, the executor's among them (there is no pid namespace to keep it in)."""
# /dev/tty: every call is a new session with no controlling terminal, so it opens to ENXIO (as
# bash tries at its start); refused by the rules instead, each shell would log a denial.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
READ_ONLY = ("/proc", "/sys/devices/system/cpu")
START_TIMEOUT_S = 20.0
_STATUS_SHOWN = 4096


@cache
def _program() -> str:
    return _jailside.program("landlock")


def abi() -> int:
    """Landlock's ABI version on this kernel (0: none)."""
    return launcher.abi()


@cache
def etc_readable() -> tuple[tuple[str, str], ...]:
    """What of ``/etc`` the jail may read: every entry others may read, where only its owner may read
    some below it (a jail may run as root, the owner); a tree with nothing private is granted whole."""
    return tuple(_readable_parts("/etc"))


def _readable_parts(root: str) -> list[tuple[str, str]]:
    private: list[str] = []
    pending = [root]
    while pending:
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        continue
                    if not st.st_mode & stat.S_IROTH:
                        private.append(os.path.relpath(entry.path, root))
                    elif stat.S_ISDIR(st.st_mode):
                        pending.append(entry.path)
    return split(root, private, "ro")


Nested: TypeAlias = "dict[str, Nested]"


def split(root: str, hidden: Iterable[str], mode: str) -> list[tuple[str, str]]:
    """Rules giving ``mode`` on all of ``root`` but the ``hidden`` relative paths.

    Landlock grants a tree whole, so the directories on the way to a hidden path get ``list``
    only (their names show, their files do not), and each other entry its own rule. Symlinks
    get none: a rule on one would grant its target, wherever it points.
    """
    tree: Nested = {}
    for rel in hidden:
        node = tree
        for part in Path(rel).parts:
            node = node.setdefault(part, {})
    if not tree:
        return [(root, mode)]
    rules: list[tuple[str, str]] = []
    pending: list[tuple[str, Nested]] = [(root, tree)]
    while pending:
        folder, node = pending.pop()
        rules.append((folder, "list"))
        with os.scandir(folder) as entries:
            for entry in entries:
                below = node.get(entry.name)
                if below == {} or entry.is_symlink():
                    continue  # hidden, or a link
                if below is None:
                    rules.append((entry.path, mode))
                elif entry.is_dir(follow_symlinks=False):
                    pending.append((entry.path, below))
    return rules


class LandlockJail(local.LocalJail):
    backend = "landlock"

    def __init__(
        self,
        workspace: Path,
        profile: Profile,
        private: Path,
        scratch: Path | None,
        shared: Sequence[tuple[str, str]] = (),
        tree: CopyTree | None = None,
        audit: landlock_audit.AuditReader | None = None,
    ) -> None:
        super().__init__(workspace, profile, tree)
        self._audit = audit  # each call's denials read back from the kernel's audit log, where it can be
        # Where the jail sees the workspace: the workspace itself, or (copy) the private copy at its
        # own path, which no mount namespace can move to the workspace's.
        self.view = tree.root if tree is not None else workspace
        self.private = private
        self.home, self.tmp = private / "home", private / "tmp"
        self._scratch = scratch
        self._shared = tuple(host for host, _ in shared)
        self.python = jailpython.host_python()
        self._seccomp = seccomp.filter_path("landlock")
        self._ahead = landlock_spare.Ahead(self._spawn, self._pool)  # the next call's launcher, started ahead

    @property
    def host_paths_shown(self) -> tuple[str, ...]:
        return (str(self.view), *(os.path.realpath(d) for d in bwrap_argv.SYSTEM_DIRS), "/etc")

    def to_view(self, path: str) -> str:
        """A workspace path as the jail sees it (copy: in the private copy)."""
        return _moved(path, str(self.workspace), str(self.view))

    def from_view(self, text: str) -> str:
        """What the jail said, with the private copy's paths named as the workspace's."""
        return _moved(text, str(self.view), str(self.workspace), anywhere=True)

    def spec(self) -> dict[str, object]:
        """The launcher's rules for the next call (the seal searched again: fail closed if it moved).

        A private copy holds no host secret (they are left out of it, their places empty), and what
        a command writes there is the task's own: it is granted whole."""
        sealed = seal.Seal((), False) if self.tree is not None else seal.for_profile(self.profile, self.workspace)
        return build_spec(
            self.profile,
            self.view,
            sealed,
            writable=[self.private, *([self._scratch] if self._scratch is not None else [])],
            readable=self._shared,
            ports=[self.egress.tcp_port] if self.egress is not None and self.egress.tcp_port else [],
            seccomp_program=self._seccomp,
        )

    async def _launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        group: cgroups.CallCgroup | None,
        *,
        stdin: bool,
    ) -> local.LocalProcess:
        spec, where = await off_loop(self._prepared, cwd)
        environment = base_env(self.profile, env, workspace=self.view)
        environment |= {"HOME": str(self.home), "TMPDIR": str(self.tmp)} | dict(env or {})
        hold = request(where, environment, spec, argv)
        spare = await self._ahead.take()
        launcher = spare.launcher if spare is not None else self._spawn()
        own = spare.group if spare is not None else None  # the launcher is in these cgroups already
        try:
            try:
                child = await self._go(launcher, own or group, hold, stdin=stdin, placed=own is not None)
            except BrokenPipeError:  # it died while it waited (killed from outside): nothing of the call ran
                child = await self._go(self._spawn(), own or group, hold, stdin=stdin, placed=False)
        except BaseException:
            if own is not None:
                self._pool.give_back(own)
            raise
        if own is not None and group is not None:
            self._pool.give_back(group)  # the call has the spare's
        self._ahead.start()  # the next call's launcher, started and placed while this command runs
        if self._audit is not None:
            child.audited = functools.partial(self._denials, self._audit, child.root_pid)
        return child

    async def _go(
        self,
        launcher: landlock_spare.Launcher,
        group: cgroups.CallCgroup | None,
        hold: bytes,
        *,
        stdin: bool,
        placed: bool,
    ) -> local.LocalProcess:
        """``launcher`` confined (``placed``: in ``group`` already), told its request, and seen to
        confine itself and start the command."""
        proc, status_r = launcher
        try:
            with self._releasing(proc, group, "landlock", stdin=stdin, hold=hold, placed=placed) as child:
                try:
                    await _confined(status_r)
                except BaseException:
                    await child.kill_tree(0)  # a launcher past its fork: its command too, not only itself
                    raise
        finally:
            os.close(status_r)
        return child

    def _prepared(self, cwd: str | None) -> tuple[dict[str, object], str]:
        """The call's rules (:meth:`spec`) and its working directory as the jail sees it."""
        where = self.to_view(cwd or str(self.workspace))
        if not os.path.isdir(where):
            raise InvalidArgument(f"the working directory {cwd} does not exist", cwd=cwd)
        return self.spec(), where

    def _spawn(self) -> landlock_spare.Launcher:
        """A launcher waiting for its request (the module doc of :mod:`sandbox._jailside.landlock`),
        and our end of its status pipe."""
        status_r, status_w = os.pipe()
        try:
            with confine.starting("cannot start the Landlock launcher"):
                shared = [part for path, mode in system_rules() for part in (mode, path)]
                proc = Child(
                    [self.python, "-I", "-S", "-c", _program(), str(status_w), self._seccomp or "", *shared],
                    pass_fds=(status_w,),
                    stdin=True,
                    new_session=True,
                    cwd="/",
                    env={},
                )
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        return proc, status_r

    async def _denials(self, audit: landlock_audit.AuditReader, launcher: int) -> dict[str, Any] | None:
        """The ended call's denials (its launcher created their domain), paths named as the workspace's."""
        account = await off_loop(audit.denials_of, launcher)
        for event in account["events"] if account is not None else ():
            if isinstance(event.get("path"), str):
                event["path"] = self.from_view(event["path"])
        return account

    async def _shutdown(self) -> None:
        await self._ahead.close()
        await super()._shutdown()
        await off_loop(shutil.rmtree, self.private, True)


def build_spec(
    profile: Profile,
    workspace: Path,
    sealed: seal.Seal,
    *,
    writable: Sequence[Path],
    readable: Sequence[str],
    ports: Sequence[int],
    seccomp_program: str,
) -> dict[str, object]:
    """What one call may touch and reach beyond the rules every call shares (:func:`system_rules`,
    which its launcher was given as it started; see the module doc)."""
    strategy = profile.mount.strategy
    refuse_sealed_rw(strategy, sealed)
    view = os.path.realpath(workspace)  # the launcher opens every rule's path without following a link
    paths = split(view, sealed.masked_paths, "ro" if strategy == "ro" else "rw")  # copy: the copy
    paths += [(os.path.realpath(p), "rw") for p in writable] + [(os.path.realpath(p), "ro") for p in readable]
    return {"paths": paths, "connect": list(ports), "seccomp": seccomp_program}


def request(cwd: str, env: Mapping[str, str], spec: dict[str, Any], argv: Sequence[str]) -> bytes:
    """What a waiting launcher is told (its module doc): ``go LENGTH``, then NUL-separated fields."""
    paths = spec["paths"]
    fields = [
        cwd,
        str(len(env)),
        *(f"{name}={value}" for name, value in env.items()),
        spec["seccomp"] or "",
        ",".join(str(port) for port in spec["connect"]),
        str(len(paths)),
        *(part for path, mode in paths for part in (mode, path)),
        "--",
        *argv,
    ]
    encoded = [os.fsencode(field) for field in fields]
    if any(b"\0" in field for field in encoded):
        raise InvalidArgument("a NUL byte in the command, its environment or its working directory")
    data = b"\0".join(encoded)
    return b"go %d\n" % len(data) + data


@cache
def system_rules() -> tuple[tuple[str, str], ...]:
    """The rules every call of every jail shares (the system, /etc, /proc, the devices): once a process."""
    paths = [(os.path.realpath(p), "ro") for p in bwrap_argv.SYSTEM_DIRS if os.path.exists(p)]
    paths += etc_readable()
    return (*paths, *((path, "ro") for path in READ_ONLY), *((path, "dev") for path in DEVICES))


def refuse_sealed_rw(strategy: str, sealed: seal.Seal) -> None:
    """``rw`` of a workspace with anything sealed: refused, never weakened (see the module doc)."""
    if strategy == "rw" and (sealed.masked or sealed.git or sealed.nested):
        raise GuaranteeUnavailable(_rw_refusal(sealed), backend="landlock", mount="rw")


def _mount_refusal(strategy: str) -> str:
    return (
        f"the landlock backend cannot provide mount {strategy!r} (no mount namespace for an overlay); use "
        "bwrap (root, or bubblewrap 0.9+), or copy"
    )


def _rw_refusal(sealed: seal.Seal) -> str:
    what = [f"secret {rel}" for rel in sealed.masked_paths[:3]]
    if sealed.git or sealed.nested:
        what.append(".git (its hooks and config stay read-only)")
    return (
        "the landlock backend cannot keep part of a writable workspace hidden or read-only ("
        + ", ".join(what)
        + "): Landlock grants a tree whole; use mount = 'copy' or 'ro', or bwrap or docker for 'rw'"
    )


async def _confined(status: int) -> None:
    """Wait for the launcher to confine itself and start the command: the status pipe's end, empty;
    a message there is its refusal (nothing ran)."""
    message = b""
    try:
        os.set_blocking(status, False)
        with anyio.fail_after(START_TIMEOUT_S):
            while True:
                await anyio.wait_readable(status)
                try:
                    chunk = os.read(status, _STATUS_SHOWN)
                except BlockingIOError:
                    continue
                if not chunk:
                    break
                message += chunk
    except TimeoutError as exc:
        raise BackendUnavailable("the Landlock launcher did not confine itself in time", backend="landlock") from exc
    if message:
        text = message.decode(errors="replace")[:_STATUS_SHOWN]
        raise BackendUnavailable(f"the Landlock jail could not be set up: {text}", backend="landlock")


class LandlockBackend(Backend):
    name = "landlock"
    egress_over_tcp = True

    def _probe(self) -> Report:
        return _report()

    def check(self, profile: Profile) -> None:
        """Also refuse, before any jail, the mounts it cannot give (so ``auto`` passes it over)."""
        super().check(profile)
        if profile.mount.strategy not in MOUNTS:
            raise GuaranteeUnavailable(_mount_refusal(profile.mount.strategy), backend="landlock")

    async def _open(
        self,
        workspace: Path,
        profile: Profile,
        *,
        scratch: Path | None,
        egress: Egress | None,
        shared: Sequence[tuple[str, str]] = (),
        downloads: Path | None = None,  # noqa: ARG002 - refused by open_jail (binds_downloads)
        seed: Snapshot | None = None,  # noqa: ARG002 - refused by open_jail (check_snapshots)
    ) -> LandlockJail:
        if egress is not None and egress.broker is not None:
            raise GuaranteeUnavailable(
                "the landlock backend's proxy listens on this host's loopback, where a brokered secret would be "
                "one connection away for any local process: use bwrap or docker for [secrets]",
                backend="landlock",
            )
        private, sealed = await off_loop(_prepare, workspace, profile, shared)
        tree = None
        try:
            if profile.mount.strategy == "copy":
                # The masked secrets are left out of the copy: their places in it stay empty.
                tree = await CopyTree.prepare(
                    workspace,
                    exclude=(*profile.mount.exclude, *sealed.masked_paths),
                    environment_cache=profile.mount.environment_cache == "project",
                    environment=profile.mount.environment,
                )
                if os.geteuid() == 0:  # root with no capabilities writes only what root owns
                    await off_loop(tree.hand_to, 0, 0)
        except BaseException:
            await off_loop(shutil.rmtree, private, True)
            raise
        audit = await off_loop(landlock_audit.reader) if abi() >= landlock_audit.ABI else None
        jail = LandlockJail(workspace, profile, private, scratch, shared, tree, audit)
        jail._ahead.start()
        return jail


def _prepare(workspace: Path, profile: Profile, shared: Sequence[tuple[str, str]]) -> tuple[Path, seal.Seal]:
    """Refuse what this backend cannot give this workspace; else the jail's private directory and seal."""
    host_files(profile)
    if profile.mount.strategy not in MOUNTS:
        raise GuaranteeUnavailable(_mount_refusal(profile.mount.strategy), backend="landlock")
    moved = [host for host, jail_path in shared if os.path.realpath(host) != os.path.realpath(jail_path)]
    if moved:
        raise GuaranteeUnavailable(
            f"the landlock backend cannot show {moved[0]} elsewhere (no mount namespace); use bwrap or docker "
            "for plugin tools",
            backend="landlock",
        )
    sealed = seal.for_profile(profile, workspace)
    refuse_sealed_rw(profile.mount.strategy, sealed)
    private = Path(tempfile.mkdtemp(prefix="landlock-", dir=datadir.subdir("run")))
    (private / "home").mkdir(mode=0o700)
    (private / "tmp").mkdir(mode=0o700)
    return private, sealed


def _moved(text: str, old: str, new: str, *, anywhere: bool = False) -> str:
    """``text`` with the path prefix ``old`` (a whole path or a parent) named ``new``; ``anywhere``:
    every occurrence followed by a separator or the text's end, else only at its start."""
    if old == new:
        return text
    if not anywhere:
        return new + text[len(old) :] if text == old or text.startswith(old + "/") else text
    return re.sub(re.escape(old) + r"(?=/|$|[\s:'\"])", lambda _m: new, text)


_GRANTED = ("fs-readonly-root", "fs-write-confined", "fs-hidden-home", "net-none", "net-confined", "net-allowlist")
_ALWAYS = ("no-new-privs", "no-caps", "env-scrubbed", "new-session", "cpu-limit", "fsize-limit")


def _report() -> Report:
    version = abi()
    problem = None
    if version == 0:
        problem = "this kernel has no Landlock (Linux 5.13+, enabled in lsm=)"
    elif version < MIN_ABI:
        problem = (
            f"Landlock ABI {version} here; the landlock backend needs {MIN_ABI} (Linux 6.12): before it a command "
            "could signal every process of its user"
        )
    elif (no_filter := seccomp.availability("landlock")) is not None:
        problem = f"no seccomp filter for the Landlock jail: {no_filter}"
    report = Report("landlock", problem is None, problem or "")
    report.details["abi"] = version
    report.notes += [
        f"Landlock ABI {version} (files, TCP bind and connect, signals and abstract sockets scoped to the jail), "
        "seccomp (every other socket), rlimits and cgroups; the kernel is the host's",
        "no namespace: the host's process list and command lines, /proc/net and which paths exist stay visible; "
        "a copy is seen at its own path, not the workspace's; an overlay mount is refused",
    ]
    for name in (*_GRANTED, *_ALWAYS):
        report.grant(name, problem is None, problem or "")
    report.grant("seccomp", problem is None, problem or "")
    report.grant("non-root", problem is None and os.geteuid() != 0, problem or _ROOT)
    report.grant("tree-kill", problem is None, problem or "")
    report.details["session-tree-kill"] = "the launcher adopts the call's orphans and kills its jail's processes"
    report.grant("net-transparent", False, "the landlock backend has no network namespace for a transparent proxy")
    report.grant("overlay", False, "the landlock backend has no mount namespace")
    report.grant("tmp-size-limit", False, "the landlock backend has no tmpfs: TMPDIR is a directory on the host")
    local.report_limits(report, "landlock", problem)
    report.notes.append(_audit_note(version, report))
    return report


_ROOT = "commands run as root here (with no capabilities): Landlock changes no uid"


def _audit_note(version: int, report: Report) -> str:
    if version < landlock_audit.ABI:
        report.details["audit"] = False
        return f"Landlock ABI {version} writes no audit records (ABI {landlock_audit.ABI} does): no per-call denials"
    readable = landlock_audit.reader() is not None
    report.details["audit"] = readable
    if readable:
        return "each call's denials are read back from the kernel's audit log (a result's kernel_denials)"
    return f"no per-call denials: {landlock_audit.why_not()}"


backend_class = LandlockBackend
