"""Shared fixtures: a private data dir, and one parametrised jail fixture per backend.

A backend that cannot run here is skipped with the reason its probe gives (what is missing),
never passed silently. CI provides bubblewrap, a running dockerd and the image.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import psutil
import pytest

from sandbox import profile as profiles
from sandbox.backends import base, confine
from sandbox.errors import BackendUnavailable
from sandbox.imagehost import DOCKER_SOCKET

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from sandbox.backends.fake import FakeBackend

BACKENDS = ("bwrap", "docker", "landlock")
# bubblewrap's default is the warm jail ([bwrap] lifecycle = "session"), so every bwrap test runs
# against it; the contract and attack suites (every module of tests/attack/ too) also run with a
# fresh jail per call ("call").
PER_CALL = "bwrap-call"
PER_CALL_MODULES = frozenset({"test_contracts", "test_leaks", "test_tools", "test_limits"})
# Docker's default is the warm container too; "docker-call" runs the same suites with a fresh
# container per call ([docker] lifecycle = "call": the pool of agent containers).
DOCKER_PER_CALL = "docker-call"
# backend param -> (the backend, the profile table whose lifecycle the param swaps to "call")
_PER_CALL_OF = {PER_CALL: ("bwrap", "bwrap"), DOCKER_PER_CALL: ("docker", "docker")}
# Docker with gVisor ([docker] runtime = "runsc": tests/integration/test_gvisor.py, docs/backends/gvisor.md)
# runs the contract and attack suites, less what it declares it does not give, each skipped with the
# reason; skipped as a whole, saying what is missing, where runsc is not installed or not registered.
DOCKER_RUNSC = "docker-runsc"
RUNSC = "runsc"
RUNSC_MODULES = frozenset({"test_contracts", "test_tools", "test_limits", "test_gvisor"})
_NOT_A_HOST_PROCESS = "a command under gVisor is no host process: the host's view of its session cannot be read"
_SANDBOX_ENDS = "the host's cgroup holds the Sentry: reaching the limit ends the whole sandbox, not only the call"
RUNSC_DECLARED = {
    "test_new_session_no_terminal": _NOT_A_HOST_PROCESS + " (test_gvisor checks it from inside)",
    "test_fork_bomb_is_contained": _SANDBOX_ENDS + " (test_gvisor: the next call gets a new container)",
    "test_memory_bomb_kills_only_the_call": _SANDBOX_ENDS + " (test_gvisor: the call says out of memory)",
    "test_non_root_without_privileges": "gVisor's /proc/self/status has no NoNewPrivs line (test_gvisor: prctl)",
    "test_inode_flood_stops_at_the_tmpfs_cap": "gVisor's tmpfs ignores nr_inodes: its byte cap holds, not its inodes",
    "test_copy_special_files_and_outside_symlinks_never_come_back": "a fifo made in a bind mount stays in the "
    "Sentry, never on the host: there is none to skip (test_gvisor checks the host)",
}
# runsc 20221219 (Debian 12's) refuses statx with AT_NO_AUTOMOUNT, which coreutils 9 passes: `stat`
# and `ls PATH` fail with EINVAL there (test_gvisor: the file size limit itself holds).
RUNSC_OLD_STATX = "20221219"
_STATX = f"runsc {RUNSC_OLD_STATX} refuses statx(AT_NO_AUTOMOUNT): coreutils' stat and ls PATH fail (EINVAL)"
RUNSC_STATX_DECLARED = {
    "test_file_size_limit": _STATX + " (test_gvisor checks the limit with wc -c)",
    "test_a_write_outside_is_asked_and_denied_not_run": _STATX,
}


@functools.cache
def runsc_version() -> str:
    """``runsc --version``'s first line here, or ``""``."""
    found = shutil.which(RUNSC)
    if found is None:
        return ""
    done = subprocess.run([found, "--version"], capture_output=True, text=True, check=False, timeout=30)
    return done.stdout.partition("\n")[0]


# The microVM (tests/integration/test_microvm.py, docs/backends/microvm.md) runs the contract, tool
# and attack suites as root, less what it declares it does not give, each skipped with the reason.
MICROVM = "microvm"
MICROVM_MODULES = frozenset({"test_contracts", "test_tools", "test_egress", "test_broker"})
_GUEST = (
    "a guest's processes are no host processes: the host cannot list them (test_microvm checks each kill from "
    "inside the guest, by a later call's ps)"
)
MICROVM_DECLARED = {
    "test_timeout_kills_setsid_double_fork_and_term_ignoring": _GUEST,
    "test_abort_kills_the_tree": _GUEST,
    "test_cancellation_kills_the_tree_and_propagates": _GUEST,
    "test_background_process_dies_with_a_normal_exit": _GUEST,
    "test_descendant_holding_stdout_cannot_hang_the_call": _GUEST,
    "test_jail_close_kills_what_it_runs": _GUEST + "; test_microvm: closing leaves no QEMU",
    "test_new_session_no_terminal": _GUEST + "; test_microvm checks the session and /dev/tty from inside",
    "test_copy_special_files_and_outside_symlinks_never_come_back": (
        "9p cannot make a FIFO in the workspace (mkfifo: ENXIO); test_microvm: links and setuid never come back"
    ),
    "test_a_write_over_a_hostile_file_keeps_its_review_off_the_event_loop": (
        "the server's event loop is what it checks, the same for every backend (bwrap, docker and landlock run "
        "it); the order of two calls proves nothing where each is an emulated guest's, slower than the diff"
    ),
    "test_an_interpreter_the_jail_could_write_is_refused": (
        "the agent's interpreter is the guest root's /usr/bin/python3 (a read-only export), never one looked for "
        "among paths a workspace could hold"
    ),
}


# Landlock (no namespace) runs the contract and attack suites, less what it declares it does not
# give (sandbox check, docs/backends/landlock.md), each shown as declared by
# tests/integration/test_landlock.py instead; and the allowlist suite. test_broker does not apply:
# [secrets] are refused on it (test_landlock.py::test_secrets_are_refused_with_the_reason).
LANDLOCK_MODULES = frozenset({"test_contracts", "test_leaks", "test_tools", "test_limits", "test_egress"})
_RW_GIT = "rw on a workspace with a .git is refused: Landlock cannot keep its hooks and config read-only"
_PLUGINS = "plugin directories shown at another path are refused: no mount namespace"
LANDLOCK_DECLARED = {
    "test_tmp_is_private_and_bounded": "no tmpfs /tmp: a private TMPDIR, unbounded (tmp_size refused)",
    "test_inode_flood_stops_at_the_tmpfs_cap": "no tmpfs /tmp (tmp_size refused)",
    "test_host_files_outside_are_absent": "no mount namespace: which paths exist stays visible (stat needs no right)",
    "test_host_git_runs_nothing_the_jail_planted[landlock-rw-": _RW_GIT,
    "test_rw_": _RW_GIT,
    "test_a_linked_worktree_keeps_its_gitdir_pointer[landlock-rw]": _RW_GIT,
    "test_a_file_a_host_tool_runs_on_its_own_stays_as_it_was[landlock-rw]": _RW_GIT,
    "test_a_plugin_dirs_secrets_are_masked": _PLUGINS,
    "test_a_project_declared_plugin_": _PLUGINS,
    "test_a_plugins_bare_interpreter_is_not_the_workspaces": _PLUGINS,
    "test_a_secret_created_on_the_host_mid_session_is_masked[landlock-rw]": "rw: the next call is refused instead",
    "test_a_secret_written_by_an_earlier_call_is_masked": "a secret the task wrote stays readable to its later calls",
    "test_a_later_run_of_the_workspace_finds_its_downloads": "no download cache (bound at a path of its own)",
    "test_another_workspace_never_sees_it": "no download cache",
    "test_the_hosts_own_caches_and_the_entry_stamp_are_out_of_reach": "no download cache",
    "test_every_installer_is_pointed_at_it": "no download cache",
    "test_what_a_jail_plants_is_removed_without_following_or_opening_it": "no download cache",
    "test_the_disk_guard_watches_it": "no download cache",
    "test_the_forwarder_is_not_shadowed": "no forwarder: the command reaches the proxy's loopback port itself",
    "test_transparent_": "no network namespace for a transparent proxy (net-transparent: no)",
}
# The server tests start `sandbox serve` with the shipped profiles, whose tmp_size Landlock refuses.
LANDLOCK_SERVED = frozenset({"test_server_stall"})
LANDLOCK_AS_ROOT = {"test_non_root_without_privileges": "commands run as root, with no capabilities (non-root: no)"}
# As root with no writable pids cgroup (a container's): the kernel exempts root from RLIMIT_NPROC.
LANDLOCK_UNBOUNDED = {"test_fork_bomb_is_contained": "root with no writable pids cgroup: a pids limit is refused"}


@functools.cache
def landlock_pids_unbounded() -> bool:
    return confine.enforcement("landlock")["pids"].how is None


def _landlock_wanted(item: pytest.Item) -> bool:
    if item.path.stem == "test_landlock":
        return True
    if item.path.stem in LANDLOCK_SERVED:
        return False
    if item.path.stem not in LANDLOCK_MODULES and item.path.parent.name != "attack":
        return False
    declared = {
        **LANDLOCK_DECLARED,
        **(LANDLOCK_AS_ROOT if os.geteuid() == 0 else {}),
        **(LANDLOCK_UNBOUNDED if landlock_pids_unbounded() else {}),
    }
    return not any(item.name.startswith(name) for name in declared)


def _runsc_declared(item: pytest.Item) -> str | None:
    """Why ``item`` cannot hold under gVisor (``RUNSC_DECLARED``, and this release's), or ``None``."""
    declared = {**RUNSC_DECLARED, **(RUNSC_STATX_DECLARED if RUNSC_OLD_STATX in runsc_version() else {})}
    return next((why for name, why in declared.items() if item.name.startswith(name)), None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``bwrap-call``, ``docker-call``, ``docker-runsc`` and ``landlock`` only where they are meant (what
    gVisor declares it does not give skips, saying why); ``@pytest.mark.root`` tests skip, saying so,
    as an ordinary user."""
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        param = callspec.params.get("backend") if callspec is not None else None
        per_call = param in _PER_CALL_OF
        wanted = item.path.stem in PER_CALL_MODULES or item.path.parent.name == "attack"
        on_landlock = callspec is not None and "landlock" in callspec.params.values()
        on_runsc = param == DOCKER_RUNSC
        on_microvm = param == MICROVM
        unwanted = (per_call and not wanted) or (on_landlock and not _landlock_wanted(item))
        unwanted = unwanted or (on_runsc and item.path.stem not in RUNSC_MODULES and item.path.parent.name != "attack")
        # As an ordinary user the microVM's contract, tool and attack suites stay with root's run (a
        # boot per jail, no pool, on an emulated machine here); test_microvm runs for both users.
        microvm_module = item.path.stem in MICROVM_MODULES or item.path.parent.name == "attack"
        unwanted = unwanted or (on_microvm and (not microvm_module or os.geteuid() != 0))
        (dropped if unwanted else kept).append(item)
        why = _runsc_declared(item) if on_runsc else None
        if on_microvm:
            why = next((why for name, why in MICROVM_DECLARED.items() if item.name.startswith(name)), None)
        if why is not None:
            what = "the microVM" if on_microvm else "gVisor"
            item.add_marker(pytest.mark.skip(reason=f"declared for {what}: {why}"))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (marked root); this run is as an ordinary user")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def data_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path_factory.mktemp("data")
    monkeypatch.setenv("SANDBOX_DATA_DIR", str(path))
    return path


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def backend_or_skip(name: str) -> base.Backend:
    try:
        backend = base.get(name)
    except BackendUnavailable as exc:
        pytest.skip(f"{name} backend unavailable: {exc.message}")
    report = backend.probe()
    if not report.available:
        pytest.skip(f"{name} backend unavailable on this host: {report.reason}")
    return backend


def landlock_or_skip(monkeypatch: pytest.MonkeyPatch) -> base.Backend:
    """The landlock backend, with the shipped profiles as the suites take them minus ``tmp_size``:
    with no tmpfs it cannot cap the jail's TMPDIR, so a profile asking for it is refused there
    (tests/integration/test_landlock.py checks that refusal)."""
    found = backend_or_skip("landlock")
    load = profiles.load

    unbounded = landlock_pids_unbounded()  # root with no writable pids cgroup (a container)

    def without_tmp_size(name: str | None = None) -> profiles.Profile:
        prof = load(name).with_overrides(**{"limits.tmp_size": "256MiB"})  # the schema default: not asked for
        if os.geteuid() == 0:  # commands run as root under Landlock (it changes no uid): `check` says so
            prof = prof.with_overrides(requires=tuple(g for g in prof.requires if g != "non-root"))
        if unbounded:  # refused there, with the reason (test_landlock_container.py); the rest still runs
            prof = prof.with_overrides(**{"limits.pids": 256})  # the schema default: not asked for
        return prof

    monkeypatch.setattr(profiles, "load", without_tmp_size)
    return found


def runsc_missing(backend: base.Backend) -> str | None:
    """What keeps the Docker backend from running jails under gVisor here, or ``None``."""
    gvisor = backend.probe().details.get("gvisor") or {}
    if not gvisor.get("installed"):
        return "runsc (gVisor) is not installed: apt-get install runsc (images/dockerd-up.sh does it as root)"
    if RUNSC not in (gvisor.get("registered") or {}):
        known = ", ".join(backend.probe().details.get("runtimes") or ()) or "none"
        return f"runsc is not registered with the Docker engine (its runtimes: {known}): images/dockerd-up.sh as root"
    return None


def _on_runsc(profile: profiles.Profile) -> profiles.Profile:
    """``profile`` run by gVisor. gVisor cannot hold a call's processes to ``limits.cpu_time_s``, so a
    profile that sets it is refused (test_gvisor checks that): the suites take it at the schema's
    default, which is not asked for (best effort)."""
    if profile.docker.runtime is not None:
        return profile
    default = type(profile.limits).model_fields["cpu_time_s"].default
    return profile.with_overrides(**{"docker.runtime": RUNSC, "limits.cpu_time_s": default})


def runsc_or_skip(monkeypatch: pytest.MonkeyPatch) -> base.Backend:
    """The docker backend with every jail a test opens on it run by gVisor (``[docker] runtime``), and
    its report the one for that runtime; skipped, saying what is missing, where runsc cannot run."""
    found = backend_or_skip("docker")
    missing = runsc_missing(found)
    if missing is not None:
        pytest.skip(missing)
    on_runsc = make_profile(**{"docker.runtime": RUNSC})
    report = found.probe_for(on_runsc)
    if not report.available:
        pytest.skip(f"docker with runsc unavailable on this host: {report.reason}")
    cls = type(found)
    opened, checked = cls.open_jail, cls.check

    async def open_on_runsc(self: base.Backend, workspace: Path, profile: profiles.Profile, **kwargs: Any) -> base.Jail:
        return await opened(self, workspace, _on_runsc(profile), **kwargs)

    def check_on_runsc(self: base.Backend, profile: profiles.Profile) -> None:
        checked(self, _on_runsc(profile))

    monkeypatch.setattr(cls, "open_jail", open_on_runsc)
    monkeypatch.setattr(cls, "check", check_on_runsc)  # sessions check the profile before they open
    monkeypatch.setattr(found, "probe", lambda: report)
    return found


@pytest.fixture(
    params=[
        *(pytest.param(name, marks=getattr(pytest.mark, name)) for name in BACKENDS),
        pytest.param(PER_CALL, marks=pytest.mark.bwrap),
        pytest.param(DOCKER_PER_CALL, marks=pytest.mark.docker),
        pytest.param(DOCKER_RUNSC, marks=pytest.mark.docker),
        pytest.param(MICROVM, marks=[pytest.mark.microvm, pytest.mark.slow]),
    ]
)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> base.Backend:
    if request.param == "landlock":
        return landlock_or_skip(monkeypatch)
    if request.param == DOCKER_RUNSC:
        return runsc_or_skip(monkeypatch)
    if request.param not in _PER_CALL_OF:
        return backend_or_skip(request.param)
    name, table = _PER_CALL_OF[request.param]
    found = backend_or_skip(name)
    # Every jail this test opens on that backend (its own, a session's) is a fresh jail per call.
    cls = type(found)
    opened = cls._open
    key = f"{table}.lifecycle"

    async def per_call_open(self: base.Backend, workspace: Path, profile: profiles.Profile, **kwargs: Any) -> base.Jail:
        if getattr(profile, table).lifecycle == "session":
            profile = profile.with_overrides(**{key: "call"})
        return await opened(self, workspace, profile, **kwargs)

    monkeypatch.setattr(cls, "_open", per_call_open)
    return found


@pytest.fixture
def workspace(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# sample\n")
    (ws / "src").mkdir()
    (ws / "src" / "app.py").write_text("print('hello')\n")
    if "backend" in request.fixturenames and request.getfixturevalue("backend").name in RUNS_AS_OWNER:
        own_like_a_checkout(ws)
    return ws


# Backends that run commands as the workspace owner, or uid 1000 for a root-owned one (never root).
RUNS_AS_OWNER = frozenset({"docker", "microvm"})


def own_like_a_checkout(root: Path, backend: str = "docker") -> None:
    """As root, hand ``root`` to uid 1000 where ``backend`` runs commands as the workspace owner
    (:data:`RUNS_AS_OWNER`), so its tests get a workspace owned like a developer's."""
    if os.geteuid() == 0 and backend in RUNS_AS_OWNER:
        for path in (root, *root.rglob("*")):
            os.chown(path, 1000, 1000, follow_symlinks=False)


def make_profile(name: str = "default", /, **overrides: Any) -> profiles.Profile:
    """A shipped profile with dotted-key overrides and no guarantee requirements of its own.

    (Tests take a profile for its mounts and limits; what it requires is checked where that is
    the point, and an ordinary user without delegated cgroups cannot get ``untrusted``'s.)
    """
    prof = profiles.load(name)
    return prof.with_overrides(**{"requires": (), **overrides})


def profile_or_skip(name: str, backend: str = "bwrap") -> profiles.Profile:
    """A shipped profile whose requirements ``backend`` meets here, else skip naming what is missing
    (an ordinary user without delegated cgroups has no per-call memory limit for ``untrusted``, ``ci``)."""
    prof = profiles.load(name)
    missing = backend_or_skip(backend).probe().missing(prof.requires, prof)
    if missing:
        why = "; ".join(f"{key} ({reason})" for key, reason in missing.items())
        pytest.skip(f"{backend} cannot give profile {name!r} here: {why}")
    return prof


JailFactory = Callable[..., Any]


@pytest.fixture
async def open_jail(backend: base.Backend, workspace: Path) -> AsyncIterator[JailFactory]:
    opened: list[base.Jail] = []

    async def factory(profile: profiles.Profile | None = None, ws: Path | None = None) -> base.Jail:
        jail = await backend.open_jail(ws or workspace, profile or make_profile())
        opened.append(jail)
        return jail

    yield factory
    for jail in opened:
        await jail.aclose()


@pytest.fixture
def marker() -> str:
    """A unique number to find a test's processes host-wide (sleep <marker>)."""
    return str(100000 + secrets.randbelow(899999))


def survivors(marker: str) -> list[int]:
    """Pids whose command line carries ``marker``: the host kernel's view, any backend, and where a
    gVisor sandbox runs (its processes are the Sentry's, not the host's), the view inside it."""
    found = []
    sandboxed = False
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(marker in part for part in cmdline):
            found.append(proc.pid)
        sandboxed = sandboxed or cmdline[:1] == ["runsc-sandbox"]
    # Only the local daemon's jails run under runsc, and only a process that can reach it has any:
    # an ordinary user's run sees root's gVisor jails (another run's) and can own none of them.
    mine = sandboxed and os.access(DOCKER_SOCKET, os.R_OK | os.W_OK)
    return found + (in_gvisor(marker) if mine else [])


# Every process of the sandbox but this listing's own shell and its `cat`s: pid, then the command line.
_LIST_SANDBOX = 'for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = $$ ] || echo "$p $(tr "\\0" " " < $d/cmdline)"; done'


def in_gvisor(marker: str) -> list[int]:
    """Pids inside our running gVisor jails whose command line carries ``marker`` (the sandbox's own
    pids, listed by an exec as the keeper uid: the agent sweeps only its own uid)."""
    import docker
    import docker.errors
    import requests

    from sandbox.backends.docker.config import KEEPER_USER, LABEL_JAIL

    found: list[int] = []
    # The host's runsc sandboxes are the local daemon's (dockerd-up.sh registers runsc there), whatever
    # DOCKER_HOST the running test set: a remote engine's test, or Podman's, while another worker's
    # gVisor jail runs.
    # An exec into a jail the engine is tearing down (another worker's) can hang for good under runsc:
    # bounded, it counts as gone for this look, and the caller's next look asks again.
    client = docker.DockerClient(base_url=f"unix://{DOCKER_SOCKET}", timeout=20)
    try:
        for container in client.containers.list(filters={"label": LABEL_JAIL}, sparse=False):
            runtime = (container.attrs.get("HostConfig") or {}).get("Runtime")
            if runtime != RUNSC:
                continue
            try:
                code, out = container.exec_run(["/bin/sh", "-c", _LIST_SANDBOX], user=KEEPER_USER)
            except (docker.errors.APIError, requests.exceptions.RequestException, OSError):
                continue  # gone meanwhile (nothing of it survives), or not answering within the bound
            assert isinstance(out, bytes)  # not streamed
            for line in out.decode(errors="replace").splitlines():
                pid, _, cmdline = line.partition(" ")
                if pid.isdigit() and marker in cmdline and "/proc/[0-9]" not in cmdline:
                    found.append(int(pid))
    finally:
        client.close()
    return found


@pytest.fixture
def fake() -> Iterator[FakeBackend]:
    """The fake backend's instance, as sessions get it from the loader, with no script left over."""
    from sandbox.backends.fake import FakeBackend

    backend = base.get("fake")
    assert isinstance(backend, FakeBackend)
    with backend.scripted():
        yield backend
