"""Where per-call cgroups go, decided on fake cgroup trees (this host is cgroup v1 only).

The decision is pure logic over a :class:`cgroups.HostView` (mounts, our cgroup paths, our uid)
and the files of the tree, so a directory in tmp stands in for ``/sys/fs/cgroup``: v1 and v2,
root and an ordinary user, with and without a delegated (user-owned) subtree. The real v1 paths
are exercised by the integration tests. The limit plan (which mechanism enforces each limit, and
which limit is refused) is checked the same way, over fake detection results.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox import profile as profiles
from sandbox.backends import cgroups, confine, local
from sandbox.guarantees import Report

OTHER_UID = 4242  # not ours: a tree owned by it is not delegated to us


@pytest.fixture
def user_uid() -> int:
    """A non-root uid that can own files here: ours, or (as root) one we chown to."""
    return os.geteuid() or 4343


def _cgroup_dir(path: Path, owner: int | None = None, controllers: str = "", procs: str = "") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in (("cgroup.controllers", controllers), ("cgroup.subtree_control", ""), ("cgroup.procs", procs)):
        (path / name).write_text(text)
    if owner is not None and os.geteuid() == 0:
        for entry in (path, *path.iterdir()):
            os.chown(entry, owner, owner)
    return path


def _v2_view(mount: Path, own: str, euid: int) -> cgroups.HostView:
    return cgroups.HostView(((str(mount), "cgroup2", "rw"),), {"": own}, euid, 1234)


def test_v1_as_root_uses_our_own_cgroup_of_each_hierarchy(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("root's v1 decision checks that root can write the fake tree (os.access)")
    for ctrl in ("memory", "pids"):
        _cgroup_dir(tmp_path / ctrl / "svc")
    view = cgroups.HostView(
        ((str(tmp_path / "memory"), "cgroup", "rw,memory"), (str(tmp_path / "pids"), "cgroup", "rw,pids")),
        {"memory": "/svc", "pids": "/svc"},
        0,
        1,
    )
    found = cgroups.detect(view)
    assert found["memory"] == cgroups.Hierarchy("memory", 1, tmp_path / "memory" / "svc")
    assert found["pids"] == cgroups.Hierarchy("pids", 1, tmp_path / "pids" / "svc")
    assert "no cgroup hierarchy" in str(found["cpu"])


def test_v1_for_an_ordinary_user_needs_a_delegated_directory(tmp_path: Path, user_uid: int) -> None:
    _cgroup_dir(tmp_path / "pids" / "mine", owner=user_uid)
    view = cgroups.HostView(((str(tmp_path / "pids"), "cgroup", "rw,pids"),), {"pids": "/mine"}, user_uid, 1)
    assert cgroups.detect(view)["pids"] == cgroups.Hierarchy("pids", 1, tmp_path / "pids" / "mine", delegated=True)
    stranger = cgroups.HostView(view.mounts, view.own, OTHER_UID, 1)
    assert "not writable by uid 4242" in str(cgroups.detect(stranger)["pids"])


def test_v2_as_root_creates_a_sandbox_subtree_with_the_controllers(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("root's v2 decision writes the hierarchy's root, which only root owns")
    _cgroup_dir(tmp_path, controllers="cpuset cpu io memory pids")
    found = cgroups.detect(_v2_view(tmp_path, "/", 0))
    assert found["memory"] == cgroups.Hierarchy("memory", 2, tmp_path / "sandbox")
    assert (tmp_path / "sandbox").is_dir()
    assert (tmp_path / "sandbox" / "cgroup.subtree_control").read_text().startswith("+")


def test_v2_not_delegated_tells_the_user_how_to_get_a_delegated_scope(tmp_path: Path, user_uid: int) -> None:
    _cgroup_dir(tmp_path, controllers="memory pids cpu")
    _cgroup_dir(tmp_path / "user.slice" / "session-1.scope", owner=user_uid, controllers="memory pids cpu")
    found = cgroups.detect(_v2_view(tmp_path, "/user.slice/session-1.scope", OTHER_UID))
    for ctrl in ("memory", "pids", "cpu"):
        reason = found[ctrl]
        assert isinstance(reason, str)
        assert "not delegated to uid 4242" in reason and "systemd-run --user --scope -p Delegate=yes" in reason
    assert not (tmp_path / "user.slice" / "session-1.scope" / cgroups.LEAF).exists()


def test_v2_delegated_moves_our_processes_into_a_leaf_then_enables_controllers(tmp_path: Path, user_uid: int) -> None:
    _cgroup_dir(tmp_path, controllers="memory pids cpu io")
    scope = _cgroup_dir(
        tmp_path / "user.slice" / "run-u7.scope", owner=user_uid, controllers="memory pids", procs="1234\n"
    )
    found = cgroups.detect(_v2_view(tmp_path, "/user.slice/run-u7.scope", user_uid))
    # No internal processes: the executor now lives in the leaf, calls go beside it.
    assert (scope / cgroups.LEAF / "cgroup.procs").read_text() == "1234"
    assert (scope / "cgroup.subtree_control").read_text() in ("+memory", "+pids")
    assert found["memory"] == cgroups.Hierarchy("memory", 2, scope, delegated=True)
    assert found["pids"] == cgroups.Hierarchy("pids", 2, scope, delegated=True)
    assert cgroups.Hierarchy("memory", 2, scope, delegated=True).mechanism == "cgroup v2 (delegated)"
    # cpu is in the hierarchy but the scope was not given it.
    assert "cannot enable the cpu controller" in str(found["cpu"])


def test_v2_delegated_already_in_the_leaf_uses_its_parent(tmp_path: Path, user_uid: int) -> None:
    _cgroup_dir(tmp_path, controllers="memory pids")
    scope = _cgroup_dir(tmp_path / "run-u8.scope", owner=user_uid, controllers="memory pids")
    _cgroup_dir(scope / cgroups.LEAF, owner=user_uid, procs="99\n")
    found = cgroups.detect(_v2_view(tmp_path, f"/run-u8.scope/{cgroups.LEAF}", user_uid))
    assert found["pids"] == cgroups.Hierarchy("pids", 2, scope, delegated=True)
    assert not (scope / cgroups.LEAF / cgroups.LEAF).exists()


def test_hybrid_host_uses_v1_when_v2_holds_no_controller(tmp_path: Path, user_uid: int) -> None:
    _cgroup_dir(tmp_path / "unified")
    _cgroup_dir(tmp_path / "pids" / "me", owner=user_uid)
    view = cgroups.HostView(
        ((str(tmp_path / "unified"), "cgroup2", "rw"), (str(tmp_path / "pids"), "cgroup", "rw,pids")),
        {"": "/", "pids": "/me"},
        user_uid,
        1,
    )
    assert cgroups.detect(view)["pids"] == cgroups.Hierarchy("pids", 1, tmp_path / "pids" / "me", delegated=True)


# --- which mechanism enforces each limit, and what is refused ------------------------------------


def _fake_host(monkeypatch: pytest.MonkeyPatch, euid: int, **present: cgroups.Hierarchy) -> None:
    found: dict[str, cgroups.Hierarchy | str] = {c: f"no {c} cgroup here" for c in cgroups.CONTROLLERS}
    found.update(present)
    monkeypatch.setattr(cgroups, "hierarchies", lambda: found)
    monkeypatch.setattr(os, "geteuid", lambda: euid)


def test_an_ordinary_user_without_cgroups_gets_rlimits_said_to_be_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_host(monkeypatch, 1000)
    plan = confine.enforcement("bwrap")
    assert plan["memory"].how == "rlimit DATA" and plan["memory"].scope == "process"
    assert plan["pids"].how is not None and "NPROC" in plan["pids"].how and plan["pids"].scope == "call"
    assert plan["cpus"].how is None and "cpu cgroup" in plan["cpus"].why_not
    import resource

    prof = profiles.Profile().with_overrides(**{"limits.memory": "100MiB", "limits.pids": 50})
    assert (resource.RLIMIT_DATA, 100 * 2**20) in confine.rlimits(prof, "bwrap")
    assert (resource.RLIMIT_NPROC, 50) in confine.rlimits(prof, "bwrap")
    assert not any(res == resource.RLIMIT_NPROC for res, _ in confine.rlimits(prof, "host"))


def test_root_without_a_pids_cgroup_cannot_count_on_nproc(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_host(monkeypatch, 0, memory=cgroups.Hierarchy("memory", 1, Path("/x")))
    plan = confine.enforcement("bwrap")
    assert plan["pids"].how is None and "not enforce RLIMIT_NPROC for root" in plan["pids"].why_not
    assert plan["memory"].how == "cgroup v1" and plan["memory"].scope == "call"


def test_a_limit_asked_for_that_cannot_be_enforced_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_host(monkeypatch, 1000)
    report = Report("bwrap", True)
    local.report_limits(report, "bwrap", None)
    asked = profiles.Profile().with_overrides(**{"limits.cpus": 0.5, "limits.memory": "100MiB"})
    assert list(report.refused_limits(asked)) == ["limits.cpus"]
    assert report.refused_limits(profiles.Profile()) == {}  # nothing asked beyond the defaults
    assert report.guarantees["memory-limit"] is False and "per process" in report.reasons["memory-limit"]
    assert report.guarantees["pids-limit"] is True
    assert any("Delegate=yes" in line for line in report.advice)
    assert report.limits_in_force(asked)["memory"] == {
        "value": 100 * 2**20,
        "enforced": True,
        "how": "rlimit DATA",
        "scope": "process",
    }


def test_the_host_backend_refuses_a_pids_limit_without_a_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_host(monkeypatch, 1000)
    report = Report("host", True)
    local.report_limits(report, "host", None)
    refused = report.refused_limits(profiles.Profile().with_overrides(**{"limits.pids": 50}))
    assert "every process of this user" in refused["limits.pids"]
