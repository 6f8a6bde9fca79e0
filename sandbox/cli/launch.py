"""``sandbox run`` with no event loop and no pydantic: one bwrap jail, started, waited for, killed.

Most of a short ``sandbox run`` used to be imports: pydantic to validate the profile, asyncio
and anyio to drive one child. This path imports neither. It takes a call only where it keeps
every promise of the full path (:mod:`sandbox.cli.run`), confining the jail with the same code
(:mod:`sandbox.backends.bwrap_argv`, :mod:`sandbox.backends.confine`, :mod:`sandbox.calls`),
and hands any other call back (:func:`run` returns ``None``):

- the backend is bwrap, named or chosen by ``auto``, and bwrap's smoke test passed on this host
  (the verdict the full path keeps, see :func:`sandbox.backends.bwrap_argv.passed_smoke`);
- the full path has validated this profile, with these flags, and accepted it on bwrap here
  before: it leaves the validated profile in a cache keyed by this package's version, the
  profile file (path, inode, size, times), the flags, our uid, and how this host enforces each
  limit (:func:`sandbox.backends.confine.enforcement`). A host that lost a cgroup, an edited
  profile or a new version misses the cache, and the full path decides again (and refuses a
  limit it cannot enforce, as always);
- the mount is ``ro`` or ``rw`` (``copy`` and ``overlay`` have a changeset), and no ``--json``
  (it reports captured output);
- our stdin, stdout and stderr are each a pipe or ``/dev/null``, or stdin a terminal or closed
  (it is not forwarded: the command reads ``/dev/null``). Those are handed to the jail as they
  are: a pipe reopened through ``/proc/self/fd`` is the same pipe, and SIGPIPE reaches the
  command itself. A terminal, a file or a socket could be reopened as more than the command was
  given, so the full path copies those.

The jail's init is held on bwrap's block fd until it is in the call's cgroup and has its
rlimits; on timeout or a signal to us every process of the call is TERMed, given the profile's
grace, then killed, and we return only once none is left and the cgroup is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import stat
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from sandbox import __version__, calls, datadir, gitsweep, remedy
from sandbox.backends import bwrap_argv, bwrap_start, cgroups, confine, seccomp
from sandbox.backends.environment import base_env, host_files

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

    from sandbox.profile import Profile

SECTIONS = ("mount", "network", "limits", "timeouts", "env", "docker", "policy")
FAST_MOUNTS = ("ro", "rw")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# ---- the validated-profile cache -------------------------------------------------------------


class _Section:
    """A profile section read back from the cache: the model's fields as attributes, nothing more."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)


def _thaw(dump: dict[str, Any]) -> Profile:
    return cast("Profile", _Section({k: _Section(v) if k in SECTIONS else v for k, v in dump.items()}))


def _profile_file(ref: str | None) -> Path | None:
    """The file ``profile.load(ref)`` reads, found without importing it (``None``: let it say why)."""
    ref = ref or "default"
    shipped = Path(__file__).parent.parent / "profiles" / f"{ref}.toml"
    if "/" not in ref and shipped.is_file():
        return shipped
    path = Path(ref)
    return path if path.suffix == ".toml" and path.is_file() else None


def _key(args: argparse.Namespace) -> str | None:
    path = _profile_file(args.profile)
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    how = {name: [e.how, e.scope] for name, e in confine.enforcement("bwrap").items()}
    flags = [args.mount, args.memory, args.pids, args.network, args.allow_host, args.allow_index, args.backend]
    flags.append(args.download_cache)
    return json.dumps(
        [
            __version__,
            os.path.realpath(path),
            st.st_ino,
            st.st_size,
            st.st_mtime_ns,
            st.st_ctime_ns,
            flags,
            os.geteuid(),
            os.getegid(),
            how,
        ]
    )


def _cache_file(key: str) -> Path:
    return datadir.data_dir() / "cache" / "profiles" / f"{zlib.crc32(key.encode()):08x}.json"


def remember(args: argparse.Namespace, profile: Profile) -> None:
    """Keep ``profile`` (validated, flags applied, accepted by bwrap here) for the next ``sandbox run``."""
    if profile.mount.strategy not in FAST_MOUNTS or "overlay" in profile.requires:
        return
    if profile.network.mode == "allowlist":  # the proxy and its forwarder: the full path's
        return
    if profile.mount.download_cache != "off":  # the cache's directory is made and bound by the full path
        return
    key = _key(args)
    if key is None:
        return
    with contextlib.suppress(OSError):
        path = _cache_file(key)
        datadir.subdir("cache")  # 0700, like every directory of ours (mkdir -p would make it 0755)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}")
        temp.write_text(json.dumps({"key": key, "profile": profile.model_dump(mode="json")}))
        temp.replace(path)


def _recall(args: argparse.Namespace) -> Profile | None:
    key = _key(args)
    if key is None:
        return None
    try:
        kept = json.loads(_cache_file(key).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("key") != key:
        return None
    return _thaw(kept["profile"])


# ---- the call -----------------------------------------------------------------------------------


class Outcome:
    """What the CLI reports of a call (the fields of ``ExecResult`` it reads), and the signals we got."""

    def __init__(self, received: list[int]) -> None:
        self.exit_code = 0
        self.timed_out = False
        self.aborted = False
        self.kill_ms: float | None = None
        self.oom_killed = False
        self.received = received
        self.quarantined: list[dict[str, str]] | None = None  # rw: see sandbox.gitsweep


NOT_FORWARDED = -1  # a stdin the command does not get: it reads /dev/null


def _handed_over(fd: int, *, stdin: bool) -> int | None:
    """``fd`` itself, ``NOT_FORWARDED`` for such a stdin, or ``None``: the full path copies it."""
    try:
        st = os.fstat(fd)
    except OSError:
        return NOT_FORWARDED if stdin else None
    if stat.S_ISFIFO(st.st_mode):
        return fd
    if stat.S_ISCHR(st.st_mode):
        if st.st_rdev == os.stat(os.devnull).st_rdev:
            return fd
        if stdin and os.isatty(fd):
            return NOT_FORWARDED
    return None


class _Bwrap:
    """bwrap, our child, started by ``posix_spawn`` (``subprocess`` and its imports are a tenth of a run)."""

    def __init__(self, argv: list[str], streams: list[int], pass_fds: tuple[int, ...]) -> None:
        actions = []
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            for target, fd in enumerate(streams):
                source = null if fd == NOT_FORWARDED else fd
                if source != target:
                    actions.append((os.POSIX_SPAWN_DUP2, source, target))
            for fd in pass_fds:
                os.set_inheritable(fd, True)
            # Python ignores SIGPIPE and SIGXFSZ: the command must not inherit that (as subprocess restores them).
            self.pid = os.posix_spawn(
                argv[0], argv, os.environ, file_actions=actions, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, *SIGNALS)
            )
        finally:
            os.close(null)
        self.returncode: int | None = None

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class _Shown(NamedTuple):
    """What :func:`sandbox.calls.checked_argv` reads of a jail."""

    workspace: Path
    profile: Profile
    host_paths_shown: tuple[str, ...]


def run(args: argparse.Namespace, argv: Sequence[str]) -> Outcome | None:
    """Run ``argv`` as ``sandbox run`` would, or ``None`` when this call needs the full path.

    Raises :class:`~sandbox.errors.SandboxError` exactly where the full path would (a bad
    timeout or workspace, bwrap failing to start).
    """
    if args.json or args.apply or args.backend not in (None, "auto", "bwrap"):
        return None
    streams = [_handed_over(0, stdin=True), _handed_over(1, stdin=False), _handed_over(2, stdin=False)]
    bwrap = bwrap_argv.bwrap_path()
    if None in streams or bwrap is None or bwrap_argv.passed_smoke(bwrap) is None:
        return None
    handed = [fd for fd in streams if fd is not None]
    seccomp_filter = seccomp.kept_filter()
    if seccomp_filter is None:
        return None  # the full path builds and keeps it (or finds there is none to be had here)
    prof = _recall(args)
    if prof is None:
        return None
    args.timeout_s = calls.check_timeout(args.timeout, prof)
    args.timeout_source = remedy.for_run(args.timeout, args.timeout_s, prof)  # a timeout says where it came from
    ws = calls.check_workspace(args.workspace or Path.cwd())
    if any((datadir.data_dir() / "journal").glob("*.json")):
        return None  # an interrupted apply: the full path finishes or undoes it before the jail opens
    host_files(prof)  # a file that became a secret is refused here too
    shown = _Shown(ws, prof, bwrap_argv.host_paths_shown(ws))
    jail = [*bwrap_argv.command_prefix(prof), *bwrap_argv.jail_args(prof, ws, ws)]
    started = _Started(jail, str(ws), base_env(prof, None, workspace=ws))
    # rw: what the call leaves that the host's git would obey is moved away (nested repositories: the full path's)
    before = gitsweep.take(str(ws), gitsweep.gitdirs(str(ws), ())) if prof.mount.strategy == "rw" else None
    try:
        outcome = _Call(prof, args.timeout_s, seccomp_filter).run(started, calls.checked_argv(shown, argv), handed)
    finally:
        moved = gitsweep.quarantine(str(ws), gitsweep.planted(before)) if before is not None else []
    outcome.quarantined = moved or None
    return outcome


class _Started(NamedTuple):
    """What the call's bwrap is given besides its command: the jail, the directory, the environment."""

    jail: list[str]
    chdir: str
    env: dict[str, str]


class _Call:
    def __init__(self, profile: Profile, timeout: float, seccomp_filter: str) -> None:
        self.profile = profile
        self.timeout = timeout
        self.seccomp_filter = seccomp_filter
        self.received: list[int] = []

    def run(self, started: _Started, argv: list[str], streams: list[int]) -> Outcome:
        # From here on a signal to us is an abort of the call, even one that comes during the start.
        with _signals_to(self.received) as wakeup:
            group = confine.call_cgroup(self.profile)
            try:
                proc, tree = self._start(started, argv, streams, group)
                try:
                    with _tree_killed(tree):
                        outcome = self._wait(proc, tree, wakeup)
                        outcome.oom_killed = group.oom_killed() if group else False
                finally:  # the tree first, then bwrap is waited for
                    code = proc.wait()
                outcome.exit_code = calls.exit_status(code)[0]
                return outcome
            finally:
                if group is not None:
                    for pause in confine.removal_steps(group):
                        time.sleep(pause)

    def _start(
        self, started: _Started, argv: list[str], streams: list[int], group: cgroups.CallCgroup | None
    ) -> tuple[_Bwrap, confine.Tree]:
        """bwrap started with its init held until it is confined (see ``BwrapJail._release_held``)."""
        with confine.starting("cannot start bwrap"):
            seccomp_fd = os.open(self.seccomp_filter, os.O_RDONLY | os.O_CLOEXEC)
            fds = bwrap_start.StartFds(block=True, seccomp_fd=seccomp_fd)
        with fds:
            cmd = bwrap_start.command(started.jail, fds, argv, chdir=started.chdir, env=started.env)
            with confine.starting("cannot start bwrap"):
                proc = _Bwrap(cmd, streams, fds.theirs)
            fds.handed_over()
            tree = None
            try:
                tree = confine.Tree(bwrap_start.wait_init_pid(fds.info_r, proc.wait), group, kernel_reaps=True)
                confine.confine(tree.root_pid, self.profile, group, "bwrap")
                fds.release()
            except BaseException:
                if tree is not None:
                    tree.kill_root()
                    tree.forget_root()
                proc.kill()
                proc.wait()
                raise
            return proc, tree

    def _wait(self, proc: _Bwrap, tree: confine.Tree, wakeup: int) -> Outcome:
        """Wait for bwrap, a deadline or a signal to us; on the last two, kill the tree with grace."""
        outcome = Outcome(self.received)
        deadline = time.monotonic() + self.timeout
        with _pidfd(proc.pid) as exited:
            poller = select.poll()
            poller.register(exited, select.POLLIN)
            poller.register(wakeup, select.POLLIN)
            while not self.received:
                left = deadline - time.monotonic()
                if left <= 0:
                    outcome.timed_out = True
                    break
                if any(fd == exited for fd, _ in poller.poll(left * 1000)):
                    break
            outcome.aborted = bool(self.received) and not outcome.timed_out
        if outcome.timed_out or outcome.aborted:
            stop = time.monotonic()
            for pause in tree.kill_steps(self.profile.timeouts.kill_grace_s):
                time.sleep(pause)
            outcome.kill_ms = round((time.monotonic() - stop) * 1000, 3)
        return outcome


@contextlib.contextmanager
def _tree_killed(tree: confine.Tree) -> Any:
    """On the way out, however it is left: nothing of the call runs any more."""
    try:
        yield
    finally:
        for pause in tree.kill_steps(0):
            time.sleep(pause)
        tree.forget_root()


@contextlib.contextmanager
def _pidfd(pid: int) -> Any:
    fd = os.pidfd_open(pid)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _signals_to(received: list[int]) -> Any:
    """INT, TERM and HUP to us are recorded in ``received`` and wake the wait (a readable fd)."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    previous = {sig: signal.signal(sig, lambda signum, _frame: received.append(signum)) for sig in SIGNALS}
    old_wakeup = signal.set_wakeup_fd(wake_w)
    try:
        yield wake_r
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(wake_r)
        os.close(wake_w)
