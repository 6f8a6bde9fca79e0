"""bwrap's command line for a jail, and the cached smoke-test verdict: no anyio, no pydantic.

Both the event-loop backend (:mod:`sandbox.backends.bwrap`) and the synchronous ``sandbox run``
(:mod:`sandbox.launch`) build their jails from here, so a call is confined the same way
whichever path starts it. ``profile`` is anything shaped like :class:`sandbox.profile.Profile`
(the model, or the launcher's cached copy of one).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from functools import cache
from typing import TYPE_CHECKING

from sandbox import datadir
from sandbox.backends import seal
from sandbox.backends.environment import SANDBOX_GID, SANDBOX_UID, bwrap_args
from sandbox.downloads import JAIL_DIR as downloads_jail_dir
from sandbox.envrules import SANDBOX_HOME
from sandbox.errors import BackendUnavailable
from sandbox.network.places import BUNDLE_FILE, JAIL_DIR, SYSTEM_BUNDLE

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from sandbox.profile import Profile

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
MASKED_TREES = ("/etc",)


def bwrap_path() -> str | None:
    """``shutil.which("bwrap")``, without importing shutil (and its compressors) on every run."""
    for folder in os.get_exec_path():
        path = os.path.join(folder, "bwrap")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


@cache
def empty_dir() -> str:
    path = datadir.subdir("empty")
    path.chmod(0o500)  # the jail's uid is ours (user namespace); nobody else needs to enter it
    return str(path)


@cache
def empty_file() -> str:
    """A read-only empty file: what a masked secret reads as (a write to it fails, unlike /dev/null)."""
    path = datadir.subdir("empty-file") / "empty"
    if not path.is_file() or path.stat().st_size:
        temp = path.with_name(f".empty.{os.getpid()}")
        temp.write_bytes(b"")
        temp.replace(path)
    path.chmod(0o444)
    return str(path)


@cache
def _masks() -> tuple[str, ...]:
    """Entries under /etc that only their owner can read (shadow, ssl/private, host keys ...).

    The jail's uid maps to the caller's; when that caller is root it would own these files,
    so they are hidden behind an empty file or directory rather than trusted to permissions.
    Computed afresh by every process (a chmod changes no cheap key), with ``scandir``: a
    quarter of what ``os.walk`` plus an ``lstat`` per entry costs.
    """
    args: list[str] = []
    pending = list(MASKED_TREES)
    while pending:
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_symlink():  # from the directory entry: no stat for /etc/ssl/certs' hundreds
                        continue
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        continue
                    is_dir = stat.S_ISDIR(st.st_mode)
                    if st.st_mode & stat.S_IROTH:
                        if is_dir:
                            pending.append(entry.path)
                        continue  # nothing below a mask matters, so only readable dirs are entered
                    args += ["--ro-bind", empty_dir() if is_dir else "/dev/null", entry.path]
    return tuple(args)


def _system_mounts() -> list[str]:
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--ro-bind", "/etc", "/etc", *_masks()]
    return args


def host_paths_shown(workspace: Path) -> tuple[str, ...]:
    """The host paths a jail shows, as the host names them (for "it resolves into what the jail hides")."""
    return (str(workspace), *(os.path.realpath(d) for d in SYSTEM_DIRS), "/etc")


find_sealed = seal.for_profile

# The jail's /tmp (and HOME within it) gets one inode per page of its size: an empty file costs no
# page, only kernel memory (about 1 KiB an inode), which a size cap alone leaves to the kernel's
# default of half the RAM's pages. A page per inode bounds that memory to a quarter of the size.
BYTES_PER_TMP_INODE = 4096
_MIN_TMP_INODES = 64
_TMP_SCRIPT = '"$1" -t tmpfs -o "$2" sandbox-tmp "$3" || exit 125; shift 3; exec "$@"'


def tmp_inodes(size: int) -> int:
    """The inode cap of a jail's tmpfs of ``size`` bytes."""
    return max(size // BYTES_PER_TMP_INODE, _MIN_TMP_INODES)


@cache
def _host_tool(name: str) -> str | None:
    """``name`` from the system's own directories (not the caller's PATH): it runs as the caller, outside a jail."""
    for folder in ("/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


# Sysctls under which unshare(1) gets no user namespace although bwrap may still get one (a
# setuid bwrap, or Ubuntu's AppArmor profile for bwrap alone): the value that forbids it.
_USERNS_SWITCHES = (
    ("/proc/sys/kernel/unprivileged_userns_clone", "0"),
    ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1"),
    ("/proc/sys/user/max_user_namespaces", "0"),
)


def _unshare_may_map_users() -> bool:
    """Whether an ordinary user's unshare(1) may make the user namespace the launcher mounts in."""
    for path, forbidding in _USERNS_SWITCHES:
        try:
            with open(path, encoding="ascii") as fh:
                if fh.read().strip() == forbidding:
                    return False
        except OSError:
            continue  # not this kernel's switch
    return True


@cache
def _tmp_launcher_tools() -> tuple[str, str, str] | None:
    unshare, mount, sh = _host_tool("unshare"), _host_tool("mount"), _host_tool("sh")
    if os.geteuid() != 0 and not _unshare_may_map_users():
        return None  # bwrap alone makes the jail, its /tmp capped in size only (check says so)
    return (unshare, mount, sh) if unshare and mount and sh else None


def inode_cap_available() -> bool:
    """Whether a jail's /tmp can have an inode cap here (the launcher's tools are installed)."""
    return _tmp_launcher_tools() is not None


def capped_tmp(profile: Profile) -> bool:
    """Whether the jail's /tmp is an inode-capped tmpfs made by :func:`command_prefix`'s launcher.

    bwrap 0.8's ``--tmpfs`` takes a size but no ``nr_inodes``: the launcher mounts the tmpfs
    itself, in a mount namespace of its own (and, for an ordinary user, the user namespace
    that lets it mount), and bwrap binds that at /tmp. Without unshare(1) or mount(1) the
    size stays capped by bwrap and the inodes by the kernel's default (``check`` says so).
    """
    return bool(profile.limits.tmp_size) and _tmp_launcher_tools() is not None


@cache
def tmp_mount_point() -> str:
    """Where the launcher mounts the jail's tmpfs, in its own mount namespace only (never on the host)."""
    path = datadir.subdir("tmp-mount")
    path.chmod(0o500)
    return str(path)


def tmp_args(profile: Profile) -> list[str]:
    """bwrap's arguments for the jail's /tmp: the launcher's capped tmpfs, else a sized ``--tmpfs``."""
    if capped_tmp(profile):
        return ["--bind", tmp_mount_point(), "/tmp"]
    return [*(["--size", str(profile.limits.tmp_size)] if profile.limits.tmp_size else []), "--tmpfs", "/tmp"]


def command_prefix(profile: Profile) -> list[str]:
    """What runs bwrap for ``profile``: the tmpfs launcher (when :func:`capped_tmp`) and bwrap itself.

    Use it with :func:`jail_args` of the same profile: the two agree on how /tmp is made. The
    launcher execs bwrap, so bwrap keeps its pid, its fds and its parent.
    """
    bwrap = require_bwrap()
    tools = _tmp_launcher_tools()
    size = profile.limits.tmp_size
    if not size or tools is None:
        return [bwrap]
    unshare, mount, sh = tools
    # root may mount in a mount namespace of its own; an ordinary user needs a user namespace for
    # it (where it is root), inside which bwrap makes the jail's as it always does.
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    options = f"rw,nosuid,nodev,mode=1777,size={size},nr_inodes={tmp_inodes(size)}"
    launcher = [unshare, *user, "--mount", "--propagation", "private", "--", sh, "-c", _TMP_SCRIPT, "sandbox-tmp"]
    return [*launcher, mount, options, tmp_mount_point(), bwrap]


def untracked_binds(workspace: Path, untracked: Sequence[str]) -> list[str]:
    """Paths kept out of a private copy (``mount.exclude``), bound read-only from the host at their place.

    They come after the workspace's bind, so they cover their (empty) mount points in the copy.
    """
    args: list[str] = []
    for rel in untracked:
        path = str(workspace / rel)
        args += ["--ro-bind", path, path]
    return args


def jail_args(
    profile: Profile,
    workspace: Path,
    source: Path,
    scratch: Path | None = None,
    untracked: Sequence[str] = (),
    egress_dir: Path | None = None,
    sealed: seal.Seal | None = None,
    shared: Sequence[tuple[str, str]] = (),
    *,
    downloads: Path | None = None,
) -> list[str]:
    """The bwrap arguments shared by every call of a jail (everything but fds, env and argv).

    ``untracked``: the workspace paths a private tree left out, bound read-only from the host.
    ``egress_dir``: the filtering proxy's socket directory (allowlist), bound at its jail path.
    ``sealed``: the workspace's secrets to mask (found now when not given; see :mod:`.seal`).
    ``shared``: host directories shown read-only (a session's plugins; checked by the caller).
    ``downloads``: the project's download cache, read-write at :data:`sandbox.downloads.JAIL_DIR`.
    """
    ws = str(workspace)
    if sealed is None:
        sealed = find_sealed(profile, workspace)
    masked = set(sealed.masked_paths)
    args = [
        "--unshare-all",
        *(["--share-net"] if profile.network.mode == "host" else []),
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_GID),
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "sandbox",
        *_system_mounts(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        *tmp_args(profile),
        "--dir",
        SANDBOX_HOME,
        *bwrap_args(profile),  # env.files in the jail's home, read-only
        # Shared directories (plugins) read-only, their secrets masked as the workspace's are.
        *seal.shared_bwrap_args(shared, profile.policy.deny_read, empty_dir(), empty_file()),
        "--ro-bind" if profile.mount.strategy == "ro" else "--bind",
        str(source),
        ws,
        *untracked_binds(workspace, [rel for rel in untracked if rel not in masked]),
        *seal.bwrap_args(ws, sealed, empty_dir(), empty_file(), rw=profile.mount.strategy == "rw"),
        *(["--bind", str(scratch), str(scratch)] if scratch is not None else []),
        *(["--ro-bind", str(egress_dir), JAIL_DIR] if egress_dir is not None else []),
        *_session_bundle(egress_dir),
        *(["--bind", str(downloads), downloads_jail_dir] if downloads is not None else []),
        "--remount-ro",
        "/",
    ]
    return args


class InfoReader:
    """bwrap's ``--info-fd`` report, read as it arrives: the host pid of the namespace's init."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = b""
        self.done = False

    def read(self) -> None:
        """One read, once ``fd`` is readable; ``done`` at the end of the JSON object or of the pipe."""
        chunk = os.read(self.fd, 4096)
        self.data += chunk
        self.done = not chunk or self.data.rstrip().endswith(b"}")

    def init_pid(self) -> int | None:
        """The init's pid, or ``None`` when bwrap failed before it reported one."""
        try:
            return int(json.loads(self.data)["child-pid"])
        except (ValueError, KeyError, TypeError):
            return None


def require_bwrap() -> str:
    path = bwrap_path()
    if path is None:
        raise BackendUnavailable(
            "bubblewrap is not installed: apt-get install bubblewrap (or use --backend docker)",
            backend="bwrap",
        )
    return path


_SMOKE_SYSCTLS = (
    "/proc/sys/kernel/random/boot_id",
    "/proc/sys/user/max_user_namespaces",
    "/proc/sys/kernel/unprivileged_userns_clone",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
)


def smoke_key(path: str) -> str:
    from sandbox import __version__

    st = os.stat(path)
    parts = [
        __version__,
        os.path.realpath(path),
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
        os.uname().release,
        os.geteuid(),
    ]
    for name in _SMOKE_SYSCTLS:
        try:
            with open(name, encoding="utf-8") as fh:
                parts.append(fh.read().strip())
        except OSError:
            parts.append("-")
    return json.dumps(parts)


def probe_cache() -> Path:
    return datadir.data_dir() / "cache" / "bwrap-probe.json"


def passed_smoke(path: str) -> str | None:
    """bwrap's version when a smoke test passed for this very host and binary (see ``smoke_key``), else ``None``."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        kept = json.loads(probe_cache().read_text())
        if kept.get("key") == smoke_key(path):
            return str(kept["version"])
    return None


def remember_smoke(path: str, version: str) -> None:
    with contextlib.suppress(OSError):
        cache = probe_cache()
        cache.parent.mkdir(mode=0o700, exist_ok=True)
        temp = cache.with_name(f".{cache.name}.{os.getpid()}")
        temp.write_text(json.dumps({"key": smoke_key(path), "version": version}))
        temp.replace(cache)


def _session_bundle(egress_dir: Path | None) -> list[str]:
    """The broker's CA bundle (the host's CAs and the session's) over the system's, for the tools
    that read no variable (Go's, a static binary's); nothing when no host is terminated."""
    bundle = None if egress_dir is None else egress_dir / BUNDLE_FILE
    if bundle is None or not bundle.is_file() or not os.path.isfile(SYSTEM_BUNDLE):
        return []
    return ["--ro-bind", str(bundle), SYSTEM_BUNDLE]
