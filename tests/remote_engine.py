"""A second dockerd as a "remote" engine for the tests: TLS on a loopback port, blind to the test's files.

:func:`start` makes a throw-away CA, a server certificate for ``127.0.0.1`` and a client
certificate (the ``openssl`` command: the ``cryptography`` package may not be installed), then
starts ``dockerd`` with its own ``--data-root``, ``--exec-root`` (so its own containerd),
``--pidfile`` and configuration, no bridge and no iptables rules (it must not fight the host's
daemon), listening only on ``tcp://127.0.0.1:<port>`` with ``--tlsverify``. It runs in a mount
namespace of its own (``unshare -m``) where a tmpfs covers ``hidden``, the test run's temporary
root: the engine cannot see any workspace a test makes, as an engine on another machine could
not. The sandbox image is loaded into it from the host's daemon (``docker save | docker load``).

Needs root (a second dockerd), ``dockerd``, ``docker``, ``openssl`` and ``unshare``, and the
image built on the host's daemon (``make image``); :class:`Unavailable` says which is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

START_WAIT_S = 60
STOP_WAIT_S = 30


class Unavailable(Exception):
    """Why this host cannot run the remote engine (the tests skip with it)."""


@dataclass
class Certificates:
    """PEM files of one throw-away CA, the engine's certificate and our client certificate."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def cert(self) -> Path:
        return self.folder / "cert.pem"

    @property
    def key(self) -> Path:
        return self.folder / "key.pem"

    @property
    def server_cert(self) -> Path:
        return self.folder / "server-cert.pem"

    @property
    def server_key(self) -> Path:
        return self.folder / "server-key.pem"


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise Unavailable(f"openssl {args[0]} failed: {done.stderr.strip()[:300]}")


def _key(cwd: Path, name: str) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", name, cwd=cwd)


def make_ca(folder: Path, name: str = "sandbox-test-ca") -> Path:
    """A self-signed CA in ``folder`` (``ca.pem``, ``ca-key.pem``)."""
    folder.mkdir(parents=True, exist_ok=True)
    _key(folder, "ca-key.pem")
    _openssl(
        "req", "-x509", "-new", "-key", "ca-key.pem", "-out", "ca.pem", "-days", "2", "-subj", f"/CN={name}",
        cwd=folder,
    )  # fmt: skip
    return folder / "ca.pem"


def _signed(folder: Path, ca_folder: Path, name: str, cn: str, extensions: str) -> None:
    _key(folder, f"{name}-key.pem" if name != "client" else "key.pem")
    key = f"{name}-key.pem" if name != "client" else "key.pem"
    out = f"{name}-cert.pem" if name != "client" else "cert.pem"
    (folder / f"{name}.ext").write_text(extensions)
    _openssl("req", "-new", "-key", key, "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=folder)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", str(ca_folder / "ca.pem"), "-CAkey",
        str(ca_folder / "ca-key.pem"), "-CAcreateserial", "-out", out, "-days", "2", "-extfile", f"{name}.ext",
        cwd=folder,
    )  # fmt: skip


def make_certificates(folder: Path) -> Certificates:
    """The CA, the engine's certificate (for 127.0.0.1) and a client certificate, all in ``folder``."""
    make_ca(folder)
    _signed(folder, folder, "server", "127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _signed(folder, folder, "client", "sandbox-test-client", "extendedKeyUsage=clientAuth\n")
    return Certificates(folder)


@dataclass
class RemoteEngine:
    folder: Path
    port: int
    certs: Certificates
    process: subprocess.Popen[bytes]

    @property
    def host(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The SDK's (and the docker CLI's) variables for this engine."""
        return {"DOCKER_HOST": self.host, "DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(self.certs.folder)}

    def profile_overrides(self) -> dict[str, object]:
        """The same engine as a profile's ``[docker]`` table."""
        return {
            "docker.host": self.host,
            "docker.tls_ca": str(self.certs.ca),
            "docker.tls_cert": str(self.certs.cert),
            "docker.tls_key": str(self.certs.key),
        }

    def cli(self, *args: str, stdin: int | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            ["docker", *args], env={**os.environ, **self.env()}, stdin=stdin, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.folder / "dockerd.log").read_text(errors="replace")[-2000:]
        return ""


def _needs() -> None:
    if os.geteuid() != 0:
        raise Unavailable("needs root to start a second dockerd as the remote engine")
    for tool in ("dockerd", "docker", "openssl", "unshare", "mount", "ip"):
        if shutil.which(tool) is None:
            raise Unavailable(f"needs {tool} on PATH for the remote engine")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


BRIDGE = "sbx-remote0"
BRIDGE_ADDRESS = "10.213.213.1/24"  # never routed: the remote tests' containers have no network


def _make_bridge() -> None:
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)  # a crashed run's
    for step in (
        ["ip", "link", "add", BRIDGE, "type", "bridge"],
        ["ip", "addr", "add", BRIDGE_ADDRESS, "dev", BRIDGE],
        ["ip", "link", "set", BRIDGE, "up"],
    ):
        done = subprocess.run(step, capture_output=True, check=False)
        if done.returncode != 0:
            raise Unavailable(
                f"cannot make the remote engine's bridge ({' '.join(step)}): {done.stderr.decode()[-200:]}"
            )


def _dockerd_argv(folder: Path, port: int, certs: Certificates) -> list[str]:
    config = folder / "daemon.json"
    config.write_text("{}\n")  # not the host daemon's /etc/docker/daemon.json
    return [
        "dockerd",
        f"--config-file={config}",
        f"--data-root={folder / 'data'}",
        f"--exec-root={folder / 'exec'}",
        f"--pidfile={folder / 'dockerd.pid'}",
        f"--host=tcp://127.0.0.1:{port}",
        "--tlsverify",
        f"--tlscacert={certs.ca}",
        f"--tlscert={certs.server_cert}",
        f"--tlskey={certs.server_key}",
        # A bridge of its own: with --bridge=none a dockerd *deletes* the host's docker0 (moby's
        # removeDefaultBridgeInterface), and this one shares the host's network namespace.
        f"--bridge={BRIDGE}",
        "--iptables=false",
        "--ip-masq=false",
        "--ip-forward=false",
        "--cgroup-parent=sandbox-remote-engine",
    ]


def start(hidden: Path, image: str) -> RemoteEngine:
    """The remote engine, up, with ``image`` loaded; ``hidden`` is a tmpfs in its mount namespace."""
    _needs()
    folder = Path(tempfile.mkdtemp(prefix="sbx-remote-engine-", dir="/var/tmp"))
    try:
        certs = make_certificates(folder / "certs")
        _make_bridge()
        port = _free_port()
        argv = _dockerd_argv(folder, port, certs)
        # The namespace's own tmpfs over the test run's temporary root: no workspace of ours is there.
        script = 'mount -t tmpfs -o size=1m,mode=0700 sandbox-hidden "$1" && shift && exec "$@"'
        with open(folder / "dockerd.log", "wb") as log:
            process = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(hidden), *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        engine = RemoteEngine(folder, port, certs, process)
        try:
            _wait_ready(engine)
            _load_image(engine, image)
        except BaseException:
            stop(engine)
            raise
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return engine


def _wait_ready(engine: RemoteEngine) -> None:
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if engine.process.poll() is not None:
            raise Unavailable(f"the remote dockerd exited ({engine.process.returncode}): {engine.log_tail()}")
        probe = engine.cli("version", "--format", "{{.Server.Version}}")
        out, _err = probe.communicate(timeout=30)
        if probe.returncode == 0 and out.strip():
            return
        time.sleep(0.3)
    raise Unavailable(f"the remote dockerd did not answer in {START_WAIT_S} s: {engine.log_tail()}")


def _load_image(engine: RemoteEngine, image: str) -> None:
    """``docker save <image> | DOCKER_HOST=<engine> docker load``."""
    present = subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False)
    if present.returncode != 0:
        raise Unavailable(f"image {image} is not on the host's Docker daemon: run `make image`")
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    assert save.stdout is not None
    load = engine.cli("load", stdin=save.stdout.fileno())
    save.stdout.close()
    out, err = load.communicate(timeout=600)
    if save.wait(timeout=600) != 0 or load.returncode != 0:
        raise Unavailable(f"cannot load {image} into the remote engine: {err.decode(errors='replace')[-300:]}")


def stop(engine: RemoteEngine) -> None:
    """Stop the engine (its containers go with it) and remove everything it had."""
    if engine.process.poll() is None:
        engine.process.send_signal(signal.SIGTERM)
        try:
            engine.process.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            engine.process.kill()
            engine.process.wait(timeout=STOP_WAIT_S)
    # Its overlay and shm mounts lived in its own mount namespace, gone with it: plain files now.
    shutil.rmtree(engine.folder, ignore_errors=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)
