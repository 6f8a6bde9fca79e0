"""Docker behaves like bubblewrap for an unattended dependency install (issue 32, item 6).

Against a real dockerd and the shipped image: the image makes a venv (ensurepip) and pip runs in
it; the jail trusts the CA certificates the host trusts when the profile says
``[docker] ca_certificates = "host"`` (``ca_bundle`` points "the host's trust store" at a bundle
holding the NetLab's CA, so the real /etc/ssl is never edited), and an https download through the
allowlist then verifies, where the image's own store refuses it; a command the image lacks exits
127 with a line naming the image and the one that has it; ``sandbox run --image`` picks the image.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox import calls, image
from sandbox import exec as executor
from sandbox.backends.environment import CA_VARIABLES
from sandbox.errors import InvalidArgument
from tests import netlab
from tests.conftest import make_profile, own_like_a_checkout
from tests.integration._docker import docker_or_skip
from tests.netlab import HELLO, NetLab

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sandbox.backends import docker as dockerb

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@pytest.fixture
def backend() -> dockerb.DockerBackend:
    return docker_or_skip()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    (folder / "README.md").write_text("# parity\n")
    own_like_a_checkout(folder)
    return folder


@pytest.fixture(params=["session", "call"])
def lifecycle(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- the image makes venvs -----------------------------------------------------------------------


async def test_the_image_makes_a_venv_and_runs_its_pip(backend: dockerb.DockerBackend, ws: Path) -> None:
    async with await backend.open_jail(ws, make_profile("default", backend="docker")) as jail:
        result = await executor.run(
            jail, ["sh", "-c", "python3 -m venv /tmp/v && /tmp/v/bin/pip --version"], timeout=120
        )
    assert result.exit_code == 0, result
    assert result.stdout.startswith("pip ") and "/tmp/v/lib/python3" in result.stdout, result.stdout


# -- the host's CA certificates ------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab() -> Iterator[NetLab]:
    with NetLab() as running:
        yield running


@pytest.fixture
def lab_dns(lab: NetLab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy resolves with the lab's DNS, chains to no proxy of this machine, and no CA
    variable of ours (CI sets some) reaches the jail by another way."""
    netlab.resolve_in(lab, monkeypatch, drop=CA_VARIABLES)


def _trust_store(tmp_path: Path, lab: NetLab, with_lab: bool) -> Path:
    """A stand-in for the host's bundle: the host's real one, plus the lab's CA when asked."""
    if not SYSTEM_BUNDLE.is_file():
        pytest.skip(f"this host has no {SYSTEM_BUNDLE} to start the stand-in trust store from")
    bundle = tmp_path / "host-trust" / "ca-certificates.crt"
    bundle.parent.mkdir(exist_ok=True)
    bundle.write_text(SYSTEM_BUNDLE.read_text() + (lab.ca_file.read_text() if with_lab else ""))
    return bundle


def _allow(lab: NetLab) -> list[str]:
    return [f"allowed.test:{lab.https_port}", *(f"{lab.address}:{port}" for port in sorted(set(lab.ports.values())))]


async def _fetch(
    backend: dockerb.DockerBackend, ws: Path, lab: NetLab, lifecycle: str, **docker_keys: Any
) -> executor.ExecResult:
    overrides = {f"docker.{key}": value for key, value in docker_keys.items()}
    profile = make_profile(
        "default",
        backend="docker",
        **{"network.mode": "allowlist", "network.allow": _allow(lab), "docker.lifecycle": lifecycle, **overrides},
    )
    url = lab.https_url("allowed.test", "/hello.txt")
    script = (
        f"curl -sS {url}; echo curl=$?; "
        "python3 -c 'import sys, urllib.request as u; print(u.urlopen(sys.argv[1]).read().decode().strip())' "
        f"{url}; echo python=$?"
    )
    async with await backend.open_jail(ws, profile) as jail:
        return await executor.run(jail, ["sh", "-c", script], timeout=60)


@pytest.mark.usefixtures("lab_dns")
async def test_a_download_verifies_against_the_hosts_trust_store(
    backend: dockerb.DockerBackend, ws: Path, lab: NetLab, tmp_path: Path, lifecycle: str
) -> None:
    bundle = _trust_store(tmp_path, lab, with_lab=True)
    result = await _fetch(backend, ws, lab, lifecycle, ca_certificates="host", ca_bundle=str(bundle))
    hello = HELLO.decode().strip()
    assert result.stdout.splitlines() == [hello, "curl=0", hello, "python=0"], result


@pytest.mark.usefixtures("lab_dns")
async def test_a_download_fails_verification_when_the_host_does_not_trust_the_ca(
    backend: dockerb.DockerBackend, ws: Path, lab: NetLab, tmp_path: Path
) -> None:
    bundle = _trust_store(tmp_path, lab, with_lab=False)
    for keys in ({"ca_certificates": "host", "ca_bundle": str(bundle)}, {}):  # the host's, the image's
        result = await _fetch(backend, ws, lab, "session", **keys)
        assert "curl=60" in result.stdout and "python=1" in result.stdout, (keys, result)
        assert "CERTIFICATE_VERIFY_FAILED" in result.stderr, (keys, result)


async def test_the_trust_store_is_read_only_in_the_jail(
    backend: dockerb.DockerBackend, ws: Path, tmp_path: Path
) -> None:
    bundle = tmp_path / "bundle.crt"
    shutil.copyfile(SYSTEM_BUNDLE, bundle)
    before = bundle.read_bytes()
    profile = make_profile(
        "default", backend="docker", **{"docker.ca_certificates": "host", "docker.ca_bundle": str(bundle)}
    )
    script = "echo $SSL_CERT_FILE; echo x >> $SSL_CERT_FILE; echo append=$?"
    async with await backend.open_jail(ws, profile) as jail:
        result = await executor.run(jail, ["sh", "-c", script], timeout=60)
    assert result.stdout.splitlines()[0] == "/etc/ssl/certs/ca-certificates.crt", result
    assert "append=0" not in result.stdout and bundle.read_bytes() == before, result


def test_a_bundle_holding_a_private_key_is_refused(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.crt"
    bundle.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    from sandbox.backends.docker.config import host_ca_bundle

    profile = make_profile("default", **{"docker.ca_certificates": "host", "docker.ca_bundle": str(bundle)})
    with pytest.raises(InvalidArgument, match="private key"):
        host_ca_bundle(profile)


def test_a_remote_engine_refuses_to_bind_the_hosts_bundle() -> None:
    from sandbox.backends.docker import _check_remote

    profile = make_profile("default", backend="docker", **{"mount.strategy": "copy", "docker.ca_certificates": "host"})
    with pytest.raises(InvalidArgument, match=r"a remote engine cannot do \(tcp://engine\)"):
        _check_remote(profile, "tcp://engine")


def test_a_remote_engine_refuses_the_download_cache() -> None:
    from sandbox.backends.docker import _check_remote

    profile = make_profile("default", backend="docker", **{"mount.strategy": "copy", "mount.download_cache": "project"})
    with pytest.raises(InvalidArgument, match=r"download_cache = 'project' .* a remote engine cannot do"):
        _check_remote(profile, "tcp://engine")


def test_a_bundle_needs_ca_certificates_host() -> None:
    with pytest.raises(InvalidArgument, match='needs docker.ca_certificates = "host"'):
        make_profile("default", **{"docker.ca_bundle": "/etc/ssl/certs/ca-certificates.crt"})


# -- a tool the image lacks ----------------------------------------------------------------------


async def test_a_missing_tool_names_the_image_that_has_it(backend: dockerb.DockerBackend, ws: Path) -> None:
    profile = make_profile("default", backend="docker")
    async with await backend.open_jail(ws, profile) as jail:
        result = await executor.run(jail, calls.checked_argv(jail, ["npm", "test"]), timeout=60)
    assert result.exit_code == 127, result
    assert result.stderr.strip() == (
        f"sandbox: npm: command not found in the jail (image {image.tag()}); the image with npm is "
        "sandbox-runtime:node: --image sandbox-runtime:node or [docker] image"
    ), result.stderr


async def test_a_tool_no_variant_has_names_the_image_keys(backend: dockerb.DockerBackend, ws: Path) -> None:
    profile = make_profile("default", backend="docker")
    async with await backend.open_jail(ws, profile) as jail:
        result = await executor.run(jail, calls.checked_argv(jail, ["cargo", "test"]), timeout=60)
    assert result.exit_code == 127, result
    assert result.stderr.strip() == (
        f"sandbox: cargo: command not found in the jail (image {image.tag()}); "
        "for an image that has it: --image IMAGE or [docker] image"
    ), result.stderr


# -- sandbox run --image -------------------------------------------------------------------------


def _sandbox_run(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandbox.cli", "run", "--workspace", str(ws), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )


@pytest.mark.usefixtures("backend")
def test_sandbox_run_image_picks_the_image(ws: Path) -> None:
    node = image.alias("node")
    out = _sandbox_run(ws, "--image", str(node), "--", "sh", "-c", "command -v node; cat /etc/os-release | head -1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "/usr/bin/node", out.stdout


@pytest.mark.usefixtures("backend")
def test_sandbox_run_image_refuses_the_bwrap_backend(ws: Path) -> None:
    out = _sandbox_run(ws, "--backend", "bwrap", "--image", "sandbox-runtime:node", "--", "true")
    assert out.returncode == 125, out
    assert "--image names a Docker image" in out.stderr and "--backend docker" in out.stderr, out.stderr
