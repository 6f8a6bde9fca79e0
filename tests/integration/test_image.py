"""``sandbox image build``: the command, its variants (Node), the recipes it ships and the set-up it does.

The Node variant is built here if it is missing (one apt layer on the base image: minutes the
first time, well under a second once current), then used through a real Docker jail.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from sandbox import exec as executor
from sandbox import image, imagehost
from sandbox.errors import BackendUnavailable
from tests.conftest import backend_or_skip, make_profile

if TYPE_CHECKING:
    from sandbox.backends import base

ROOT = Path(__file__).resolve().parents[2]
TINY_PACKAGE = {"name": "tiny", "version": "1.0.0", "private": True, "scripts": {"test": "node test.js"}}
TINY_TEST = "const assert = require('assert');\nassert.strictEqual(1 + 1, 2);\nconsole.log('tiny ok');\n"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandbox.cli", "image", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd="/",
    )


@pytest.fixture(scope="module")
def docker_backend() -> base.Backend:
    return backend_or_skip("docker")


@pytest.fixture(scope="module")
def node_image(docker_backend: base.Backend) -> str:  # noqa: ARG001 - skips without a daemon
    return image.build("node")


def _node_workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "pkg"
    ws.mkdir()
    (ws / "package.json").write_text(json.dumps(TINY_PACKAGE))
    (ws / "test.js").write_text(TINY_TEST)
    if os.geteuid() == 0:  # as a developer's checkout: Docker then runs the command as its owner
        for path in (ws, *ws.iterdir()):
            os.chown(path, 1000, 1000)
    return ws


async def _run(backend: base.Backend, ws: Path, ref: str | None, script: str) -> executor.ExecResult:
    profile = make_profile(backend="docker", **({"docker.image": ref} if ref else {}))
    async with await backend.open_jail(ws, profile) as jail:
        return await executor.run(jail, ["/bin/sh", "-c", script], timeout=120)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first build of the Node layer downloads and installs ~300 packages
def test_node_variant_runs_node_and_npm_test(node_image: str, docker_backend: base.Backend, tmp_path: Path) -> None:
    assert node_image == "sandbox-runtime:node"
    ws = _node_workspace(tmp_path)
    result = anyio.run(_run, docker_backend, ws, node_image, "node --version && npm test")
    assert result.exit_code == 0, result
    assert result.stdout.startswith("v") and "tiny ok" in result.stdout


@pytest.mark.docker
def test_default_image_has_no_node(docker_backend: base.Backend, tmp_path: Path) -> None:
    result = anyio.run(_run, docker_backend, _node_workspace(tmp_path), None, "command -v node npm")
    assert result.exit_code != 0 and result.stdout == "", result


@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("node_image")
def test_build_command_returns_at_once_when_current() -> None:
    started = time.monotonic()
    out = _cli("build", "--variant", "node")
    assert out.returncode == 0, out.stderr
    assert f"{image.tag()} is up to date" in out.stdout and out.stdout.endswith("sandbox-runtime:node\n")
    assert time.monotonic() - started < 30


@pytest.mark.docker
def test_missing_image_names_the_command(docker_backend: base.Backend, tmp_path: Path) -> None:
    for ref, command in (
        ("sandbox-runtime:0.0.0-missing", "`sandbox image build`"),
        ("sandbox-runtime:0.0.0-missing-node", "`sandbox image build --variant node`"),
    ):
        with pytest.raises(BackendUnavailable) as info:
            anyio.run(_run, docker_backend, _fresh(tmp_path), ref, "true")
        assert command in info.value.message


def _fresh(tmp_path: Path) -> Path:
    ws = tmp_path / f"ws{len(list(tmp_path.iterdir()))}"
    ws.mkdir()
    return ws


@pytest.mark.parametrize(
    ("ref", "command"),
    [
        ("sandbox-runtime:0.1.0", "sandbox image build"),
        ("sandbox-runtime:node", "sandbox image build --variant node"),
        ("sandbox-runtime:0.1.0-node", "sandbox image build --variant node"),
        ("ubuntu:24.04", "docker pull ubuntu:24.04"),
    ],
)
def test_build_command_per_reference(ref: str, command: str) -> None:
    assert image.build_command(ref) == command


def test_recipes_ship_inside_the_package() -> None:
    recipes = importlib.resources.files("sandbox") / "images"
    for name in ("Dockerfile", "Dockerfile.offline", "Dockerfile.variant", "dockerd-up.sh"):
        assert (recipes / name).is_file(), name
    assert image.recipe("node") != image.recipe("base")


def test_build_sh_is_the_same_command() -> None:
    env = {**os.environ, "PYTHON": sys.executable}  # the interpreter under test, venv or not
    out = subprocess.run(
        ["bash", str(ROOT / "images" / "build.sh"), "--print-tag", "--variant", "node"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert (out.returncode, out.stdout) == (0, "sandbox-runtime:node\n"), out.stderr


def test_unknown_variant_is_refused() -> None:
    out = _cli("build", "--variant", "rust")
    assert out.returncode == 2 and "invalid choice: 'rust'" in out.stderr


# --- set-up: what a fresh machine lacks is installed as root, named otherwise ----------------


def _hide(monkeypatch: pytest.MonkeyPatch, command: str) -> list[str]:
    """Make ``command`` look missing to the first lookup only (as before apt-get installs it)."""
    real, asked = shutil.which, list[str]()

    def which(name: str, mode: int = os.F_OK | os.X_OK, path: str | None = None) -> str | None:
        if name == command and not asked:
            asked.append(name)
            return None
        return real(name, mode, path)

    monkeypatch.setattr(shutil, "which", which)
    return asked


def test_missing_debootstrap_is_named_for_an_ordinary_user(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "debootstrap")
    monkeypatch.setattr(imagehost, "is_root", lambda: False)
    with pytest.raises(
        imagehost.BuildError, match=r"debootstrap is not installed .*: sudo apt-get install debootstrap"
    ):
        imagehost.ensure_command("debootstrap", "debootstrap", "the offline image build needs it")


@pytest.mark.root
@pytest.mark.timeout(300)
def test_missing_debootstrap_is_installed_by_root(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("installing with apt-get needs root and apt-get")
    _hide(monkeypatch, "debootstrap")
    path = imagehost.ensure_command("debootstrap", "debootstrap", "the offline image build needs it")
    assert os.access(path, os.X_OK) and path.endswith("/debootstrap")
    assert "installing debootstrap with apt-get" in capsys.readouterr().out


def test_unreachable_docker_host_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nothing.sock")
    out = subprocess.run(
        [sys.executable, "-m", "sandbox.cli", "image", "build"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 1 and f"DOCKER_HOST=unix://{tmp_path}/nothing.sock does not answer" in out.stderr
    assert "Traceback" not in out.stderr


def test_no_daemon_names_the_package_for_an_ordinary_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(imagehost, "is_root", lambda: False)
    monkeypatch.setattr(imagehost, "_try_connect", lambda: (None, "connection refused"))
    monkeypatch.setattr(imagehost, "DOCKER_SOCKET", "/nonexistent/docker.sock")  # no socket a user could be refused
    monkeypatch.setattr(imagehost, "ENGINE_DIRS", "/nonexistent")  # nor an engine outside the user's PATH
    _hide(monkeypatch, "dockerd")
    with pytest.raises(imagehost.BuildError, match=r"no Docker daemon answers .*sudo apt-get install docker\.io"):
        imagehost.connect()
