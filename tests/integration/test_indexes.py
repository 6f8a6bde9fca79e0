"""``--allow-index`` and the network-off line through ``sandbox run`` (issue 32), on bubblewrap and Docker.

The index is :class:`tests.netlab.NetLab`'s (``labpkg`` 0.1.0 over HTTPS with a throw-away CA). One
``--allow-index pypi=URL`` must make a bare ``pip download labpkg`` find it (no ``--index-url``)
while every other host stays refused; the lab's address is private or loopback, so the address
rule the rebinding defence asks for is given with ``--allow-host`` (a company's mirror named by
its address needs no more). Without network, a failed install ends with one line naming
``--profile untrusted-deps --allow-index pypi``.
"""

from __future__ import annotations

import json
import shutil
from typing import TYPE_CHECKING

import pytest

from sandbox.backends.environment import CA_VARIABLES
from tests import netlab
from tests.conftest import own_like_a_checkout, profile_or_skip
from tests.integration._cli import sandbox
from tests.netlab import NetLab

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

BACKENDS = [pytest.param("bwrap", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)]
PIP = "python3 -m pip download --quiet --no-deps --disable-pip-version-check --dest /tmp/dl"
HINT = "sandbox: this jail has no network (profile untrusted: network none); to install packages: "


@pytest.fixture(scope="module")
def lab() -> Iterator[NetLab]:
    with NetLab() as running:
        yield running


@pytest.fixture
def lab_dns(lab: NetLab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy resolves with the lab's DNS and chains to no upstream proxy of this machine."""
    netlab.resolve_in(lab, monkeypatch)


@pytest.fixture(params=BACKENDS)
def cli_backend(request: pytest.FixtureRequest, workspace: Path) -> str:
    request.getfixturevalue("data_dir")  # the changesets these runs keep go to the test's own data directory
    name = str(request.param)
    for profile in ("untrusted", "untrusted-deps"):
        profile_or_skip(profile, name)
    if name == "docker":
        own_like_a_checkout(workspace)
    return name


def run(backend: str, workspace: Path, *args: str) -> tuple[int, str, str]:
    done = sandbox("run", "--backend", backend, "--workspace", str(workspace), *args, text=True)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.usefixtures("lab_dns")
def test_one_allow_index_makes_a_bare_pip_use_the_mirror_and_nothing_else(
    cli_backend: str, workspace: Path, lab: NetLab
) -> None:
    ca = workspace / "lab-ca.crt"  # not *.pem: the jail masks those
    shutil.copyfile(lab.ca_file, ca)
    ca.chmod(0o644)
    if cli_backend == "docker":
        own_like_a_checkout(workspace)
    address = f"{lab.address}:{lab.https_port}"
    # Every CA variable: under Docker untrusted-deps names the host's bundle in them (ca_certificates = "host").
    trust = "".join(f"export {name}=$PWD/lab-ca.crt; " for name in CA_VARIABLES)
    script = (
        f"{trust}{PIP} labpkg && ls /tmp/dl && echo PIP_INDEX_URL=$PIP_INDEX_URL; "
        f"curl -sS --cacert lab-ca.crt {lab.https_url('other.test', '/hello.txt')} || echo other-refused"
    )
    code, out, err = run(
        cli_backend,
        workspace,
        *("--profile", "untrusted-deps", "--timeout", "120"),
        *("--allow-index", f"pypi={lab.index_url}", "--allow-host", address, "--", "sh", "-c", script),
    )
    assert code == 0, err
    assert f"labpkg-0.1.0-py3-none-any.whl\nPIP_INDEX_URL={lab.index_url}\n" in out, (out, err)
    assert "other-refused" in out
    assert f"connection to other.test:{lab.https_port} refused (not-allowed)" in err


def test_untrusted_refuses_an_index_and_names_the_profile_that_allows_one(workspace: Path) -> None:
    done = sandbox(
        "run", "--workspace", str(workspace), "--profile", "untrusted", "--allow-index", "pypi", "--", "true"
    )
    code, out, err = done.returncode, done.stdout.decode(), done.stderr.decode()
    assert (code, out) == (125, "")
    assert "--allow-index" in err and "--profile untrusted-deps --allow-index pypi" in err


def test_pip_without_network_ends_with_the_line_that_says_so(cli_backend: str, workspace: Path) -> None:
    code, _, err = run(cli_backend, workspace, "--profile", "untrusted", "--", "sh", "-c", f"{PIP} --retries 0 labpkg")
    assert code != 0
    assert f"{HINT}--profile untrusted-deps --allow-index pypi\n" in err, err
    code, out, _ = run(cli_backend, workspace, "--profile", "untrusted", "--json", "--", "curl", "-sS", "http://x.test")
    assert json.loads(out)["hints"] == [
        "this jail has no network (profile untrusted: network none); "
        "to reach x.test: --profile untrusted-deps --allow-host x.test"
    ]


def test_a_command_that_fails_otherwise_gets_no_line(cli_backend: str, workspace: Path) -> None:
    code, out, err = run(cli_backend, workspace, "--profile", "untrusted", "--json", "--", "sh", "-c", "exit 3")
    assert code == 3 and json.loads(out)["hints"] == []
