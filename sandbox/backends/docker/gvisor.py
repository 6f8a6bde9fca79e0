"""gVisor (``runsc``) as the runtime of the Docker jail's containers (``[docker] runtime = "runsc"``).

Under runc a command's system calls go to the host's kernel, filtered by seccomp: a kernel bug
reachable through an allowed call is a way out. Under gVisor they go to the **Sentry**, a kernel
written in Go that runs in user space (as the container's first process on the host) and serves
them itself; the Sentry reaches the host's kernel through a short list of calls of its own, under
a seccomp filter of gVisor's, and opens files through the **gofer**, a second process of the
container. That is the ``kernel-isolated`` guarantee: what the command sees (``uname -r``,
``/proc/version``, ``dmesg``) is the Sentry's, not the host's.

What it changes for this backend, as :func:`apply` reports it (``sandbox check``):

* The runtime is the engine's by name (``docker info``: Runtimes). A name it does not know is
  refused before a container is made (:func:`resolve`), never run on the default runtime; the
  runtime's own options are the engine's (``runtimeArgs`` in ``daemon.json``; images/dockerd-up.sh
  registers ``runsc`` with those this host needs) and are read back from ``docker info``.
* The warm agent's socket link works when the runtime lets the sandbox reach host sockets
  (``--host-uds=open``): pipe ends pass with ``SCM_RIGHTS`` as under runc, but the connection
  comes from the gofer, not the container's first process, so :mod:`.links` takes the gofer's
  pid as the container's (a sibling of the Sentry under the same shim). Without it the calls take
  the attach stream, saying why.
* Limits: the host's cgroups hold the Sentry, not the commands, so a memory or pids limit ends
  the whole sandbox when reached (the Sentry's own threads count against ``pids``): the call
  fails with BACKEND_UNAVAILABLE, out of memory or killed, and the next call gets a new
  container. The rlimits (file size, CPU time, open files) and the tmpfs size are the Sentry's own.
* Docker's seccomp profile applies inside the sandbox only with ``--oci-seccomp``; the network
  is gVisor's own stack (``--network=sandbox``), or none at all (``--network=none``: loopback
  only, then ``network.mode = "host"`` is refused); ``net-transparent`` is not possible (the veth
  pair goes into a network namespace the Sentry's stack does not use).

Podman's Docker-compatible API does not read ``HostConfig.Runtime`` (its compat create never
passes it on): a runtime a profile names is refused there unless it is Podman's default
(``engine.runtime`` in containers.conf), which then needs no naming.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sandbox.errors import BackendUnavailable, InvalidArgument
from sandbox.guarantees import Enforcement

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sandbox.guarantees import Report
    from sandbox.profile import Profile

RUNSC = "runsc"
RUNSC_PATHS = ("/usr/bin/runsc", "/usr/local/bin/runsc")
# The Sentry's and the gofer's own threads are in the container's pids cgroup: about 50 idle here
# (runsc 20221219, ptrace), more under load. The profile's limit is for the commands: this is added.
SENTRY_PIDS = 64
ENDS_SANDBOX = "gVisor: reaching the memory or pids limit ends the whole sandbox, its Sentry with it"
SENTRY_ENDS = "reaching it ends the whole sandbox (the host's cgroup holds the Sentry, not the commands)"
NO_CPU_RLIMIT = (
    "gVisor arms RLIMIT_CPU only in the process that sets it: a command's forked processes inherit the "
    "limit unenforced (measured with runsc 20221219); the cgroup CPU quota still caps the share"
)
OLD_STATX = "20221219"  # a release whose statx refuses AT_NO_AUTOMOUNT, which coreutils 9 passes
RUNSC_ARGS_HINT = '["--platform=ptrace", "--network=none", "--host-uds=open", "--oci-seccomp"]'


@dataclass(frozen=True)
class RuntimeChoice:
    """An OCI runtime as the engine registered it: its name, its binary and the options it adds."""

    name: str
    path: str = ""
    args: tuple[str, ...] = ()
    named: bool = False  # the profile named it (else: the engine's default)

    @property
    def gvisor(self) -> bool:
        return os.path.basename(self.path or self.name) == RUNSC

    def option(self, flag: str, default: str = "") -> str:
        """The value of runsc's ``--flag=value`` (or ``--flag value``) among the runtime's options."""
        found = default
        args = list(self.args)
        for index, arg in enumerate(args):
            if arg.lstrip("-") == flag and index + 1 < len(args):
                found = args[index + 1]
            elif arg.lstrip("-").startswith(f"{flag}="):
                found = arg.split("=", 1)[1]
        return found

    def switched(self, flag: str) -> bool:
        return self.option(flag, "false") not in {"false", "0"} or any(a.lstrip("-") == flag for a in self.args)

    @property
    def platform(self) -> str:
        return self.option("platform") or "runsc's default (ptrace before release 20230417, systrap since)"

    @property
    def network(self) -> str:
        return self.option("network", "sandbox")

    @property
    def host_uds(self) -> str:
        return "all" if self.switched("fsgofer-host-uds") else self.option("host-uds", "none")

    @property
    def oci_seccomp(self) -> bool:
        return self.switched("oci-seccomp")

    def to_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"name": self.name, "path": self.path, "args": list(self.args)}
        if self.gvisor:
            found.update(platform=self.platform, network=self.network, host_uds=self.host_uds)
            found["oci_seccomp"] = self.oci_seccomp
        return found


def registered(info: Mapping[str, Any]) -> dict[str, RuntimeChoice]:
    """The engine's runtimes (``docker info``: Runtimes), by name."""
    found = {}
    for name, spec in (info.get("Runtimes") or {}).items():
        spec = spec or {}
        args = tuple(str(a) for a in spec.get("runtimeArgs") or spec.get("RuntimeArgs") or ())
        found[str(name)] = RuntimeChoice(str(name), str(spec.get("path") or spec.get("Path") or ""), args)
    return found


def resolve(info: Mapping[str, Any], wanted: str | None, podman: bool = False) -> RuntimeChoice:
    """The runtime a profile's containers run under (``wanted``; ``None``: the engine's default).

    A name the engine has not registered is refused, and on Podman any name but its default
    (its compatible API would ignore it and run the default): never the default instead.
    """
    known = registered(info)
    default = str(info.get("DefaultRuntime") or "runc")
    name = wanted or default
    if wanted is not None and podman and wanted != default:
        raise BackendUnavailable(
            f"docker.runtime = {wanted!r}: Podman's Docker-compatible API ignores a container's runtime "
            f"(it would run {default!r}); make {wanted!r} Podman's default (engine.runtime in "
            "containers.conf) and leave docker.runtime unset, or use Docker",
            backend="docker",
            runtime=wanted,
            default=default,
        )
    if name not in known and wanted is not None:
        raise BackendUnavailable(unregistered(wanted, known, podman), backend="docker", runtime=wanted, known=[*known])
    choice = known.get(name, RuntimeChoice(name))
    return RuntimeChoice(choice.name, choice.path, choice.args, named=wanted is not None)


def unregistered(wanted: str, known: Mapping[str, RuntimeChoice], podman: bool = False) -> str:
    where = (
        "containers.conf ([engine.runtimes])"
        if podman
        else f'/etc/docker/daemon.json ("runtimes": {{"{wanted}": {{"path": ..., "runtimeArgs": [...]}}}})'
    )
    have = ", ".join(sorted(known)) or "none"
    how = f", e.g. with runtimeArgs {RUNSC_ARGS_HINT} (images/dockerd-up.sh does it as root)" if wanted == RUNSC else ""
    how = "" if podman else how
    return (
        f"docker.runtime = {wanted!r}, but the engine has no runtime of that name (it has: {have}); "
        f"register it in {where} and reload the engine{how}"
    )


@functools.cache
def installed() -> dict[str, Any]:
    """runsc on this host: its path and version (``{}``: not installed)."""
    path = shutil.which(RUNSC) or next((p for p in RUNSC_PATHS if os.access(p, os.X_OK)), None)
    if path is None:
        return {}
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    version = out.split("\n", 1)[0].removeprefix("runsc version ").strip() or "unknown"
    return {"path": path, "version": version}


def describe(info: Mapping[str, Any], remote: str | None) -> dict[str, Any]:
    """What ``sandbox check`` says of gVisor here: installed, registered (under which names), how."""
    found = {name: choice for name, choice in registered(info).items() if choice.gvisor}
    local = installed() if remote is None else {}
    return {
        "installed": local or (f"unknown: {remote}" if remote else False),
        "registered": {name: choice.to_dict() for name, choice in found.items()} or False,
    }


def status(found: Mapping[str, Any]) -> str:
    """:func:`describe`'s answer in a line, for ``sandbox check``'s text."""
    installed, registered = found["installed"], found["registered"]
    if isinstance(installed, dict):
        where = f"runsc {installed['version']} is installed ({installed['path']})"
    else:
        where = f"runsc: {installed}" if installed else "runsc is not installed here"
    if not registered:
        return f'gVisor: {where}, not registered with the engine ([docker] runtime = "runsc" is refused)'
    names = "; ".join(
        f"{name}: platform {spec['platform']}, network {spec['network']}, host sockets {spec['host_uds']}"
        + (", the engine's seccomp profile inside" if spec["oci_seccomp"] else "")
        for name, spec in registered.items()
    )
    return f"gVisor: {where}, registered with the engine as {names}"


def apply(report: Report, choice: RuntimeChoice) -> None:
    """``report`` (the engine's, under runc) made true of containers run by ``choice``."""
    report.details["runtime"] = choice.to_dict()
    if not choice.gvisor:
        report.grant("kernel-isolated", False, f"commands make system calls to the host's kernel ({choice.name})")
        return
    report.grant("kernel-isolated", True)
    report.details["kernel"] = "gVisor's Sentry (the host's is not reachable)"
    if not choice.oci_seccomp:
        report.grant(
            "seccomp",
            False,
            f"{choice.name} runs without --oci-seccomp: the engine's profile is not applied in the sandbox "
            "(the Sentry's own filter guards the host's kernel)",
        )
    report.grant("net-transparent", False, "the Sentry's network stack does not use the container's network namespace")
    report.grant("cpu-limit", False, NO_CPU_RLIMIT)
    if choice.network == "none":
        report.details["network"] = f"{choice.name} --network=none: loopback only, network.mode = 'host' is refused"
    report.limits = {**report.limits, **_limits(report)}
    report.notes += notes(choice)


def _limits(report: Report) -> dict[str, Enforcement]:
    """The cgroup limits as gVisor enforces them: on the whole sandbox, which they end."""
    found: dict[str, Enforcement] = {
        "cpu_time_s": Enforcement(None, why_not=NO_CPU_RLIMIT),
        "tmp_size": Enforcement("tmpfs size in the Sentry (its byte count; nr_inodes is not enforced)", "call"),
    }
    for limit, guarantee in (("memory", "memory-limit"), ("pids", "pids-limit")):
        if report.guarantees.get(guarantee):
            extra = f" (+{SENTRY_PIDS} for the Sentry's own threads)" if limit == "pids" else ""
            found[limit] = Enforcement(f"cgroup {limit} of the sandbox{extra}: {SENTRY_ENDS}", "call")
    return found


def notes(choice: RuntimeChoice) -> list[str]:
    """What gVisor adds, and what it takes away or changes, for ``sandbox check``'s notes."""
    found = [
        f"runtime {choice.name} is gVisor: the commands' system calls are served by the Sentry, a user-space "
        f"kernel (platform {choice.platform}); the host's kernel is reached only by the Sentry and its gofer, "
        "through gVisor's own seccomp filter",
        "memory and pids limits hold the whole sandbox: reaching one ends it (the call fails with "
        f"BACKEND_UNAVAILABLE, the next gets a new container); the Sentry's own threads count against pids "
        f"(about 50 idle: {SENTRY_PIDS} are added to the profile's limit)",
        "limits.cpu_time_s is not enforced (see its line): a profile that sets it is refused here; leave it "
        "at the schema's default (best effort) and bound the call by its timeout",
        "the Sentry implements most of Linux's calls, not all: io_uring, some ioctls and /proc, /sys files differ",
    ]
    if OLD_STATX in str(installed().get("version", "")):
        found.append(
            f"runsc {OLD_STATX} (Debian 12's) refuses statx with AT_NO_AUTOMOUNT (EINVAL): coreutils' ls "
            "of a named path, ls -l and stat fail in the jail; the file tools and Python are unaffected"
        )
    if choice.host_uds not in {"open", "all"}:
        found.append(f"{choice.name} runs without --host-uds=open: warm calls take the attach stream")
    if choice.network == "none":
        found.append(f"{choice.name} runs with --network=none: no network but loopback, whatever the container's")
    return found


def refusal(profile: Profile, choice: RuntimeChoice) -> None:
    """Refuse what ``choice`` cannot give a profile (a network it has not got), naming the reason."""
    if not choice.gvisor:
        return
    if profile.network.mode == "host" and choice.network == "none":
        raise InvalidArgument(
            f"network.mode = 'host' under {choice.name}, which the engine runs with --network=none (loopback "
            f"only); register it with --network=sandbox where gVisor's network stack starts, or use runc",
            backend="docker",
            runtime=choice.name,
            key="network.mode",
        )
    if profile.network.transparent:
        raise InvalidArgument(
            f"network.transparent under {choice.name}: the Sentry's network stack does not use the "
            "container's network namespace, where the transparent proxy's veth pair goes",
            backend="docker",
            runtime=choice.name,
            key="network.transparent",
        )


def socket_refusal(choice: RuntimeChoice | None) -> str | None:
    """Why a container of ``choice`` cannot take the agent's socket link (``None``: it can)."""
    if choice is None or not choice.gvisor or choice.host_uds in {"open", "all"}:
        return None
    return f"{choice.name} runs without --host-uds=open: the sandbox cannot connect to a host socket"
