"""The "untrusted task, unattended" recipe (docs/unattended.md), end to end on real projects nobody here wrote.

Per ecosystem and backend, exactly as the recipe says: the project's source distribution is the
workspace; one ``sandbox run --profile untrusted-deps --allow-index NAME=URL`` installs its
dependencies inside the jail from a hermetic index on loopback (tests/registries.py, fed by
``make test-fixtures``) and runs the project's own suite; then the review a person does (the run's
stderr summary, at most 20 lines whatever the install's size; ``sandbox changes show --stat``),
``sandbox changes apply`` of the work (the suite's results, never the environment), ``--only
.venv``/``--only node_modules`` of the environment, and the host runs the applied environment.

pip: six (setuptools, no pyproject.toml) and more-itertools (flit_core). npm: minimist's tape
suite with its whole devDependency tree (eslint, nyc ...: 500+ packages). Cargo is not covered:
the host's toolchain has no offline crate source (see docs/unattended.md).
"""

from __future__ import annotations

import importlib.resources
import json
import re
import subprocess
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

import pytest

from sandbox import profile as profiles
from tests import registries
from tests.conftest import backend_or_skip, own_like_a_checkout
from tests.integration._cli import sandbox

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
BACKENDS = [pytest.param("bwrap", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)]
NODE_IMAGE = "sandbox-runtime:node"  # the Docker image variant with node and npm
SUMMARY_LINES = 20  # the bound on a run's stderr review, whatever the install's size
RUN_TIMEOUT_S = 540
# The recipe's commands; the jail's own output goes to stdout (2>&1), so stderr is the sandbox's review alone.
PIP_RECIPE = (
    "(python3 -m venv .venv && .venv/bin/pip install -q . pytest"
    " && .venv/bin/python -m pytest -q --junitxml=test-results.xml) 2>&1"
)
NPM_RECIPE = (
    "(npm install --no-audit --no-fund --loglevel=error && npx tape 'test/*.js' > test-results.tap;"
    " rc=$?; cat test-results.tap; exit $rc) 2>&1"
)


@pytest.fixture(scope="module")
def indexes() -> Iterator[registries.Registries]:
    try:
        served = registries.Registries()
    except registries.FixturesMissing as exc:
        pytest.skip(str(exc))
    with served:
        yield served


def _project(archive: Path, tmp_path: Path, backend: str) -> Path:
    workspace = registries.unpack(archive, tmp_path / "src")
    if backend == "docker":
        own_like_a_checkout(workspace)
    return workspace


def _profile(backend: str, tmp_path: Path) -> str:
    """``untrusted-deps``; where this host cannot give some of its guarantees (an ordinary user on a
    cgroup-v1 host has no per-call memory limit), a copy of it without exactly those, as such a user
    must write, so the rest of the recipe (unprivileged jail, proxy, review, apply) still runs here."""
    prof = profiles.load("untrusted-deps")
    missing = backend_or_skip(backend).probe().missing(prof.requires, prof)
    if not missing:
        return "untrusted-deps"
    shipped = (importlib.resources.files("sandbox") / "profiles" / "untrusted-deps.toml").read_text()
    kept = json.dumps([key for key in prof.requires if key not in missing])
    path = tmp_path / "untrusted-deps-here.toml"
    path.write_text(re.sub(r"(?ms)^requires = \[.*?\]", lambda _: f"requires = {kept}", shipped, count=1))
    return str(path)


def _recipe(backend: str, workspace: Path, index: str, script: str, *extra: str) -> str:
    """Run the recipe's one command; assert it passed and its review fits; the changeset's id."""
    profile = _profile(backend, workspace.parent.parent)
    argv = ["run", "--profile", profile, "--backend", backend, "--allow-index", index, *extra]
    done = sandbox(*argv, "--workspace", str(workspace), "--", "sh", "-c", script, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    review = done.stderr.splitlines()
    assert len(review) <= SUMMARY_LINES, done.stderr
    found = re.search(r"\b(ch-[0-9a-f]+)\b", done.stderr)
    assert found, done.stderr
    return found.group(1)


def _review_and_apply(workspace: Path, changeset: str, environment: str, results: str) -> None:
    """The person's part: the summary lines, ``show --stat``, apply the work, then the environment."""
    stat = sandbox("changes", "show", changeset, "--stat", text=True)
    assert stat.returncode == 0, stat.stderr
    # The environment directory is one group, not one line per file (thousands of them).
    assert 0 < sum(environment in line for line in stat.stdout.splitlines()) <= 1, stat.stdout[-4000:]
    applied = sandbox("changes", "apply", changeset, text=True)
    assert applied.returncode in (0, 1), applied.stderr  # 1: the environment was held back, as asked
    assert (workspace / results).is_file(), applied.stdout + applied.stderr
    assert not (workspace / environment).exists(), "the environment was applied without being asked for"
    applied = sandbox("changes", "apply", changeset, "--only", environment, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("project", ["six", "more-itertools"])
def test_pip_recipe(backend: str, project: str, indexes: registries.Registries, tmp_path: Path) -> None:
    workspace = _project(registries.sdist(indexes.root, project), tmp_path, backend)
    changeset = _recipe(backend, workspace, f"pypi={indexes.pypi_url}", PIP_RECIPE)
    _review_and_apply(workspace, changeset, ".venv", "test-results.xml")
    suite = ET.parse(workspace / "test-results.xml").getroot().find("testsuite")
    assert suite is not None and int(suite.get("tests", "0")) > 0 and suite.get("failures") == "0"
    # The environment made in the jail, applied, runs on the host: its interpreter link is the system's.
    host = subprocess.run(
        [str(workspace / ".venv" / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert host.returncode == 0, host.stdout[-4000:] + host.stderr[-4000:]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_install_takes_its_downloads_from_the_project_cache(
    backend: str, indexes: registries.Registries, tmp_path: Path
) -> None:
    """``--download-cache project``: pip's downloads stay in the data directory across runs of the
    workspace, so the second install fetches no package file from the index; the workspace's
    changeset never holds the cache."""
    workspace = _project(registries.sdist(indexes.root, "six"), tmp_path, backend)
    index, cached = f"pypi={indexes.pypi_url}", ("--download-cache", "project")
    before = indexes.downloads()
    _recipe(backend, workspace, index, PIP_RECIPE, *cached)
    first = _fetched(before, indexes.downloads())
    assert any(path.endswith(".whl") for path in first), first  # pytest and its dependencies, from the index
    again = indexes.downloads()
    changeset = _recipe(backend, workspace, index, PIP_RECIPE, *cached)
    assert _fetched(again, indexes.downloads()) == {}, "the second install downloaded again"
    stat = sandbox("changes", "show", changeset, "--stat", text=True)
    assert "pip" not in {line.split()[0].split("/")[0] for line in stat.stdout.splitlines() if line.strip()}


def _fetched(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {path: count - before.get(path, 0) for path, count in after.items() if count > before.get(path, 0)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_npm_recipe(backend: str, indexes: registries.Registries, tmp_path: Path) -> None:
    workspace = _project(indexes.root / "npm" / "minimist-1.2.8.tgz", tmp_path, backend)
    image = ["--image", NODE_IMAGE] if backend == "docker" else []
    changeset = _recipe(backend, workspace, f"npm={indexes.npm_url}", NPM_RECIPE, *image)
    _review_and_apply(workspace, changeset, "node_modules", "test-results.tap")
    assert "# ok" in (workspace / "test-results.tap").read_text()
    tape = workspace / "node_modules" / "tape" / "bin" / "tape"
    host = subprocess.run(
        ["node", str(tape), "test/*.js"], cwd=workspace, capture_output=True, text=True, timeout=120, check=False
    )
    assert host.returncode == 0 and "# ok" in host.stdout, host.stdout[-4000:] + host.stderr[-4000:]
