"""The interface every execution backend keeps.

A :class:`Backend` probes what it can guarantee on this host and opens :class:`Jail` s. A jail
binds one workspace under one profile (mounts, network, limits) and spawns :class:`Process` es
inside it. A process exposes stdout and stderr as two separate byte streams and can kill its
whole tree. Backends are modules (or packages) of this package ending in ``backend_class = X``;
:func:`get` loads one by name and caches it.

The base classes own the templates: :meth:`Backend.probe` caches, :meth:`Backend.open_jail`
refuses a profile the backend cannot enforce and a workspace that is no project directory, and
:meth:`Jail.spawn` refuses a closed jail and an empty command, each before the backend's own
part (``_probe``, ``_open``, ``_start``) runs.
"""

from __future__ import annotations

import functools
import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, TypeVar, get_args

import anyio

from sandbox import remedy
from sandbox.backends import AUTO_ORDER, BACKENDS
from sandbox.backends.jailpython import SYSTEM_BIN
from sandbox.calls import check_workspace
from sandbox.errors import (
    BackendUnavailable,
    CommandShellInvalid,
    GuaranteeUnavailable,
    InvalidArgument,
    SandboxError,
)
from sandbox.guarantees import Report
from sandbox.mounts import journal
from sandbox.threads import off_loop
from sandbox.vocabulary import BackendName

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from pathlib import Path

    from anyio.abc import ByteReceiveStream

    from sandbox.mounts import ApplyReport, Changeset, CopyTree
    from sandbox.network.egress import Egress
    from sandbox.profile import Profile
    from sandbox.snapshots import Snapshot

Stdin: TypeAlias = "bytes | ByteReceiveStream | None"
"""A call's stdin: all of it at once, a stream copied as it arrives, or none (closed from the start)."""

T = TypeVar("T")


class Process(ABC):
    """A command running in a jail: two separate output streams, an exit status, a tree kill."""

    stdout: ByteReceiveStream
    stderr: ByteReceiveStream

    @abstractmethod
    async def wait(self) -> int:
        """Exit status as ``subprocess`` reports it: ``-N`` when killed by signal ``N``."""

    @abstractmethod
    async def kill_tree(self, grace: float) -> None:
        """TERM every process the call started, wait up to ``grace`` seconds, then KILL them all.

        Returns only when none of them is running any more.
        """

    @abstractmethod
    def running_pids(self) -> list[int]:
        """Processes of this call still alive, as the backend sees them (for checks and tests)."""

    def oom_killed(self) -> bool:
        """Whether the memory limit killed a process of this call."""
        return False

    def peak_memory(self) -> int | None:
        """The call's peak memory use in bytes, where the backend can tell."""
        return None

    async def kernel_denials(self) -> dict[str, Any] | None:
        """What the kernel refused the ended call, where the backend reads it back (Landlock's
        audit: ``{source, events, omitted, complete}``); ``None`` where it cannot."""
        return None

    async def feed_stdin(self) -> None:  # noqa: B027 - only commands spawned with stdin need it
        """Write the ``stdin`` given to ``spawn`` and close it; run beside the output pumps.

        A stream is copied as it arrives; the caller cancels this once the command has exited.
        """

    def release(self) -> None:  # noqa: B027 - an optional hook; most backends hold nothing
        """Free what the call held (cgroups, exec ids) once it is over and its tree is dead."""


NO_BASH = "sandbox: SHELL_NOT_FOUND: no bash in the jail"
# $1 is the command; running bash through sh tells "no bash here" apart from the command's 127.
# Not `bash -lc` (seed 003 §5): a login shell's job there is to recover the user's profile PATH,
# but the jail's PATH is the sandbox's own and its HOME holds no profile. Debian's and Alpine's
# /etc/profile reset PATH, dropping the workspace's .venv/bin and node_modules/.bin, and the host
# backend's HOME is the workspace, so -l would run the project's own .profile before every command.
# bash is looked up in the system directories only: the jail's PATH starts with the workspace's
# .venv/bin and node_modules/.bin (for the command's own use), where a repository could plant one.
_BASH = (
    f'b=$(PATH={SYSTEM_BIN} command -v bash) || {{ echo "{NO_BASH}" >&2; exit 127; }}; '
    'case $b in /*) ;; *) echo "' + NO_BASH + '" >&2; exit 127;; esac; exec "$b" -c "$1"'
)


class Jail(ABC):
    """One workspace under one profile. ``async with`` closes it (and kills what it runs)."""

    backend: str
    profile: Profile
    workspace: Path  # host path of the workspace; the jail shows it at the same absolute path
    tree: CopyTree | None = None  # the private copy or overlay (copy/overlay mounts)
    egress: Egress | None = None  # the filtering proxy (network.mode = "allowlist")
    scratch: Path | None = None  # the session's scratch directory, shown read-write (set by open_jail)
    downloads: Path | None = None  # the project's download cache (sandbox.downloads), shown read-write
    # The interpreter of our programs in the jail (runner, forwarder), by an absolute path no mount
    # the jail writes can shadow, never by PATH: a backend that isolates sets its verified one
    # (sandbox.backends.jailpython); this default serves those that do not (host, fake).
    python: str = "/usr/bin/python3"

    @property
    def mount(self) -> str:
        return self.profile.mount.strategy

    @property
    def host_writable(self) -> tuple[Path, ...]:
        """Host directories whose disk this jail's calls fill (:mod:`sandbox.diskguard` watches them):
        the private copy's (an overlay's upper dir sits beside its merged view), the workspace in
        ``rw``, the scratch directory. The jail's ``/tmp`` and home are tmpfs: memory, capped."""
        areas = [area for area in (self.scratch, self.downloads) if area is not None]
        if self.tree is not None:
            areas.append(self.tree.root.parent)  # the tree's own directory: a copy's, an overlay's base
        elif self.mount == "rw":
            areas.append(self.workspace)
        return tuple(areas)

    @property
    def host_paths_shown(self) -> tuple[str, ...]:
        """Host paths the jail shows at the same place (a container: only the workspace; the rest
        is its image's). Used to explain a command that resolves into what the jail hides."""
        return (str(self.workspace),)

    def to_view(self, path: str) -> str:
        """A host path of the workspace as the jail names it (the same, but where a backend cannot
        show its private copy at the workspace's path: Landlock's)."""
        return path

    def from_view(self, text: str) -> str:
        """What the jail said (a file tool's reply), its view's paths named as the host's."""
        return text

    def shell_argv(self, command: str, shell: str | None = None) -> list[str]:
        """The Bash tool's ``command`` as this jail runs it in ``shell`` (an id of
        :data:`sandbox.shells.CATALOGUE`; a POSIX jail has ``bash`` only): bash, found in the system
        directories only, through ``/bin/sh`` (a missing bash says :data:`NO_BASH`, apart from the
        command's 127)."""
        if shell not in (None, "bash"):
            why = f"shell {shell!r} is not available in a {self.backend} jail; it runs bash"
            raise CommandShellInvalid(why, shell=shell)
        return ["/bin/sh", "-c", _BASH, "sandbox-bash", command]

    def runner_argv(self, program: str) -> list[str]:
        """The file tools' runner ``program`` (stdlib Python, its JSON request on stdin) as a
        command: the jail's own interpreter by its absolute path (by name, PATH would find the
        workspace's first). Spawn it with ``runner=True``: a jail may serve it its own way."""
        return [self.python, "-I", "-S", "-c", program]

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: Stdin = None,
        network: bool = True,
        runner: bool = False,
    ) -> Process:
        """Start ``argv`` inside the jail. ``env`` is added to the scrubbed base; ``stdin`` is fed
        to the command and then closed (``None``: stdin is closed from the start). A stream is
        copied through a pipe of ours as it arrives, never handed over: the jail gets no host fd.

        In an allowlist jail the command starts beside the forwarder to the filtering proxy, with
        the proxy variables set; ``network=False`` (the file tools) spares it that. ``runner``:
        ``argv`` is :meth:`runner_argv`'s, which a warm jail's agent serves itself and the Windows
        job runs from a file; every other jail starts it as any command.
        """
        if self._closed:
            raise InvalidArgument("the jail is closed")
        if not argv:
            raise InvalidArgument("empty argv: name a command to run")
        if self.egress is not None and network:
            if not self.egress.alive:
                raise BackendUnavailable("the jail's egress proxy has stopped; open a new jail (session)")
            argv, env = self.egress.wrap(argv, self.python), {**self.egress.env(), **(env or {})}
        return await self._start(argv, env=env, cwd=cwd, stdin=stdin, runner=runner)

    @abstractmethod
    async def _start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: Stdin,
        runner: bool = False,
    ) -> Process:
        """The backend's part of :meth:`spawn`, once the jail is known open and ``argv`` not empty."""

    async def changes(self) -> Changeset | None:
        """For ``copy``/``overlay`` mounts: what the jail changed, else ``None``."""
        return await self.tree.changes() if self.tree is not None else None

    async def apply(
        self, changeset: Changeset, paths: Iterable[str] | None = None, *, include_flagged: bool = False
    ) -> ApplyReport:
        """Copy approved changes back to the host workspace (``copy``/``overlay`` mounts only).

        Flagged changes (git hooks and config, dotfiles, new executables…) are applied only when
        named in ``paths`` or with ``include_flagged``; otherwise they are in ``held_back``.
        """
        if self.tree is None:
            raise InvalidArgument(f"mount {self.mount!r} writes in place; there is nothing to apply")
        return await self.tree.apply(changeset, paths, include_flagged=include_flagged)

    _closed: bool = False

    async def aclose(self) -> None:
        """Kill everything the jail still runs and release what it holds (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            try:
                await self._shutdown()
            finally:
                if self.egress is not None:
                    await off_loop(self.egress.close)
                if self.tree is not None:
                    await off_loop(self.tree.remove)

    @abstractmethod
    async def _shutdown(self) -> None:
        """The backend's part of ``aclose``: every process of the jail dead, resources freed."""

    async def __aenter__(self) -> Jail:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Backend(ABC):
    name: ClassVar[str]
    binds_downloads: ClassVar[bool] = False  # can show a host directory at a jail path of its own
    snapshots: ClassVar[bool] = False  # its private trees can be snapshotted (sandbox.snapshots)
    egress_over_tcp: ClassVar[bool] = False  # its jails reach the proxy on the host's loopback (no netns)
    _probed: Report | None = None

    def probe(self) -> Report:
        """What this host lets this backend enforce, with the reason where not.

        Cached per instance, except a report marked ``transient`` (a host out of processes, say):
        that one is asked again next time, so a passing shortage is not remembered as a verdict.
        """
        if self._probed is not None:
            return self._probed
        report = self._probe()
        if not report.details.get("transient"):
            self._probed = report
        return report

    @abstractmethod
    def _probe(self) -> Report:
        """The backend's part of :meth:`probe`: look at this host (uncached)."""

    def probe_for(self, profile: Profile) -> Report:  # noqa: ARG002 - a backend whose report depends on it
        """What this host lets this backend enforce for ``profile``: :meth:`probe`'s, unless a setting
        of the profile changes what the backend is (Docker's ``[docker] runtime``, gVisor)."""
        return self.probe()

    async def open_jail(
        self,
        workspace: Path,
        profile: Profile,
        *,
        scratch: Path | None = None,
        shared: Sequence[tuple[str, str]] = (),
        seed: Snapshot | None = None,
    ) -> Jail:
        """Open a jail; raise BackendUnavailable / GuaranteeUnavailable rather than weaken it.

        ``scratch``, when given, is an existing host directory shown read-write at the same path.
        ``shared``: ``(host directory, jail directory)`` pairs shown read-only (a session's plugin
        directories, :mod:`sandbox.plugins`); each must still be a directory. ``seed``: a session
        snapshot's layer (:mod:`sandbox.snapshots`) the jail's private tree starts from.
        """
        if seed is not None:
            self.check_snapshots(profile)
        return await self._open_jail(workspace, profile, scratch=scratch, shared=shared, seed=seed)

    def check_snapshots(self, profile: Profile) -> None:
        """INVALID_ARGUMENT unless this backend's jails under ``profile`` can be snapshotted and
        started from a snapshot: a private tree on this host (``copy`` or ``overlay``)."""
        if not self.snapshots:
            raise InvalidArgument(
                f"session snapshots need the bwrap or docker backend; the {self.name} backend has none",
                backend=self.name,
            )
        if profile.mount.strategy not in ("copy", "overlay"):
            raise InvalidArgument(
                f"mount {profile.mount.strategy!r} has no private tree to snapshot: "
                + ("it writes the workspace in place" if profile.mount.strategy == "rw" else "it cannot write")
                + "; use mount.strategy 'copy' or 'overlay'",
                mount=profile.mount.strategy,
            )

    async def _open_jail(
        self,
        workspace: Path,
        profile: Profile,
        *,
        scratch: Path | None,
        shared: Sequence[tuple[str, str]],
        seed: Snapshot | None = None,
    ) -> Jail:
        from sandbox.backends.environment import shared_dirs

        self.check(profile)
        _check_scratch(scratch)
        dirs = shared_dirs(shared)
        ws = check_workspace(workspace)
        await self._recover(ws)
        downloads = await self._downloads(ws, profile)
        if profile.network.mode != "allowlist":
            jail = await self._open(
                ws, profile, scratch=scratch, egress=None, shared=dirs, downloads=downloads, seed=seed
            )
            jail.scratch, jail.downloads = scratch, downloads
            return jail
        from sandbox.network.egress import Egress, for_profile

        # The proxy's bound on a question outlasts the approver's own timeout, which answers first;
        # its allowlist is the profile's with the trusted domains merged (seed 004).
        egress = await off_loop(
            functools.partial(Egress.start, tcp=self.egress_over_tcp),
            for_profile(profile),
            profile.policy.approval_timeout_s + 10,
            profile.secrets,
        )
        try:
            jail = await self._open(
                ws, profile, scratch=scratch, egress=egress, shared=dirs, downloads=downloads, seed=seed
            )
        except BaseException:
            egress.close()
            raise
        jail.egress = egress  # the jail closes it
        jail.scratch, jail.downloads = scratch, downloads
        return jail

    async def _downloads(self, workspace: Path, profile: Profile) -> Path | None:
        """The project's download cache to bind (``mount.download_cache``), made; refused where
        this backend cannot bind it."""
        from sandbox import downloads

        if not downloads.enabled(profile):
            return None
        if not self.binds_downloads:
            raise InvalidArgument(
                f"mount.download_cache = 'project' needs a backend that binds a directory into its jails "
                f"(bwrap, docker, podman); the {self.name} backend does not: set it to 'off' for this backend",
                backend=self.name,
                setting="mount.download_cache",
            )
        return await off_loop(downloads.prepare, workspace, profile, self.name)

    async def _recover(self, workspace: Path) -> None:
        """Finish or undo an apply a crash interrupted in ``workspace``, before a jail shows it."""

        await off_loop(journal.recover, workspace)

    @abstractmethod
    async def _open(
        self,
        workspace: Path,
        profile: Profile,
        *,
        scratch: Path | None,
        egress: Egress | None,
        shared: Sequence[tuple[str, str]] = (),
        downloads: Path | None = None,
        seed: Snapshot | None = None,
    ) -> Jail:
        """The backend's part of :meth:`open_jail`: ``profile`` checked, ``workspace`` canonical,
        ``egress`` the running proxy of an allowlist profile (its socket directory to bind),
        ``shared`` the read-only directories, checked, ``downloads`` the project's download cache
        to show read-write at :data:`sandbox.downloads.JAIL_DIR` (only where ``binds_downloads``),
        ``seed`` the snapshot the private tree starts from (only where ``snapshots``): applied by
        :func:`seed_tree` before any of the jail's processes exists, so that its masks and binds
        are made over the seeded tree (a seed's later unlink would detach a mask from its path)."""

    def check(self, profile: Profile) -> None:
        """Refuse a profile whose required guarantees this backend cannot give here."""
        report = self.probe_for(profile)
        if not report.available:
            raise BackendUnavailable(f"backend {self.name} is unavailable: {report.reason}", backend=self.name)
        missing = report.missing(profile.requires, profile)
        if missing:
            raise GuaranteeUnavailable(
                f"backend {self.name} cannot enforce what profile {profile.name!r} requires: "
                + "; ".join(f"{g} ({why})" for g, why in missing.items()),
                backend=self.name,
                profile=profile.name,
                missing=missing,
            )
        refused = report.refused_limits(profile)
        if refused:  # a limit asked for is enforced or refused, never dropped
            raise GuaranteeUnavailable(
                f"backend {self.name} cannot enforce on this host: "
                + "; ".join(
                    f"{key} = {getattr(profile.limits, key.removeprefix('limits.'))} ({why})"
                    for key, why in refused.items()
                ),
                backend=self.name,
                profile=profile.name,
                missing=refused,
            )


async def seed_tree(tree: CopyTree | None, seed: Snapshot | None, backend: str) -> None:
    """Start a fresh private tree from ``seed``'s layer (through its view), or do nothing without
    one; the caller removes the tree when this fails."""
    if seed is None:
        return
    if tree is None or not tree.snapshots:
        raise InvalidArgument(
            f"this {backend} jail's private tree is not on this host (a remote engine's): it cannot start "
            "from a snapshot",
            backend=backend,
        )
    await off_loop(_seed, tree, seed)


def _seed(tree: CopyTree, seed: Snapshot) -> None:
    from sandbox.mounts import layers

    layers.seed(tree.root, seed.layer, seed.delta)
    tree.adopt_host(seed.delta.host)


def _check_scratch(scratch: Path | None) -> None:
    if scratch is not None and not scratch.is_dir():
        raise InvalidArgument(f"the scratch directory {scratch} does not exist", scratch=str(scratch))


# One instance per name for the process's life: a probe costs a smoke jail or a daemon round
# trip, and the instance caches it; tests script the one ``get("fake")`` hands to sessions.
_loaded: dict[str, Backend] = {}
_POSIX_ONLY = frozenset({"resource", "fcntl", "termios", "pwd", "grp", "posix"})


def get(name: str, *, offered: bool = False) -> Backend:
    """The backend called ``name`` (``bwrap``, ``docker``, ``host``, or ``fake`` for tests), imported on first use.

    ``offered``: only the real backends, as the CLI offers them (a user asking for ``fake`` on
    the command line would get a toy shell's answers and no boundary).
    """
    if name not in (BACKENDS if offered else get_args(BackendName)):
        raise InvalidArgument(f"unknown backend {name!r}; choose one of auto, {', '.join(BACKENDS)}", backend=name)
    if name not in _loaded:
        try:
            module = importlib.import_module(f"sandbox.backends.{name}")
        except ImportError as exc:
            if exc.name in _POSIX_ONLY:  # bwrap or host on Windows: no extra would help
                raise BackendUnavailable(
                    f"backend {name} needs a POSIX host (the {exc.name} module); on Windows use winjob",
                    backend=name,
                ) from exc
            raise BackendUnavailable(
                f"backend {name} needs a package that is not installed ({exc.name}); "
                f"install the extra: pip install 'sandbox[{name}]'",
                backend=name,
            ) from exc
        _loaded[name] = module.backend_class()
    return _loaded[name]


def choose(name: str, profile: Profile, flags: Mapping[str, str] | None = None) -> Backend:
    """Resolve ``auto`` (bwrap first, then docker; never host) or check the named backend.

    A refusal says the way forward (:func:`sandbox.remedy.explain`); ``flags``: profile key -> the
    flag that set it (``{"mount.strategy": "--mount overlay"}``), blamed instead of the profile.
    """
    try:
        return _choose(name, profile)
    except GuaranteeUnavailable as exc:
        raise remedy.explain(exc, profile, flags or {}, functools.partial(report_of, profile=profile)) from exc


def fallback_note(backend: Backend, profile: Profile) -> str | None:
    """Why ``auto`` chose ``backend`` rather than one before it in its order, when it did so for
    a weaker jail (Landlock's: no namespace): what a user should know as the jail opens."""
    if profile.backend != "auto" or backend.name != "landlock":
        return None
    passed = []
    for candidate in AUTO_ORDER[: AUTO_ORDER.index("landlock")]:
        try:
            get(candidate).check(profile)
        except (BackendUnavailable, GuaranteeUnavailable) as exc:
            passed.append(f"{candidate}: {exc.message}")
    return (
        "auto chose the landlock backend ("
        + " | ".join(passed)
        + "): no namespaces, so the host's process list and which paths exist stay visible (sandbox check)"
    )


def report_of(name: str, profile: Profile | None = None) -> Report:
    """Backend ``name``'s report here (for ``profile``, when given); one that cannot even load is
    unavailable, with the reason."""
    try:
        return get(name).probe() if profile is None else get(name).probe_for(profile)
    except SandboxError as exc:
        return Report(name, False, exc.message)


def _choose(name: str, profile: Profile) -> Backend:
    if name != "auto":
        backend = get(name)
        backend.check(profile)
        return backend
    tried: dict[str, str] = {}
    for candidate in AUTO_ORDER:
        try:
            backend = get(candidate)
            backend.check(profile)
        except (BackendUnavailable, GuaranteeUnavailable) as exc:
            tried[candidate] = exc.message
            continue
        return backend
    raise GuaranteeUnavailable(
        "no backend on this host can run profile "
        f"{profile.name!r}: " + " | ".join(f"{k}: {v}" for k, v in tried.items()),
        profile=profile.name,
        tried=tried,
    )
