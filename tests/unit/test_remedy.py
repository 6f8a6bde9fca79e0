"""The way-forward texts of :mod:`sandbox.remedy`: timeouts' sources and refusals' remedies (no jail)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from sandbox import profile as profiles
from sandbox import remedy
from sandbox.errors import GuaranteeUnavailable
from sandbox.guarantees import Report

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def test_unattended_profiles_fit_a_real_suite() -> None:
    untrusted, ci = profiles.load("untrusted").timeouts, profiles.load("ci").timeouts
    assert (untrusted.default_s, untrusted.max_s) == (600, 3600)
    assert (ci.default_s, ci.max_s) == (1800, 21600)


def test_each_source_is_named() -> None:
    prof = profiles.load("untrusted")
    assert remedy.for_run(None, 600, prof).origin == "profile untrusted: timeouts.default_s = 600"
    assert remedy.for_run(5, 5, prof).origin == "--timeout 5"
    assert remedy.for_call(5, 5, prof, "Bash").origin == "the call's timeout argument (5 s)"
    assert remedy.for_call(None, 60, prof, "Bash").origin == "the Bash tool's default (60 s)"
    clamped = remedy.clamped(9000, 3600, prof, "the manifest's timeout")
    assert clamped.kind == "clamped" and "timeouts.max_s = 3600 (asked for 9000 s (2.5 h))" in clamped.origin


def test_a_file_of_ones_own_is_named_by_its_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text("[timeouts]\ndefault_s = 5\nmax_s = 10\n")
    source = remedy.for_run(None, 5, profiles.load(str(path)))
    assert source.origin == f"profile mine ({path}): timeouts.default_s = 5"
    assert source.how_to_raise() == "to allow longer: --timeout S, up to 10 s (profile mine's timeouts.max_s)"


def test_at_the_ceiling_a_higher_shipped_profile_is_named() -> None:
    prof = profiles.load("untrusted")
    text = remedy.for_run(3600, 3600, prof).how_to_raise()
    assert text.startswith("3600 s (1 h) is profile untrusted's timeouts.max_s, the ceiling")
    assert "ci (21600 s (6 h))" in text and "default" not in text


def test_the_dict_says_how_to_raise() -> None:
    data = remedy.for_run(None, 60, profiles.load("default")).to_dict()
    assert data["kind"] == "profile" and data["max_s"] == 3600 and data["raise"].startswith("to allow longer")


@pytest.mark.parametrize(
    ("name", "why", "expected"),
    [
        ("overlay", "", "bubblewrap 0.9"),
        ("net-transparent", "", "run as root"),
        ("tree-kill", "setting up uid map: Permission denied", "kernel.unprivileged_userns_clone=1"),
        ("seccomp", "libseccomp is missing", "libseccomp2"),
    ],
)
def test_host_changes(name: str, why: str, expected: str) -> None:
    assert expected in " ".join(remedy.host_changes(name, why))


def test_cgroup_changes_depend_on_who_and_which_cgroup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from sandbox.backends import cgroups

    monkeypatch.setattr(cgroups, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    [v1] = remedy.host_changes("memory-limit")
    assert "systemd.unified_cgroup_hierarchy=1" in v1 and "Delegate=yes" in v1
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    [v2] = remedy.host_changes("pids-limit")
    assert "unified_cgroup_hierarchy" not in v2 and "Delegate=yes" in v2
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert "Delegate" not in remedy.host_changes("limits.cpus")[0]


@pytest.mark.parametrize(
    ("backend", "why", "expected"),
    [
        ("docker", "the Docker daemon is unreachable at /var/run/docker.sock (Permission denied)", "docker group"),
        ("docker", "cannot reach the Docker daemon: connection refused", "systemctl start docker"),
        ("bwrap", "bubblewrap is not installed (apt-get install bubblewrap)", "apt-get install bubblewrap"),
        ("bwrap", "bwrap: setting up uid map: Permission denied", "apparmor_restrict_unprivileged_userns=0"),
    ],
)
def test_backend_changes(backend: str, why: str, expected: str) -> None:
    assert expected in " ".join(remedy.backend_changes(backend, why)).replace("-aG docker", "docker group")


def _scripted(reports: dict[str, Report]) -> Callable[[str], Report]:
    """The backends' reports as ``remedy.explain`` asks for them (the backends layer's probe)."""
    return lambda name: reports[name]


def _bwrap_without_cgroups() -> Report:
    report = Report("bwrap", True)
    for name in ("fs-readonly-root", "fs-write-confined", "fs-hidden-home", "net-none", "net-confined", "tree-kill"):
        report.grant(name, True)
    for name in ("no-new-privs", "non-root", "no-caps", "env-scrubbed", "new-session", "pids-limit", "seccomp"):
        report.grant(name, True)
    report.grant("fsize-limit", True)
    report.grant("tmp-size-limit", True)
    report.grant("memory-limit", False, "no memory cgroup")
    report.grant("overlay", False, "mounting an overlay needs root here")
    return report


def test_a_refusal_names_who_required_what_runs_here_and_the_remedy() -> None:
    probe = _scripted(
        {
            "bwrap": _bwrap_without_cgroups(),
            "docker": Report("docker", False, "Permission denied"),
            "landlock": Report("landlock", False, "Landlock ABI 4 here"),
        }
    )
    prof = profiles.load("untrusted")
    error = remedy.explain(GuaranteeUnavailable("no backend", profile="untrusted"), prof, {}, probe)
    assert error.message.startswith("profile 'untrusted' needs what this host cannot give: memory-limit (bwrap: no")
    assert "backend docker is unavailable (Permission denied)" in error.message.splitlines()[0]
    assert error.data["profile"] == "untrusted"
    assert error.data["required_by"] == {"memory-limit": "profile untrusted, requires = [..., 'memory-limit']"}
    runs = {alt["profile"]: alt for alt in error.data["runs_here"]}
    assert set(runs) >= {"default", "readonly"} and "trusted" not in runs and "ci" not in runs
    assert runs["default"] == {
        "profile": "default",
        "backend": "bwrap",
        "gives_up": ["memory-limit"],
        "differs": {"mount.strategy": "rw (not copy)"},
    }
    assert set(error.data["remedy"]) == {"memory-limit", "backend docker", "backend landlock"}


def test_overlay_from_a_flag_is_the_flags_fault() -> None:
    probe = _scripted(
        {
            "bwrap": _bwrap_without_cgroups(),
            "docker": Report("docker", False, "Permission denied"),
            "landlock": Report("landlock", False, "Landlock ABI 4 here"),
        }
    )
    prof = profiles.load("default").override({"mount.strategy": "overlay"})
    error = remedy.explain(GuaranteeUnavailable("x"), prof, {"mount.strategy": "--mount overlay"}, probe)
    assert error.message.startswith("--mount overlay needs what this host cannot give: overlay (bwrap: mounting")
    assert error.data["required_by"] == {"overlay": "--mount overlay"}
    assert error.data["remedy"]["overlay"][0].startswith("--mount copy")
    assert "  required by: overlay: --mount overlay" in error.message.splitlines()
    assert "default" in {alt["profile"] for alt in error.data["runs_here"]}  # without the flag, it runs
    same = remedy.explain(GuaranteeUnavailable("x"), prof, {}, probe)
    assert "default" not in {alt["profile"] for alt in same.data["runs_here"]}
    assert same.data["required_by"] == {"overlay": "profile default, mount.strategy = 'overlay'"}
