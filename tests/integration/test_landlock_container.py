"""Landlock where agents and CI often run: inside an unprivileged Docker container.

No ``--privileged``, Docker's default seccomp profile and capabilities, no network: there user
namespaces are refused, so bubblewrap cannot start (the host's own ``bwrap`` is bound in to show
it), and ``auto`` must choose Landlock, say so, and confine as on the host, as root and as an
ordinary user. The package and its dependencies come from this checkout and its venv, bound
read-only (the image's Python is Debian's 3.11, the venv's must be too).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox import image
from tests.conftest import backend_or_skip

pytestmark = [pytest.mark.docker, pytest.mark.landlock, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(next(p for p in sys.path if p.endswith("site-packages")))
PROFILE = 'description = "read-only"\nrequires = {requires}\n[mount]\nstrategy = "{mount}"\n'
PROBE = """
import os, socket
for name, attempt in {
    "tcp": lambda: socket.create_connection(("127.0.0.1", 1), timeout=2),
    "udp": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
    "unix": lambda: socket.socket(socket.AF_UNIX),
    "signal-pid-1": lambda: os.kill(1, 0),
}.items():
    try:
        attempt()
        print(name, "open")
    except OSError as exc:
        print(name, "refused", exc.errno)
"""


@pytest.fixture(scope="module")
def runtime_image() -> str:
    backend_or_skip("docker")
    ref = image.tag()
    version = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", ref, "python3", "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=False,
    )
    if version.returncode != 0:
        pytest.skip(f"the image {ref} does not run here: {version.stderr.strip()}")
    if version.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip(
            f"the venv's Python {sys.version_info[:2]} cannot lend its packages to the image's {version.stdout}"
        )
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed on this host (make setup installs it)")
    return ref


def docker_run(ref: str, user: str, mounts: dict[Path, str], workdir: str, *argv: str) -> list[str]:
    """``docker run`` as an unprivileged container: no network, Docker's default seccomp and
    capabilities; the host's bwrap bound in (to show it failing), the venv's packages on the path."""
    bwrap = shutil.which("bwrap")
    binds = [
        arg
        for host, inside in {SITE: "/opt/site:ro", Path(str(bwrap)): "/usr/bin/bwrap:ro", **mounts}.items()
        for arg in ("-v", f"{host}:{inside}")
    ]
    return [
        "docker", "run", "--rm", "--network", "none", "--user", user, *binds, "-w", workdir,
        "-e", "PYTHONPATH=/opt/sbx:/opt/site", "-e", "HOME=/tmp", "-e", "PYTHONDONTWRITEBYTECODE=1",
        ref, *argv,
    ]  # fmt: skip


def in_container(ref: str, workspace: Path, user: str, *argv: str) -> subprocess.CompletedProcess[str]:
    mounts = {ROOT / "sandbox": "/opt/sbx/sandbox:ro", ROOT / "profiles": "/opt/sbx/profiles:ro", workspace: "/ws"}
    entry = "import sys; from sandbox.cli import entry; sys.argv[0] = 'sandbox'; sys.exit(entry())"
    command = docker_run(
        ref, user, mounts, "/ws", "env", "SANDBOX_DATA_DIR=/tmp/sbx-data", "python3", "-c", entry, *argv
    )
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)


@pytest.mark.parametrize("user", ["0", "1000"])
def test_bubblewrap_fails_there_and_landlock_is_available(runtime_image: str, workspace: Path, user: str) -> None:
    done = in_container(runtime_image, workspace, user, "check", "--json")
    assert done.returncode == 0, done.stderr
    reports = {r["backend"]: r for r in json.loads(done.stdout)["backends"]}
    assert not reports["bwrap"]["available"] and "Operation not permitted" in reports["bwrap"]["reason"]
    assert reports["landlock"]["available"], reports["landlock"]
    assert reports["landlock"]["guarantees"]["non-root"]["ok"] is (user != "0")
    # A container's user namespace is not the host's: the audit log cannot be read there, and check says so.
    assert reports["landlock"]["details"]["audit"] is False
    assert any(n.startswith("no per-call denials: ") for n in reports["landlock"]["notes"]), reports["landlock"]


@pytest.mark.parametrize("user", ["0", "1000"])
def test_auto_chooses_landlock_says_so_and_confines(runtime_image: str, workspace: Path, user: str) -> None:
    workspace.chmod(0o777)  # uid 1000 writes the rw run's file
    (workspace / "ro.toml").write_text(PROFILE.format(requires='["fs-hidden-home", "net-none"]', mount="ro"))
    (workspace / "rw.toml").write_text(PROFILE.format(requires="[]", mount="rw"))
    script = "cat README.md; cat /etc/shadow; echo x > README.md; ls /root; echo end"
    done = in_container(runtime_image, workspace, user, "run", "--profile", "/ws/ro.toml", "--", "sh", "-c", script)
    assert done.stdout == "# sample\nend\n", done.stderr
    assert "auto chose the landlock backend (bwrap: " in done.stderr
    assert "cat: /etc/shadow: Permission denied" in done.stderr and "Permission denied" in done.stderr
    probe = in_container(
        runtime_image, workspace, user, "run", "--profile", "/ws/ro.toml", "--", "python3", "-c", PROBE
    )
    assert sorted(probe.stdout.split("\n")) == sorted(
        ["tcp refused 13", "udp refused 1", "unix refused 1", "signal-pid-1 refused 1", ""]
    ), probe.stderr
    wrote = in_container(
        runtime_image, workspace, user, "run", "--profile", "/ws/rw.toml", "--", "sh", "-c", "id -u > out"
    )
    assert wrote.returncode == 0, wrote.stderr
    assert (workspace / "out").read_text() == f"{user}\n"


SUITES = (
    "tests/integration/test_landlock.py",
    "tests/integration/test_landlock_audit.py",
    "tests/integration/test_contracts.py",
    "tests/integration/test_leaks.py",
    "tests/integration/test_tools.py",
    "tests/integration/test_limits.py",
    "tests/attack",
)


@pytest.mark.parametrize("user", ["0", "1000"])
def test_the_contract_and_attack_suites_pass_there(runtime_image: str, user: str) -> None:
    """The suites' Landlock items, run by pytest inside the container as root and as uid 1000.
    Not the allowlist test (its lab needs a network), nor the installed command's (the venv's
    console script names an interpreter the image does not have). As root there, a container
    gives no writable cgroup and root is exempt from RLIMIT_NPROC: a pids limit is refused
    (docs/backends/landlock.md), and the fork bomb test is declared instead (``tests/conftest.py``:
    ``LANDLOCK_UNBOUNDED``); so are the audit's (root there cannot read it) and the full disk's
    (no CAP_SYS_ADMIN to mount its tmpfs), each skipped with that reason."""
    mounts = {ROOT: "/opt/sbx:ro"}  # the checkout: the suites' fixtures and settings too
    select = "landlock and not allowlist and not sandbox_run_uses_it"
    pytest_argv = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp=/tmp/pt", "-k", select]
    command = docker_run(runtime_image, user, mounts, "/opt/sbx", *pytest_argv, *SUITES)
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
