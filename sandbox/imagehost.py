"""What an image build asks of this host, and how it tells the operator what to fix.

:mod:`sandbox.image` builds the images; this module gets it what it needs from the machine it
runs on: packages installed with apt-get (``debootstrap`` for the offline path), the proxy the
host's apt goes through, and a Docker daemon that answers. A problem here is the operator's to fix
(install a package, start a daemon, join a group), so it is one line that says how:
:class:`BuildError`, which every step of a build raises. Apart from the build because none of it
knows what an image is: it is the host side of the work.

Set-up: run as root, a build installs what it lacks with apt-get (``debootstrap`` for the offline
path; ``docker.io`` and a running dockerd through ``dockerd-up.sh`` when no daemon answers);
otherwise the error names the package to install. Why no daemon answers is told apart: a socket
this user may not open, an engine installed but not running, or none installed.

The docker SDK is imported when a build runs.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import re
import shutil
import stat
import subprocess
from typing import TYPE_CHECKING

from sandbox.errors import BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import Iterator

    import docker

APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
DOCKER_SOCKET = "/var/run/docker.sock"
ENGINE_DIRS = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # where a package puts an engine


class BuildError(BackendUnavailable):
    """Something the operator must fix (install a package, start a daemon); said in one line."""


def log(message: str) -> None:
    print(f"[image] {message}", flush=True)  # noqa: T201 - the build reports its progress


# ---------------------------------------------------------------- packages


def is_root() -> bool:
    return os.geteuid() == 0


def ensure_command(command: str, package: str, why: str) -> str:
    """The path of ``command``; installed with apt-get when we are root, else a message naming the package."""
    found = shutil.which(command)
    if found:
        return found
    if not is_root():
        raise BuildError(f"{command} is not installed ({why}): sudo apt-get install {package}", package=package)
    log(f"{command} is not installed ({why}); installing {package} with apt-get")
    apt_install(package)
    found = shutil.which(command) or shutil.which(command, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if found is None:
        raise BuildError(f"apt-get installed {package} but {command} is still not found", package=package)
    return found


def apt_install(package: str) -> None:
    """``apt-get install``; the package lists are fetched only if the first attempt cannot find it."""
    if shutil.which("apt-get") is None:
        raise BuildError(
            f"{package} is needed and this host has no apt-get: install {package} yourself", package=package
        )
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package]
    if _apt(install) != 0 and (_apt(["apt-get", "update", "-qq"]) != 0 or _apt(install) != 0):
        raise BuildError(f"apt-get could not install {package}; see the output above", package=package)


def _apt(argv: list[str]) -> int:
    try:
        return subprocess.run(argv, env={**os.environ, **APT_ENV}, check=False).returncode
    except OSError as exc:
        raise BuildError(f"cannot run {argv[0]}: {exc.strerror}") from exc


def apt_proxy() -> dict[str, str]:
    """The host's proxy for apt, as ``http_proxy``/``https_proxy`` (debootstrap's wget and apt in a build)."""
    found = {name: os.environ[name] for name in ("http_proxy", "https_proxy") if os.environ.get(name)}
    try:
        dump = subprocess.run(["apt-config", "dump"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return found
    for scheme in ("http", "https"):
        match = re.search(rf'^Acquire::{scheme}::Proxy\s+"([^"]+)";', dump, re.MULTILINE)
        if match:
            found.setdefault(f"{scheme}_proxy", match.group(1))
    return found


# ---------------------------------------------------------------- daemon


def connect() -> docker.DockerClient:
    """A client of a daemon that answers; as root, start one (installing docker.io) if none does."""
    client, problem = _try_connect()
    if client is not None:
        return client
    if os.environ.get("DOCKER_HOST"):
        denied = f"; {_socket_hint(_socket_path())}" if _denied(problem, _socket_path()) else ""
        raise BuildError(f"DOCKER_HOST={os.environ['DOCKER_HOST']} does not answer ({problem}){denied}")
    if not is_root():
        raise BuildError(f"no Docker daemon answers ({problem}); {_daemon_hint(problem)}")
    log(f"no Docker daemon answers ({problem}); starting one")
    with importlib.resources.as_file(importlib.resources.files("sandbox") / "images" / "dockerd-up.sh") as script:
        try:
            # An image build needs no gVisor: the script registers runsc only when asked (make test does).
            env = {**os.environ, "SANDBOX_GVISOR": os.environ.get("SANDBOX_GVISOR", "0")}
            started = subprocess.run(["bash", str(script)], check=False, env=env).returncode == 0
        except OSError as exc:
            raise BuildError(f"cannot run dockerd-up.sh: {exc.strerror}") from exc
    if not started:
        raise BuildError("no Docker daemon could be started; see the lines above")
    client, problem = _try_connect()
    if client is None:
        raise BuildError(f"dockerd started but does not answer ({problem})")
    return client


def _daemon_hint(problem: str) -> str:
    """Why no daemon answers, told apart: a socket this user may not open (the engine is there), an
    engine installed but not running, or none installed. Looked up beyond this user's PATH, which
    often lacks /usr/sbin (where dockerd is), so an ordinary user is not told to install what is there."""
    socket_path = _socket_path()
    if _denied(problem, socket_path):
        return _socket_hint(socket_path)
    if _engine("dockerd") is not None:
        return "Docker is installed but its daemon is not running: sudo systemctl start docker (or set DOCKER_HOST)"
    if _engine("podman") is not None:
        return (
            "docker.io is not installed (sudo apt-get install docker.io); Podman is: systemctl --user start "
            "podman.socket, then DOCKER_HOST=unix://$XDG_RUNTIME_DIR/podman/podman.sock"
        )
    return "docker.io is not installed: sudo apt-get install docker.io (or Podman: sudo apt-get install podman)"


def _socket_path() -> str | None:
    """The unix socket the SDK tries (``DOCKER_HOST``'s, else Docker's default); ``None`` for tcp/ssh."""
    host = os.environ.get("DOCKER_HOST") or f"unix://{DOCKER_SOCKET}"
    return host.removeprefix("unix://") if host.startswith("unix://") else None


def _denied(problem: str, socket_path: str | None) -> bool:
    if "Permission denied" in problem or "PermissionError" in problem:
        return True
    return socket_path is not None and os.path.exists(socket_path) and not os.access(socket_path, os.R_OK | os.W_OK)


def _socket_hint(socket_path: str | None) -> str:
    where = socket_path or "the engine's socket"
    try:
        import grp  # POSIX only (a Windows engine's pipe has no group): imported where a unix socket is

        st = os.stat(where)
        owner = f" (group {grp.getgrgid(st.st_gid).gr_name}, mode {stat.S_IMODE(st.st_mode):o})"
    except (ImportError, OSError, KeyError):
        owner = ""
    return (
        f"the engine is there but this user may not open {where}{owner}: sudo usermod -aG docker $USER, "
        "then log in again (or rootless Podman: systemctl --user start podman.socket, "
        "DOCKER_HOST=unix://$XDG_RUNTIME_DIR/podman/podman.sock)"
    )


def _engine(command: str) -> str | None:
    return shutil.which(command, path=os.pathsep.join([os.environ.get("PATH", ""), ENGINE_DIRS]))


def _try_connect() -> tuple[docker.DockerClient | None, str]:
    try:
        import docker
    except ModuleNotFoundError:
        raise BuildError("the docker SDK is not installed: pip install 'sandbox[docker]'") from None
    import requests

    try:
        client = docker.from_env(timeout=600)
    except docker.errors.DockerException as exc:
        return None, str(exc).splitlines()[0][:200]
    try:
        client.ping()
    except (docker.errors.DockerException, requests.RequestException) as exc:
        client.close()
        return None, str(exc).splitlines()[0][:200]
    return client, ""


@contextlib.contextmanager
def docker_errors(what: str) -> Iterator[None]:
    """docker.errors.* and connection errors during a build -> BuildError naming the step."""
    import docker.errors
    import requests

    try:
        yield
    except (docker.errors.DockerException, requests.RequestException) as exc:
        raise BuildError(f"{what}: {str(exc).splitlines()[0][:300]}") from exc


def current(client: docker.DockerClient, ref: str, want: str) -> bool:
    import docker.errors

    try:
        labels = client.images.get(ref).labels or {}
    except docker.errors.ImageNotFound:
        return False
    return labels.get("sandbox.image.recipe") == want


def present(client: docker.DockerClient, ref: str) -> bool:
    import docker.errors

    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True
