"""The Docker client and the boundary where its errors become ours.

Every SDK call of the backend runs inside :func:`translated` (or :func:`run_sync`, which runs
it in a worker thread): ``docker.errors.*`` and ``requests``' connection errors leave it as
BACKEND_UNAVAILABLE with what we were doing, so none of them crosses a public call. A call that
expects a particular failure passes its own entry (``{docker.errors.NotFound: ...}``) ahead of
the general table, rather than translating first and testing a status code afterwards.

Which engine: :func:`engine_of` reads a profile's ``[docker]`` table (``host`` and its TLS files)
or leaves it to the environment, as ``docker.from_env`` reads it; :func:`connect` is the one
place a client is made. An engine reached over ``tcp://`` or ``ssh://`` (or declared remote) does
not see this host's files: the backend then moves the workspace through the archive API
(:mod:`.archive`). A failed TLS handshake (the wrong CA, no client certificate) is
BACKEND_UNAVAILABLE naming the TLS reason, not a bare "unreachable".
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import math
import os
import socket
import ssl
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import anyio.to_thread
import docker
import docker.errors
import docker.tls
import docker.utils

from sandbox import __version__
from sandbox.errors import BackendUnavailable, SandboxError
from sandbox.image import build_command

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from pathlib import Path

    from sandbox.profile import Profile
    from sandbox.profile_tables import Docker as DockerSettings

T = TypeVar("T")

IMAGE_REPOSITORY = "sandbox-runtime"
DEFAULT_IMAGE = f"{IMAGE_REPOSITORY}:{__version__}"
IMAGE_VERSION_LABEL = "sandbox.image.version"
API_TIMEOUT_S = 30  # every SDK request; a dead daemon fails at once, a wedged one after this
PROBE_TIMEOUT_S = 3
DEFAULT_HOST = "unix:///var/run/docker.sock"

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


@dataclass(frozen=True)
class Engine:
    """The engine a client talks to: its address, its TLS settings, and whether it sees our files.

    ``host`` is ``None`` for the environment's engine (``docker.from_env`` reads ``DOCKER_HOST``,
    ``DOCKER_TLS_VERIFY`` and ``DOCKER_CERT_PATH`` itself); ``remote`` says why the engine cannot
    see this host's paths, or is ``None`` for a local engine.
    """

    host: str | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_verify: bool | None = None
    remote: str | None = None

    @property
    def address(self) -> str:
        return self.host or os.environ.get("DOCKER_HOST") or DEFAULT_HOST

    @property
    def tls(self) -> bool:
        return any(v is not None for v in (self.tls_ca, self.tls_cert, self.tls_key, self.tls_verify))


def engine_of(settings: DockerSettings | None = None) -> Engine:
    """The engine of a profile's ``[docker]`` table (``None``: the environment's)."""
    if settings is None or settings.host is None:
        engine = Engine()
        declared = settings.remote if settings is not None else "auto"
    else:
        engine = Engine(settings.host, settings.tls_ca, settings.tls_cert, settings.tls_key, settings.tls_verify)
        declared = settings.remote
    return replace(engine, remote=_remote(engine.address, declared))


def _remote(address: str, declared: bool | str) -> str | None:
    """Why an engine at ``address`` cannot see this host's files, or ``None`` when it can."""
    scheme = address.partition("://")[0]
    if declared is True:
        return f"docker.remote = true for {address}"
    if declared is False:
        return None
    if scheme in {"unix", "npipe"}:
        return None
    return f"the engine at {address} is reached over {scheme}://"


def _check_unix_socket(address: str) -> None:
    """Fail fast, and without the SDK, when a local daemon's socket does not answer.

    The SDK leaks the socket of a failed unix connect; trying it ourselves first avoids that.
    """
    if not address.startswith("unix://"):
        return
    path = address.removeprefix("unix://")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe_sock:
        probe_sock.settimeout(PROBE_TIMEOUT_S)
        try:
            probe_sock.connect(path)
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot reach the Docker daemon: the Docker daemon is unreachable at {path} "
                f"({exc.strerror or exc}); start dockerd or set DOCKER_HOST",
                backend="docker",
                host=address,
            ) from None


def _tls_config(engine: Engine) -> docker.tls.TLSConfig | None:
    """The profile's TLS settings as the SDK takes them; a missing file is named, not guessed at."""
    if not engine.tls:
        return None
    for name in ("tls_ca", "tls_cert", "tls_key"):
        path = getattr(engine, name)
        if path is not None and not os.path.isfile(path):
            raise BackendUnavailable(
                f"docker.{name} {path} is not a readable file: the TLS connection to {engine.address} cannot be set up",
                backend="docker",
                host=engine.address,
            )
    cert = (str(engine.tls_cert), str(engine.tls_key)) if engine.tls_cert and engine.tls_key else None
    verify = engine.tls_verify if engine.tls_verify is not None else engine.tls_ca is not None
    with translated(f"the TLS settings for {engine.address} are unusable"):
        return docker.tls.TLSConfig(
            client_cert=cert, ca_cert=str(engine.tls_ca) if engine.tls_ca else None, verify=verify
        )


def _tls_failure(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error somewhere in ``exc``'s chain (requests and urllib3 wrap it twice or more)."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            return current
        stack += [a for a in current.args if isinstance(a, BaseException)]
        stack += [e for e in (current.__cause__, current.__context__) if e is not None]
        reason = getattr(current, "reason", None)
        if isinstance(reason, BaseException):
            stack.append(reason)
    return None


def _tls_or_unreachable(engine: Engine) -> Translation:
    def translate(what: str, exc: BaseException) -> SandboxError:
        failure = _tls_failure(exc)
        if failure is None:
            return _unreachable(what, exc)
        reason = getattr(failure, "reason", None) or _short(failure)
        return BackendUnavailable(
            f"{what}: the TLS handshake with {engine.address} failed ({reason}); check the engine's CA "
            "(docker.tls_ca or DOCKER_CERT_PATH/ca.pem) and our client certificate and key",
            backend="docker",
            host=engine.address,
            tls=str(reason),
        )

    return translate


class TLSStream:
    """A hijacked TLS connection (attach, exec) as docker-py's frame reader needs it.

    ``docker.utils.socket.read`` polls the socket's fd before each ``recv``; a TLS record that
    carried a frame's header and its payload leaves the payload decrypted inside the SSL object
    after the header's ``recv(8)``, and the fd stays silent: the read would wait for bytes that
    have already come. While the SSL object holds such bytes, :meth:`fileno` names a pipe that is
    always readable instead. Writes go to the SSL socket itself (``_sock``, as for docker-py's own
    ``SocketIO``).
    """

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self._sock = sock
        self.response: Any = None
        self._ready_r, self._ready_w = os.pipe()
        os.write(self._ready_w, b"r")  # never drained: readable for good
        self._closed = False

    def fileno(self) -> int:
        return self._ready_r if self._sock.pending() else self._sock.fileno()

    def recv(self, size: int) -> bytes:
        return self._sock.recv(size)

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)

    def shutdown(self, how: int) -> None:
        self._sock.shutdown(how)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._ready_r)
            os.close(self._ready_w)
            # http.client read the response's headers through a SocketIO of this socket: until that
            # is closed too, closing the socket only marks it, and its fd stays open.
            fp = getattr(getattr(getattr(self.response, "raw", None), "_fp", None), "fp", None)
            with contextlib.suppress(Exception):
                fp.raw.close()  # type: ignore[union-attr]
            self.response = None
        self._sock.close()


class _TLSClient(docker.APIClient):
    """An API client over TLS: its own CA only, and hijacked streams as :class:`TLSStream`.

    requests lets ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` override a session's own ``verify``
    (psf/requests#3829): where they are set (many CI images set them) the engine's certificate
    would be checked against the system's CAs, not the engine's, and fail. Proxies from the
    environment go with them: the docker CLI does not send the engine's traffic through them either.
    """

    @property
    def trust_env(self) -> bool:
        return False

    @trust_env.setter
    def trust_env(self, _value: bool) -> None:
        pass

    def _get_raw_response_socket(self, response: Any) -> Any:
        # Not in docker's type stubs: the method every hijacked stream (attach, exec) comes from.
        sock = getattr(docker.APIClient, "_get_raw_response_socket")(self, response)  # noqa: B009
        if isinstance(sock, ssl.SSLSocket):
            stream = TLSStream(sock)
            stream.response = response  # as docker-py keeps it: collected, it would close the socket
            return stream
        return sock


def _client(engine: Engine, timeout: int) -> docker.DockerClient:
    if engine.host is None:
        params: dict[str, Any] = dict(docker.utils.kwargs_from_env())
    else:
        scheme = engine.host.partition("://")[0]
        # Without paramiko the SDK can still reach ssh:// the docker CLI's way (ssh ... docker system dial-stdio).
        ssh_client = scheme == "ssh" and importlib.util.find_spec("paramiko") is None
        params = {"base_url": engine.host, "tls": _tls_config(engine) or False, "use_ssh_client": ssh_client}
    kind = _TLSClient if isinstance(params.get("tls"), docker.tls.TLSConfig) else docker.APIClient
    # DockerClient() would make a plain APIClient; ours is the same but for whose CAs it trusts.
    client = docker.DockerClient.__new__(docker.DockerClient)
    client.api = kind(timeout=timeout, **params)
    return client


def connect(timeout: float = API_TIMEOUT_S, engine: Engine | None = None) -> docker.DockerClient:
    """A client of ``engine`` (default: the environment's: DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH)."""
    engine = engine or engine_of()
    _check_unix_socket(engine.address)
    tls = _tls_or_unreachable(engine)
    translation = {docker.errors.APIError: _api_error, OSError: tls, docker.errors.DockerException: tls}
    with translated("cannot reach the Docker daemon", translation), contextlib.ExitStack() as cleanup_on_fail:
        client = _client(engine, int(math.ceil(timeout)))
        cleanup_on_fail.callback(client.close)
        client.ping()
        cleanup_on_fail.pop_all()
    return client


def engine_name(version: Mapping[str, Any]) -> str:
    """``Docker Engine 20.10.24``, ``Podman Engine 4.3.1``: the engine's product and version (``client.version()``)."""
    for component in version.get("Components") or []:
        name = str(component.get("Name", ""))
        if name.lower() in {"engine", "podman engine"}:
            product = "Podman Engine" if "podman" in name.lower() else "Docker Engine"
            return f"{product} {component.get('Version', version.get('Version', '?'))}"
    platform = str((version.get("Platform") or {}).get("Name", ""))
    product = "Podman Engine" if "podman" in platform.lower() else "Docker Engine"
    return f"{product} {version.get('Version', '?')}"


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
