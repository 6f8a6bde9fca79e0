"""The Docker client and the boundary where its errors become ours.

Every SDK call of the backend runs inside :func:`translated` (or :func:`run_sync`, which runs
it in a worker thread): ``docker.errors.*`` and ``requests``' connection errors leave it as
BACKEND_UNAVAILABLE with what we were doing, so none of them crosses a public call. A call that
expects a particular failure passes its own entry (``{docker.errors.NotFound: ...}``) ahead of
the general table, rather than translating first and testing a status code afterwards.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import socket
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import anyio.to_thread
import docker
import docker.errors

from sandbox import __version__
from sandbox.errors import BackendUnavailable, SandboxError
from sandbox.image import build_command

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from sandbox.profile import Profile

T = TypeVar("T")

IMAGE_REPOSITORY = "sandbox-runtime"
DEFAULT_IMAGE = f"{IMAGE_REPOSITORY}:{__version__}"
IMAGE_VERSION_LABEL = "sandbox.image.version"
API_TIMEOUT_S = 30  # every SDK request; a dead daemon fails at once, a wedged one after this
PROBE_TIMEOUT_S = 3

Translation: TypeAlias = "Callable[[str, Any], SandboxError]"
"""Makes our error from what we were doing and the SDK's exception."""


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


def _api_error(what: str, exc: docker.errors.APIError) -> SandboxError:
    return BackendUnavailable(f"{what}: {exc.explanation or exc}", backend="docker", status=exc.status_code)


def _unreachable(what: str, exc: BaseException) -> SandboxError:
    return BackendUnavailable(f"{what}: the Docker daemon is unreachable ({_short(exc)})", backend="docker")


# Most specific first: the first class the exception is an instance of translates it.
ERRORS: Mapping[type[BaseException], Translation] = {
    docker.errors.APIError: _api_error,
    docker.errors.DockerException: _unreachable,
    OSError: _unreachable,  # requests' connection errors are OSErrors
}


@contextlib.contextmanager
def translated(what: str, specific: Mapping[type[BaseException], Translation] | None = None) -> Iterator[None]:
    """Translate SDK and connection errors raised in the block: ``specific`` first, then :data:`ERRORS`."""
    try:
        yield
    except SandboxError:
        raise
    except Exception as exc:
        for kind, translate in itertools.chain((specific or {}).items(), ERRORS.items()):
            if isinstance(exc, kind):
                raise translate(what, exc) from exc
        raise


async def run_sync(what: str, func: Callable[..., T], *args: Any) -> T:
    """Run a blocking SDK call in a worker thread, its errors translated."""

    def call() -> T:
        with translated(what):
            return func(*args)

    return await anyio.to_thread.run_sync(call)


def quietly(func: Callable[[], None]) -> None:
    """Run an SDK call whose failure nobody could act on (a thread's best-effort cleanup)."""
    with contextlib.suppress(docker.errors.DockerException, OSError):
        func()


def _check_unix_socket() -> None:
    """Fail fast, and without the SDK, when a local daemon's socket does not answer.

    The SDK leaks the socket of a failed unix connect; trying it ourselves first avoids that.
    """
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://"):
        return
    path = host.removeprefix("unix://")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe_sock:
        probe_sock.settimeout(PROBE_TIMEOUT_S)
        try:
            probe_sock.connect(path)
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot reach the Docker daemon: the Docker daemon is unreachable at {path} "
                f"({exc.strerror or exc}); start dockerd or set DOCKER_HOST",
                backend="docker",
                host=host,
            ) from None


def connect(timeout: float = API_TIMEOUT_S) -> docker.DockerClient:
    """A client from the usual environment (DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH)."""
    _check_unix_socket()
    with translated("cannot reach the Docker daemon"), contextlib.ExitStack() as cleanup_on_fail:
        client = docker.from_env(timeout=int(math.ceil(timeout)))
        cleanup_on_fail.callback(client.close)
        client.ping()
        cleanup_on_fail.pop_all()
    return client


def image_ref(profile: Profile) -> str:
    return profile.docker.image or DEFAULT_IMAGE


def _missing_image(ref: str) -> Translation:
    def translate(_what: str, _exc: BaseException) -> SandboxError:
        return BackendUnavailable(
            f"the sandbox image {ref} is not on this Docker host: run `{build_command(ref)}` "
            "(`make image` in a checkout)",
            backend="docker",
            image=ref,
        )

    return translate


def check_image(client: docker.DockerClient, ref: str) -> None:
    """Refuse a missing image (say how to build it) or one built for another version."""
    # NotFound, not only ImageNotFound: the SDK picks the subclass from the daemon's wording.
    with translated(f"cannot inspect image {ref}", {docker.errors.NotFound: _missing_image(ref)}):
        labels = client.images.get(ref).labels or {}
    found = labels.get(IMAGE_VERSION_LABEL)
    # Our image must match this version; a custom image is refused only if it says it is ours.
    if found != __version__ and (found is not None or ref == DEFAULT_IMAGE):
        raise BackendUnavailable(
            f"image {ref} was built for sandbox {found or 'unknown'}, this is {__version__}: "
            f"run `{build_command(ref)}` to rebuild it",
            backend="docker",
            image=ref,
            found=found,
            expected=__version__,
        )


def remove_by_id(client: docker.DockerClient, cid: str) -> None:
    """Force-remove one container; one that is gone, or being auto-removed, is no error."""
    try:
        client.api.remove_container(cid, force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code != 409:  # 409 (the SDK has no class for it): auto-remove is already at it
            raise
