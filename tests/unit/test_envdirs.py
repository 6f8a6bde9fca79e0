"""The environment-directory rules and their one-line summary (:mod:`sandbox.mounts.envdirs`): pure, no jail."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from sandbox import profile_tables
from sandbox.mounts import envdirs

if TYPE_CHECKING:
    from pathlib import Path

ENV = (".venv", "node_modules", "__pycache__", "build/out")


@dataclass
class _Change:
    path: str
    kind: str = "file"
    status: str = "added"
    size: int | None = 10
    flags: list[str] = field(default_factory=list)


@pytest.mark.parametrize(
    ("path", "group"),
    [
        (".venv", ".venv"),
        (".venv/lib/python3.11/site-packages/x/__pycache__/a.pyc", ".venv"),  # the outermost match
        ("web/node_modules/left-pad/index.js", "web/node_modules"),  # a bare name, at any depth
        ("pkg/__pycache__/m.cpython-311.pyc", "pkg/__pycache__"),
        ("build/out/a.o", "build/out"),  # a path, from the top only
        ("src/build/out/a.o", None),
        ("src/venv/x", None),
        (".git/node_modules/x", None),  # the repository is its own group
    ],
)
def test_group_of(path: str, group: str | None) -> None:
    assert envdirs.group_of(path, ENV) == group


def test_summarise_counts_packages_files_and_bytes() -> None:
    site = ".venv/lib/python3.11/site-packages"
    entries = [
        _Change(".venv", kind="dir", size=None),
        _Change(f"{site}/pytest-8.0.dist-info/METADATA", size=1000),
        _Change(f"{site}/pytest-8.0.dist-info/RECORD", size=24),
        _Change(f"{site}/six-1.16.egg-info/PKG-INFO", size=100),
        _Change(".venv/bin/pytest", size=200, flags=["new-executable"]),
        _Change(".venv/old.txt", status="deleted", size=None),
    ]
    summary = envdirs.summarise(entries, ".venv")
    assert summary == envdirs.EnvSummary(".venv", packages=2, files=4, bytes=1324, flagged=1, deleted=1)
    line = summary.line()
    assert line.startswith(".venv: 2 packages, 4 files, 1.3 KiB")
    assert line.endswith("environment, not applied unless asked (--only .venv or --include-environment)")


def test_summarise_counts_npm_packages_scoped_and_nested() -> None:
    entries = [
        _Change("node_modules/left-pad/package.json"),
        _Change("node_modules/@types/node/package.json"),
        _Change("node_modules/tape/node_modules/resolve/package.json"),
        _Change("node_modules/tape/lib/test.js"),
        _Change("node_modules/tape/test/fixtures/package.json"),  # a fixture, not a package
    ]
    assert envdirs.summarise(entries, "node_modules").packages == 3


def test_the_summary_of_thousands_is_one_line_with_thousands_separators() -> None:
    entries = [_Change(f"node_modules/p{i}/package.json", size=2**20) for i in range(2978)]
    assert (
        envdirs.summarise(entries, "node_modules")
        .line()
        .startswith("node_modules: 2,978 packages, 2,978 files, 2.9 GiB")
    )


def test_lock_files_key_the_cache(tmp_path: Path) -> None:
    ws = tmp_path
    assert envdirs.lock_hash(ws, ".venv") is None
    (ws / "requirements-dev.txt").write_text("pytest\n")
    first = envdirs.lock_hash(ws, ".venv")
    (ws / "requirements-dev.txt").write_text("pytest==8\n")
    assert first is not None and envdirs.lock_hash(ws, ".venv") not in (None, first)


def test_profile_entries_are_plain_paths() -> None:
    assert profile_tables.Mount(environment=(".venv", "web/node_modules/")).environment == (".venv", "web/node_modules")
    with pytest.raises(ValueError, match="pattern"):
        profile_tables.Mount(environment=("*.egg-info",))
    with pytest.raises(ValueError, match="leaves the workspace"):
        profile_tables.Mount(environment=("../elsewhere",))
    with pytest.raises(ValueError, match="'off' or 'project'"):
        profile_tables.Mount(environment_cache="home")
