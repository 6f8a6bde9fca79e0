"""Profiles: shipped files validate, sizes parse, errors name the file, the key and the problem."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from sandbox import profile as profiles
from sandbox.errors import InvalidArgument

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.parametrize("name", sorted(profiles.available()))
def test_shipped_profiles_validate(name: str) -> None:
    prof = profiles.load(name)
    assert prof.name == name and prof.description


@pytest.mark.parametrize(
    ("text", "expected"),
    [(4096, 4096), ("512MiB", 512 * 2**20), ("1g", 10**9), ("2 GiB", 2 * 2**30), ("1.5KiB", 1536), ("10", 10)],
)
def test_sizes(text: object, expected: int) -> None:
    assert profiles.parse_size(text) == expected


@pytest.mark.parametrize("bad", ["lots", "-1", "1 XB", True, -5])
def test_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError):
        profiles.parse_size(bad)


def test_error_names_file_key_and_problem(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('backend = "vm"\n[limits]\nmemory = "lots"\n[timeouts]\ndefault_s = 0\n')
    with pytest.raises(InvalidArgument) as info:
        profiles.load(str(path))
    message = info.value.message
    assert str(path) in message
    for key in ("backend", "limits.memory", "timeouts.default_s"):
        assert key in message
    assert {e["key"] for e in info.value.data["errors"]} >= {"backend", "limits.memory", "timeouts.default_s"}


def test_unknown_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[network]\nmode = 'none'\negress = 'all'\n")
    with pytest.raises(InvalidArgument, match="network.egress"):
        profiles.load(str(path))


def test_toml_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("backend = \n")
    with pytest.raises(InvalidArgument, match="invalid profile"):
        profiles.load(str(path))


def test_unknown_profile_lists_shipped_ones() -> None:
    with pytest.raises(InvalidArgument, match="default"):
        profiles.load("nope")


def test_overrides_are_validated() -> None:
    prof = profiles.load("default").with_overrides(**{"limits.memory": "64MiB", "mount.strategy": "copy"})
    assert prof.limits.memory == 64 * 2**20 and prof.mount.strategy == "copy"
    with pytest.raises(InvalidArgument, match="mount.strategy"):
        profiles.load("default").with_overrides(**{"mount.strategy": "sideways"})
