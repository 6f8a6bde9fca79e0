"""A jail's container, as ``create()`` arguments: every confinement knob in one place.

Both process models start from :func:`container_config`: a read-only root, no capabilities,
no new privileges, Docker's default seccomp profile, no network unless the profile opens it,
the workspace (or its private copy) bound at its own absolute path, with the paths a copy
leaves out bound read-only from the host, the profile's limits as cgroup settings and
rlimits, and owner labels so ``sandbox gc`` can tell a leftover. The warm model replaces the
command with the agent of :mod:`sandbox._jailside.agent`.

With ``[docker] ca_certificates = "host"`` the host's CA bundle (checked to hold certificates
only) is bound read-only over the image's, and :func:`ca_env` names it to every client, so a
download through the allowlist verifies as it does under bubblewrap, which shows the host's /etc.
"""

from __future__ import annotations

import os
import socket
import stat
from typing import TYPE_CHECKING, Any

import psutil
from docker.types import Mount, Ulimit

from sandbox import __version__
from sandbox.backends import jailpython, seal, seccomp
from sandbox.backends.agentlink import AGENT_PROGRAM
from sandbox.backends.bwrap_argv import empty_dir, empty_file, tmp_inodes
from sandbox.backends.docker.client import image_ref
from sandbox.backends.environment import CA_VARIABLES, SANDBOX_GID, SANDBOX_UID, host_files
from sandbox.downloads import JAIL_DIR as downloads_jail_dir
from sandbox.envrules import SANDBOX_HOME
from sandbox.errors import InvalidArgument
from sandbox.network.places import BUNDLE_FILE, JAIL_DIR

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from sandbox.profile import Profile

KEEPER_USER = "65534:65534"
# ca_certificates = "host": where the host's bundle shows in the jail (where Debian's clients look by
# default), the variables that name it to the others, and where distributions keep theirs (Debian
# and Ubuntu, Fedora and RHEL, openSUSE, the extracted p11-kit bundle, Alpine).
JAIL_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
HOST_CA_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
)
MAX_CA_BUNDLE = 16 << 20  # a system bundle is ~200 KiB; anything near this is not one
LABEL_OWNER = "sandbox.owner"  # <pid>@<host>
LABEL_OWNER_STARTED = "sandbox.owner-started"  # the owner's start time, against pid reuse
LABEL_JAIL = "sandbox.jail"
LABEL_LIFECYCLE = "sandbox.lifecycle"
LABEL_VERSION = "sandbox.version"


def owner_labels(jail_id: str, lifecycle: str) -> dict[str, str]:
    me = psutil.Process()
    return {
        LABEL_OWNER: f"{os.getpid()}@{socket.gethostname()}",
        LABEL_OWNER_STARTED: f"{me.create_time():.2f}",
        LABEL_JAIL: jail_id,
        LABEL_LIFECYCLE: lifecycle,
        LABEL_VERSION: __version__,
    }


def _ulimits(profile: Profile, agent: bool = False) -> list[Ulimit]:
    lim = profile.limits
    # CPU seconds count per process: the agent lives for the session, so it sets that limit on
    # each command it starts instead (the container's would kill the agent itself in time).
    cpu = None if agent else lim.cpu_time_s
    pairs = (("nofile", lim.nofile), ("fsize", lim.file_size), ("cpu", cpu))
    return [Ulimit(name=name, soft=int(value), hard=int(value)) for name, value in pairs if value is not None]


def _resources(profile: Profile, agent: bool = False, runtime_pids: int = 0) -> dict[str, Any]:
    lim = profile.limits
    res: dict[str, Any] = {"ulimits": _ulimits(profile, agent)}
    if lim.memory is not None:
        # Swap equal to memory: no swap at all, so a memory bomb meets the limit, not the disk.
        res.update(mem_limit=lim.memory, memswap_limit=lim.memory)
    if lim.pids is not None:
        res["pids_limit"] = lim.pids + runtime_pids
    if lim.cpus is not None:
        res["nano_cpus"] = int(lim.cpus * 1e9)
    return res


def _tmpfs(profile: Profile, home_owner: str | None = None) -> dict[str, str]:
    # An inode cap with the size (one inode per page, as bwrap's): empty files cost no bytes.
    tmp_size = profile.limits.tmp_size
    size = f",size={tmp_size},nr_inodes={tmp_inodes(tmp_size)}" if tmp_size else ""
    # exec, as bubblewrap's /tmp: Docker's default noexec breaks a venv made there (`/tmp/v/bin/pip`)
    # and stops nothing `sh /tmp/x` or the workspace does not allow anyway; nosuid and nodev stay.
    tmpfs = {"/tmp": f"rw,exec,nosuid,nodev,mode=1777{size}"}
    if home_owner is not None:
        # Docker makes the mount points of host files as root: the home must stay the command user's.
        uid, gid = uid_gid(home_owner)
        tmpfs[SANDBOX_HOME] = f"rw,exec,nosuid,nodev,mode=0755,uid={uid},gid={gid}{size}"
    return tmpfs


def container_config(
    profile: Profile,
    jail_id: str,
    workspace: Path,
    source: Path,
    scratch: Path | None = None,
    agent_user: str | None = None,
    untracked: Sequence[str] = (),
    egress_dir: Path | None = None,
    sealed: seal.Seal | None = None,
    shared: Sequence[tuple[str, str]] = (),
    downloads: Path | None = None,
    runtime_pids: int = 0,
) -> dict[str, Any]:
    """The create() arguments of a jail's container.

    The Docker socket is never mounted; the binds are the workspace (or its private copy), at
    the workspace's own absolute path, and the profile's ``env.files``, read-only in the jail's
    home (which then gets a tmpfs of its own, owned by the command user). With ``agent_user``
    the container's only process is the agent (see :mod:`sandbox._jailside.agent`), running
    as that uid with stdin open; without, it is tini and ``sleep infinity`` as the keeper uid, for exec-per-call.
    ``runtime_pids``: what the runtime's own processes take of the container's pids cgroup (gVisor's
    Sentry and gofer threads, see :mod:`.gvisor`), added to the profile's limit.
    """
    ws = str(workspace)
    if sealed is None:
        sealed = seal.for_profile(profile, workspace)
    masked = set(sealed.masked_paths)
    mounts = [Mount(target=ws, source=str(source), type="bind", read_only=profile.mount.strategy == "ro")]
    mounts += _untracked_mounts(workspace, [rel for rel in untracked if rel not in masked])
    # The workspace's secrets masked, its git internals read-only in rw (sandbox/backends/seal.py).
    sealing = seal.binds(ws, sealed, empty_dir(), empty_file(), rw=profile.mount.strategy == "rw")
    mounts += [Mount(target=target, source=src, type="bind", read_only=ro) for src, target, ro in sealing]
    if scratch is not None:
        mounts.append(Mount(target=str(scratch), source=str(scratch), type="bind"))
    if downloads is not None:  # the project's download cache (sandbox.downloads), at the jail's own path
        mounts.append(Mount(target=downloads_jail_dir, source=str(downloads), type="bind"))
    if egress_dir is not None:  # allowlist: the filtering proxy's socket, the only way out
        mounts.append(Mount(target=JAIL_DIR, source=str(egress_dir), type="bind", read_only=True))
    files = host_files(profile)
    mounts += [Mount(target=target, source=source, type="bind", read_only=True) for source, target in files]
    bundle = host_ca_bundle(profile)
    session_bundle = None if egress_dir is None else egress_dir / BUNDLE_FILE
    if session_bundle is not None and session_bundle.is_file():  # the broker's: the host's CAs and the session's
        bundle = str(session_bundle)
    if bundle is not None:  # over the image's own bundle: a client that ignores the variables reads it too
        mounts.append(Mount(target=JAIL_CA_BUNDLE, source=bundle, type="bind", read_only=True))
    # shared: a session's plugin directories (checked by open_jail), read-only, their secrets masked.
    sharing = seal.shared_binds(shared, profile.policy.deny_read, empty_dir(), empty_file())
    mounts += [Mount(target=target, source=src, type="bind", read_only=ro) for src, target, ro in sharing]
    config: dict[str, Any] = {
        "image": image_ref(profile),
        "command": ["sleep", "infinity"],
        "user": KEEPER_USER,
        "labels": owner_labels(jail_id, profile.docker.lifecycle),
        "detach": True,
        "hostname": "sandbox",
        "network_mode": "bridge" if profile.network.mode == "host" else "none",
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],  # Docker's default seccomp profile stays on
        "tmpfs": _tmpfs(profile, exec_user(profile, workspace) if files else None),
        "mounts": mounts,
        "working_dir": ws,
        "environment": {},
        # The daemon removes it by itself if it dies with us or is restarted without us.
        "auto_remove": True,
        **_resources(profile, agent_user is not None, runtime_pids),
    }
    if profile.docker.runtime is not None:  # the engine refuses a name it does not know: never runc instead
        config["runtime"] = profile.docker.runtime
    if agent_user is not None:
        config.update(_agent_config(profile, agent_user, [*(m["Target"] for m in mounts), *config["tmpfs"]]))
    return config


def host_ca_bundle(profile: Profile) -> str | None:
    """The host's CA bundle the jail is to trust (``[docker] ca_certificates = "host"``), its real
    path; ``None`` for the image's own store. Refused unless it is a PEM file of certificates only,
    so a profile cannot hand the jail a key (or any other file) under the name of a bundle."""
    if profile.docker.ca_certificates != "host":
        return None
    named = profile.docker.ca_bundle
    found = str(named) if named is not None else next((p for p in HOST_CA_BUNDLES if os.path.isfile(p)), None)
    if found is None:
        raise InvalidArgument(
            f'docker.ca_certificates = "host", but this host has no CA bundle at {", ".join(HOST_CA_BUNDLES)}: '
            'name it with docker.ca_bundle, or set docker.ca_certificates = "image"',
            key="docker.ca_certificates",
        )
    real = os.path.realpath(found)
    problem = _not_a_bundle(real)
    if problem is not None:
        raise InvalidArgument(f"docker.ca_bundle {found}: {problem}", key="docker.ca_bundle", bundle=found)
    return real


def _not_a_bundle(path: str) -> str | None:
    try:
        with open(path, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                return "not a regular file"
            data = file.read(MAX_CA_BUNDLE + 1)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if len(data) > MAX_CA_BUNDLE:
        return f"larger than {MAX_CA_BUNDLE >> 20} MiB: not a CA bundle"
    if b"PRIVATE KEY" in data:
        return "holds a private key: a CA bundle holds certificates only"
    if b"-----BEGIN CERTIFICATE-----" not in data:
        return "holds no PEM certificate"
    return None


def ca_env(profile: Profile) -> dict[str, str]:
    """The variables that point every client at the host's bundle (none for the image's store);
    a name the profile's ``env.set`` gives keeps the profile's value."""
    if profile.docker.ca_certificates != "host":
        return {}
    return {name: JAIL_CA_BUNDLE for name in CA_VARIABLES if name not in profile.env.set}


def _agent_config(profile: Profile, user: str, targets: Sequence[str]) -> dict[str, Any]:
    cpu = profile.limits.cpu_time_s
    # detach=False with stdin_open: stdin is attachable and closed when we detach (StdinOnce),
    # so the agent ends the container if the executor dies. The image's interpreter by its
    # absolute path, once no mount (``targets``) can shadow it: never found through a PATH.
    return {
        "entrypoint": [jailpython.image_python(targets)],
        "user": user,
        "stdin_open": True,
        "detach": False,
        # The last argument is the socket to connect to (none: the attach stream, see .links).
        "command": ["-I", "-S", "-c", AGENT_PROGRAM, "" if cpu is None else str(cpu), ""],
    }


def with_agent_socket(config: dict[str, Any], folder: Path, socket_path: str) -> dict[str, Any]:
    """A warm container's ``config`` with our socket's directory bound read-only for its agent.

    ``socket_path`` is where the agent finds the socket in the container (see :mod:`.links`). A
    local engine runs on this kernel, so the agent also gets the bubblewrap jail's seccomp filter
    to stack on Docker's default profile (none where libseccomp is missing: Docker's alone).
    """
    target = socket_path.rpartition("/")[0]
    mount = Mount(target=target, source=str(folder), type="bind", read_only=True)
    command = [*config["command"][:-1], socket_path, seccomp.encoded() or ""]
    return {**config, "mounts": [*config["mounts"], mount], "command": command}


def _untracked_mounts(workspace: Path, untracked: Sequence[str]) -> list[Mount]:
    """The paths the private copy left out (``mount.exclude``, as :class:`~sandbox.mounts.CopyTree`
    found them at copy-in), bound read-only from the host; the daemon mounts a parent before its
    children whatever the order, so they cover their mount points."""
    paths = [str(workspace / rel) for rel in untracked]
    return [Mount(target=path, source=path, type="bind", read_only=True) for path in paths]


def exec_user(profile: Profile, workspace: Path) -> str:
    """The uid:gid commands run as: the workspace owner's, so files stay theirs.

    A root-owned workspace (the caller is root) gets the profile's user instead (1000:1000 by
    default): the jail never runs commands as uid 0.
    """
    if profile.docker.user != f"{SANDBOX_UID}:{SANDBOX_GID}":
        return profile.docker.user
    st = workspace.stat()
    if st.st_uid == 0:
        return profile.docker.user
    return f"{st.st_uid}:{st.st_gid}"


def uid_gid(user: str) -> tuple[int, int]:
    uid, _, gid = user.partition(":")
    try:
        return int(uid), int(gid or uid)
    except ValueError:
        raise InvalidArgument(f"docker.user must be numeric uid:gid, got {user!r}", user=user) from None


def for_remote_engine(
    config: dict[str, Any], workspace_mount: Mount, user: str, scratch: Path | None = None
) -> dict[str, Any]:
    """``config`` for an engine that cannot see this host's files: no bind at all.

    The workspace is ``workspace_mount`` (the jail's volume, filled through the archive API, see
    :mod:`.archive`); the paths a copy leaves out and the sealing's masks are not bound (the copy
    has neither: their empty mount points stay empty); the scratch directory is a tmpfs of the
    command uid's, private to the container.
    """
    mounts = [m for m in config["mounts"] if m.get("Type") != "bind"]
    tmpfs = dict(config["tmpfs"])
    if scratch is not None:
        uid, gid = uid_gid(user)
        # The engine's memory: the caps ``_tmpfs`` gave /tmp (limits.tmp_size, its inode cap) bound it too.
        caps = "".join(f",{opt}" for opt in tmpfs.get("/tmp", "").split(",") if opt.startswith(("size=", "nr_inodes=")))
        tmpfs[str(scratch)] = f"rw,nosuid,nodev,mode=0700,uid={uid},gid={gid}{caps}"
    return {**config, "mounts": [workspace_mount, *mounts], "tmpfs": tmpfs}
