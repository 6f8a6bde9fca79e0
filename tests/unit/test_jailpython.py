"""The jail's interpreter (:mod:`sandbox.backends.jailpython`): verified on the host, never shadowed by a mount."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from sandbox.backends import jailpython
from sandbox.backends.docker import config
from sandbox.errors import BackendUnavailable
from tests.conftest import make_profile


@pytest.fixture(autouse=True)
def _fresh_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jailpython, "_kept", None)


def test_the_hosts_python_is_a_root_owned_file_nobody_else_can_write() -> None:
    python = jailpython.host_python()
    assert os.path.isabs(python) and python == os.path.realpath(python)
    st = os.stat(python)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _only(monkeypatch: pytest.MonkeyPatch, candidate: Path) -> None:
    """``candidate`` the only interpreter, in a directory the jail "shows" (its own)."""
    monkeypatch.setattr(jailpython, "CANDIDATES", (str(candidate),))
    real_verify = jailpython._verify
    monkeypatch.setattr(jailpython, "_verify", lambda shown: real_verify((*shown, str(candidate.parent))))


def test_an_interpreter_in_a_writable_directory_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a root-owned interpreter in a writable directory needs root to make")
    planted = tmp_path / "python3"
    planted.write_text("#!/bin/sh\n")
    planted.chmod(0o755)
    tmp_path.chmod(0o777)  # anyone may replace it
    _only(monkeypatch, planted)
    with pytest.raises(BackendUnavailable, match="writable by its group or by others"):
        jailpython.host_python()


def test_an_interpreter_owned_by_someone_else_than_root_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    planted = tmp_path / "python3"
    planted.write_text("#!/bin/sh\n")
    if os.geteuid() == 0:
        os.chown(planted, 1000, 1000)
    _only(monkeypatch, planted)
    with pytest.raises(BackendUnavailable, match="not root"):
        jailpython.host_python()


def test_a_link_is_judged_by_the_file_it_leads_to(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``/usr/bin/python3`` pointing into a writable place is refused, whatever the link's own owner."""
    target = tmp_path / "real-python"
    target.write_text("#!/bin/sh\n")
    target.chmod(0o777)
    link = tmp_path / "python3"
    link.symlink_to(target)
    _only(monkeypatch, link)
    with pytest.raises(BackendUnavailable, match=str(target)):
        jailpython.host_python()


def test_a_mount_at_or_above_the_interpreter_is_refused() -> None:
    python = jailpython.host_python()
    for target in ("/", os.path.dirname(python), python):
        with pytest.raises(BackendUnavailable, match="would lie under"):
            jailpython.bwrap_python(["/tmp/ws", target])
    assert jailpython.bwrap_python(["/tmp/ws", "/tmp", f"{python}-not"]) == python


def test_docker_refuses_a_mount_over_the_images_interpreter() -> None:
    for target in ("/usr", "/usr/bin", "/usr/bin/python3.11"):
        with pytest.raises(BackendUnavailable):
            jailpython.image_python(["/tmp", target])
    assert jailpython.image_python(["/tmp", "/home/me/ws", "/usr/binary"]) == jailpython.IMAGE_PYTHON


def test_docker_agent_is_started_by_absolute_path_and_checked(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    made = config.container_config(make_profile(), "j", ws, ws, agent_user="1000:1000")
    assert made["entrypoint"] == [jailpython.IMAGE_PYTHON]
    with pytest.raises(BackendUnavailable):
        config.container_config(make_profile(), "j", ws, ws, scratch=Path("/usr/bin"), agent_user="1000:1000")


def test_the_verdict_is_kept_and_costs_a_stat_per_jail(monkeypatch: pytest.MonkeyPatch) -> None:
    first = time.perf_counter()
    python = jailpython.host_python()
    verify_s = time.perf_counter() - first
    monkeypatch.setattr(jailpython, "_verify", lambda _shown: pytest.fail("verified again"))
    start = time.perf_counter()
    for _ in range(1000):
        assert jailpython.bwrap_python(["/tmp/ws", "/tmp"]) == python
    per_jail_s = (time.perf_counter() - start) / 1000
    print(f"verify {verify_s * 1e3:.2f} ms, then {per_jail_s * 1e6:.1f} us per jail")  # noqa: T201
    assert per_jail_s < 1e-3


def test_a_changed_interpreter_is_verified_again(monkeypatch: pytest.MonkeyPatch) -> None:
    python = jailpython.host_python()
    kept = jailpython._kept
    assert kept is not None
    monkeypatch.setattr(jailpython, "_kept", kept._replace(key=(0, 0, 0, 0, 0)))  # as after a package upgrade
    calls: list[tuple[str, ...]] = []
    real_verify = jailpython._verify

    def verify(shown: tuple[str, ...]) -> jailpython._Verdict:
        calls.append(shown)
        return real_verify(shown)

    monkeypatch.setattr(jailpython, "_verify", verify)
    assert jailpython.host_python() == python
    assert len(calls) == 1
