"""``sandbox image build`` tells why no Docker daemon answers: a socket this user may not open, an
engine installed but not running, or none installed (issue 32: an ordinary user was told to install
docker.io when the socket was only not accessible, because /usr/sbin, where dockerd is, was not on
their PATH). No daemon is needed: the engines are stand-in files in a directory of the test's, the
problem is the SDK's own wording."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox import image, imagehost

ROOT = Path(__file__).resolve().parents[2]
FETCH = "Error while fetching server API version: ('Connection aborted.', "
PERMISSION = FETCH + "PermissionError(13, 'Permission denied'))"
REFUSED = FETCH + "ConnectionRefusedError(111, 'Connection refused'))"
MISSING = FETCH + "FileNotFoundError(2, 'No such file or directory'))"


@pytest.fixture
def engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the engines are looked for besides PATH (imagehost.ENGINE_DIRS), with a PATH like an ordinary
    user's that holds none of them, and no socket at the default place."""
    folder = tmp_path / "sbin"
    folder.mkdir()
    monkeypatch.setattr(imagehost, "ENGINE_DIRS", str(folder))
    monkeypatch.setattr(imagehost, "DOCKER_SOCKET", str(tmp_path / "docker.sock"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    return folder


def install(folder: Path, name: str) -> None:
    engine = folder / name
    engine.write_text("#!/bin/sh\n")
    engine.chmod(0o755)


@pytest.mark.usefixtures("engines")
def test_a_socket_this_user_may_not_open_is_not_a_missing_package() -> None:
    hint = imagehost._daemon_hint(PERMISSION)
    assert "usermod -aG docker $USER" in hint and "rootless Podman" in hint, hint
    assert "not installed" not in hint


def test_an_engine_outside_the_users_path_is_installed_but_not_running(engines: Path) -> None:
    install(engines, "dockerd")
    hint = imagehost._daemon_hint(REFUSED)
    assert hint.startswith("Docker is installed but its daemon is not running: sudo systemctl start docker"), hint


@pytest.mark.usefixtures("engines")
def test_no_engine_at_all_names_the_package() -> None:
    hint = imagehost._daemon_hint(MISSING)
    assert hint.startswith("docker.io is not installed: sudo apt-get install docker.io"), hint


def test_podman_installed_says_how_to_use_it(engines: Path) -> None:
    install(engines, "podman")
    hint = imagehost._daemon_hint(MISSING)
    assert "docker.io is not installed" in hint and "systemctl --user start podman.socket" in hint, hint


@pytest.mark.usefixtures("engines")
def test_an_inaccessible_docker_host_socket_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/elsewhere.sock")
    monkeypatch.setattr(imagehost, "is_root", lambda: False)
    monkeypatch.setattr(imagehost, "_try_connect", lambda: (None, PERMISSION))
    with pytest.raises(imagehost.BuildError, match=r"does not answer .*may not open /run/elsewhere\.sock.*usermod"):
        imagehost.connect()


def test_the_run_line_names_the_variant_with_the_tool() -> None:
    hint = image.missing_command_hint(image.tag(), "npx")
    assert hint == (
        f" (image {image.tag()}); the image with npx is sandbox-runtime:node: --image sandbox-runtime:node "
        "or [docker] image"
    )
    assert "the image with" not in image.missing_command_hint("sandbox-runtime:node", "npm")


def test_an_ordinary_user_the_socket_refuses_is_told_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real case, as the ordinary-user run meets it (tests/run-as-user.sh): the daemon runs, its
    socket is root:docker 0660, this user is not in the group, and /usr/sbin is not on PATH."""
    socket_path = imagehost.DOCKER_SOCKET
    if os.geteuid() == 0 or not os.path.exists(socket_path) or os.access(socket_path, os.R_OK | os.W_OK):
        pytest.skip(f"needs an ordinary user that may not open {socket_path} (this one is root or may)")
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    env = os.environ | {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "sandbox.cli", "image", "build"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert out.returncode == 1 and "usermod -aG docker" in out.stderr, out.stderr
    assert "not installed" not in out.stderr
