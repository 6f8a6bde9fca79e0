"""Profiles: shipped files validate, sizes parse, errors name the file, the key and the problem."""

from __future__ import annotations

import tomllib
from typing import TYPE_CHECKING

import pytest

from sandbox import profile as profiles
from sandbox import profile_tables
from sandbox.errors import InvalidArgument

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.parametrize("name", sorted(profiles.available()))
def test_shipped_profiles_validate(name: str) -> None:
    prof = profiles.load(name)
    assert prof.name == name and prof.description


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (4096, 4096),
        ("512MiB", 512 * 2**20),
        ("1g", 2**30),
        ("2 GiB", 2 * 2**30),
        ("1.5KiB", 1536),
        ("10", 10),
        ("2G", 2**31),
        ("2g", 2**31),
        ("2GiB", 2**31),
        ("2GB", 2**31),
        ("1k", 1024),
        ("3m", 3 * 2**20),
    ],
)
def test_sizes(text: object, expected: int) -> None:
    assert profile_tables.parse_size(text) == expected


@pytest.mark.parametrize("bad", ["lots", "-1", "1 XB", True, -5, "0.1", "1.3k", 1.5])
def test_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError, match="size|byte"):
        profile_tables.parse_size(bad)


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


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("limits.memory", 0, "limits.memory"),
        ("limits.memory", "0", "limits.memory"),
        ("limits.memory", "1k", "at least"),
        ("limits.memory", "0.1", "fraction"),
        ("limits.file_size", 0, "limits.file_size"),
        ("limits.tmp_size", "0", "limits.tmp_size"),
        ("limits.pids", 3, "limits.pids"),
        ("limits.cpus", 0.001, "limits.cpus"),
    ],
)
def test_nonsense_limits_in_a_file_name_the_key_and_the_file(
    tmp_path: Path, key: str, value: object, needle: str
) -> None:
    section, leaf = key.split(".")
    path = tmp_path / "p.toml"
    path.write_text(f"[{section}]\n{leaf} = {value!r}\n".replace("'", '"'))
    with pytest.raises(InvalidArgument) as info:
        profiles.load(str(path))
    assert str(path) in info.value.message and key in info.value.message and needle in info.value.message


def test_overrides_name_the_flag_not_the_profile_file() -> None:
    with pytest.raises(InvalidArgument) as info:
        profiles.load("default").override({"limits.pids": 3}, {"limits.pids": "--pids"})
    assert info.value.message.startswith("--pids: ")
    assert "default.toml" not in info.value.message
    assert info.value.data["errors"][0]["flag"] == "--pids"


def test_an_override_cannot_contradict_a_required_guarantee() -> None:
    with pytest.raises(InvalidArgument) as info:
        profiles.load("untrusted").override({"network.mode": "host"}, {"network.mode": "--network"})
    message = info.value.message
    assert "--network host" in message and "net-none" in message and "untrusted" in message
    assert info.value.data["guarantee"] == "net-none"


def test_a_profile_file_cannot_contradict_its_own_requirements(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('requires = ["net-none"]\n[network]\nmode = "host"\n')
    with pytest.raises(InvalidArgument, match="network.mode"):
        profiles.load(str(path))


@pytest.mark.parametrize(("name", "at_least"), [("ci", 6 * 3600), ("untrusted", 600), ("default", 600)])
def test_profiles_allow_long_suites(name: str, at_least: float) -> None:
    prof = profiles.load(name)
    assert prof.timeouts.max_s >= at_least
    assert (prof.limits.cpu_time_s or at_least) >= min(at_least, prof.timeouts.max_s)


def test_untrusted_defaults_to_a_real_suites_length() -> None:
    assert profiles.load("untrusted").timeouts.default_s == 600  # issue 32: 30 s killed a suite at 96 %


def test_bash_timeout_follows_the_profile_not_a_fixed_300() -> None:
    from sandbox.tools.params import validate

    ci = profiles.load("ci").timeouts.max_s
    assert validate("Bash", {"command": "true"}, max_timeout_s=ci).timeout == 60  # type: ignore[attr-defined]
    assert validate("Bash", {"command": "x", "timeout": ci}, max_timeout_s=ci).timeout == ci  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgument, match="timeout"):
        validate("Bash", {"command": "x", "timeout": ci + 1}, max_timeout_s=ci)


def test_the_timeout_ceiling_is_the_profiles() -> None:
    from sandbox import calls

    assert calls.check_timeout(5000, profiles.load("ci")) == 5000
    untrusted = profiles.load("untrusted")
    with pytest.raises(InvalidArgument, match="timeouts.max_s"):
        calls.check_timeout(untrusted.timeouts.max_s + 1, untrusted)


# -- network.mode = "allowlist" (issue 12) --------------------------------------------------------


def test_an_allowlist_fits_a_confined_network_but_not_a_none_requirement() -> None:
    confined = profiles.load("default").override({"network.mode": "allowlist", "network.allow": ["pypi.org"]})
    assert (confined.network.mode, confined.network.allow) == ("allowlist", ("pypi.org",))
    with pytest.raises(InvalidArgument) as info:
        profiles.load("default").override({"network.mode": "host"}, {"network.mode": "--network"})
    assert info.value.data["guarantee"] == "net-confined"
    with pytest.raises(InvalidArgument) as refused:
        profiles.load("untrusted").override({"network.mode": "allowlist"}, {"network.mode": "--allow-host"})
    assert refused.value.data["guarantee"] == "net-none" and "--allow-host allowlist" in refused.value.message


@pytest.mark.parametrize("pattern", ["bad host", "*.", "host:99999", "10.0.0.0/33", "*", "a..b"])
def test_a_bad_allow_pattern_is_refused_naming_the_flag(pattern: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        profiles.load("default").override(
            {"network.mode": "allowlist", "network.allow": [pattern]}, {"network.allow": "--allow-host"}
        )
    assert info.value.message.startswith("--allow-host: ") and pattern in info.value.message


def test_the_ci_profiles_commented_allowlist_is_valid() -> None:
    """The example a user uncomments must load as it is."""
    text = profiles.available()["ci"].read_text()
    commented = text[text.index('# mode = "allowlist"') :].splitlines()
    example = "\n".join(line.removeprefix("#") for line in commented)
    network = profile_tables.Network.model_validate(tomllib.loads(example))
    assert network.mode == "allowlist" and "pypi.org" in network.allow and not network.ask


@pytest.mark.parametrize("user", ["0", "0:0", "0:1000", "00:0"])
def test_a_docker_user_of_uid_0_is_refused(user: str) -> None:
    """The Docker backend's non-root guarantee holds for every profile: no profile runs its commands as root."""
    with pytest.raises(InvalidArgument, match="would run commands as root"):
        profiles.load("default").with_overrides(**{"docker.user": user})


@pytest.mark.parametrize("user", ["root", "1000:", ":1000", "1000:1000:1", ""])
def test_a_docker_user_is_a_numeric_uid_gid(user: str) -> None:
    with pytest.raises(InvalidArgument, match="numeric uid:gid"):
        profiles.load("default").with_overrides(**{"docker.user": user})


def test_a_docker_user_other_than_root_is_kept() -> None:
    assert profiles.load("default").with_overrides(**{"docker.user": "1001:1001"}).docker.user == "1001:1001"
