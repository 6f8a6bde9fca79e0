"""The Docker backend against a remote engine: a second dockerd over TLS that cannot see our files.

The engine (:mod:`tests.remote_engine`) is started once per session: its own data root, exec
root and containerd, TLS with a throw-away CA on a loopback port, and a tmpfs over the test
run's temporary root in its mount namespace, so no workspace a test makes is visible to it
(:func:`test_the_engine_cannot_see_the_workspace` proves that first). Against it run the
contract suite's copy cases, its stream and tree-kill cases (their profiles' mounts made
``copy``: ``rw`` is refused there, which its own test checks), in both lifecycles, then what is
remote-only: ``rw``/``ro`` refused with the reason, the attach stream chosen because the engine is
remote, TLS mistakes as BACKEND_UNAVAILABLE naming the TLS reason, ``sandbox check``'s engine
report. The tar attacks need no engine: hand-made malicious archives go straight to the copy-out
code (:func:`sandbox.backends.docker.archive.sync_from_tar`) that reads the engine's stream.
"""

from __future__ import annotations

import functools
import io
import os
import stat
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox.errors import BackendUnavailable, GuaranteeUnavailable, InvalidArgument
from tests.conftest import backend_or_skip, make_profile, own_like_a_checkout
from tests.integration import test_contracts as contracts

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from sandbox import profile as profiles
    from sandbox.backends import base
    from tests.remote_engine import RemoteEngine

pytestmark = pytest.mark.anyio
engine_tests = [pytest.mark.docker, pytest.mark.root]


# --- the remote engine ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def remote_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteEngine]:
    from sandbox.backends.docker.client import DEFAULT_IMAGE
    from tests import remote_engine as engines

    try:
        engine = engines.start(tmp_path_factory.getbasetemp(), DEFAULT_IMAGE)
    except engines.Unavailable as exc:
        pytest.skip(f"no remote engine: {exc}")
    try:
        yield engine
    finally:
        engines.stop(engine)


@pytest.fixture
def remote_env(remote_engine: RemoteEngine, monkeypatch: pytest.MonkeyPatch) -> RemoteEngine:
    """DOCKER_HOST and its TLS variables name the remote engine for this test (a probe of it too)."""
    for key, value in remote_engine.env().items():
        monkeypatch.setenv(key, value)
    found = backend_or_skip("docker")
    monkeypatch.setattr(found, "_probed", None)  # restored afterwards: other modules probe the host's engine
    return remote_engine


@pytest.fixture
def backend(remote_env: RemoteEngine) -> base.Backend:  # noqa: ARG001 - for the environment it sets
    """Overrides conftest's: the contract tests imported below get the docker backend, remote."""
    return backend_or_skip("docker")


@pytest.fixture(params=["session", "call"])
def lifecycle(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _remote_profile(profile: profiles.Profile, lifecycle: str) -> profiles.Profile:
    overrides: dict[str, Any] = {"docker.lifecycle": lifecycle}
    if profile.mount.strategy != "copy":
        overrides["mount.strategy"] = "copy"  # rw and ro bind the workspace: refused on a remote engine
    return profile.with_overrides(**overrides)


@pytest.fixture
async def open_jail(backend: base.Backend, workspace: Path, lifecycle: str) -> AsyncIterator[Any]:
    """Overrides conftest's: every jail of a test on the remote engine, with a copy mount."""
    opened: list[base.Jail] = []

    async def factory(profile: profiles.Profile | None = None, ws: Path | None = None) -> base.Jail:
        jail = await backend.open_jail(ws or workspace, _remote_profile(profile or make_profile(), lifecycle))
        opened.append(jail)
        return jail

    yield factory
    for jail in opened:
        await jail.aclose()


def _contract(name: str) -> Any:
    """A test of the contract suite, run here against the remote engine (its file unchanged).

    A wrapper, not the function itself: marking that would mark the contract suite's own test.
    """
    original = getattr(contracts, name)

    @functools.wraps(original)
    async def test(*args: Any, **kwargs: Any) -> None:
        await original(*args, **kwargs)

    marked: Any = test
    for mark in engine_tests:
        marked = mark(marked)
    return marked


# The contract suite's copy cases, unchanged: the workspace goes in and out through the archive API.
test_copy_mount_leaves_host_untouched_until_apply = _contract("test_copy_mount_leaves_host_untouched_until_apply")
test_copy_apply_holds_flagged_changes_back_without_consent = _contract(
    "test_copy_apply_holds_flagged_changes_back_without_consent"
)
test_copy_apply_refuses_a_file_changed_on_the_host = _contract("test_copy_apply_refuses_a_file_changed_on_the_host")
test_copy_special_files_and_outside_symlinks_never_come_back = _contract(
    "test_copy_special_files_and_outside_symlinks_never_come_back"
)
test_copy_mount_of_another_users_workspace_keeps_owners_on_apply = _contract(
    "test_copy_mount_of_another_users_workspace_keeps_owners_on_apply"
)
test_full_disk_during_copy_in_is_a_clear_error_and_loses_nothing = _contract(
    "test_full_disk_during_copy_in_is_a_clear_error_and_loses_nothing"
)
small_data_dir = contracts.small_data_dir
# Streams and the tree kill (over the attach stream: the agent's socket cannot be bound remotely).
test_stdout_and_stderr_are_apart_and_exit_code_kept = _contract("test_stdout_and_stderr_are_apart_and_exit_code_kept")
test_output_streams_as_it_comes = _contract("test_output_streams_as_it_comes")
test_killed_by_signal_reports_128_plus_n = _contract("test_killed_by_signal_reports_128_plus_n")
test_big_output_is_bounded_per_stream = _contract("test_big_output_is_bounded_per_stream")
test_timeout_kills_setsid_double_fork_and_term_ignoring = _contract(
    "test_timeout_kills_setsid_double_fork_and_term_ignoring"
)
test_abort_kills_the_tree = _contract("test_abort_kills_the_tree")
test_cancellation_kills_the_tree_and_propagates = _contract("test_cancellation_kills_the_tree_and_propagates")
test_background_process_dies_with_a_normal_exit = _contract("test_background_process_dies_with_a_normal_exit")
test_jail_close_kills_what_it_runs = _contract("test_jail_close_kills_what_it_runs")
test_workspace_is_cwd_at_the_same_path = _contract("test_workspace_is_cwd_at_the_same_path")
test_non_root_without_privileges = _contract("test_non_root_without_privileges")
test_no_network_egress = _contract("test_no_network_egress")


# --- what only a remote engine has ----------------------------------------------------------


@pytest.mark.docker
@pytest.mark.root
def test_the_engine_cannot_see_the_workspace(remote_env: RemoteEngine, workspace: Path) -> None:  # noqa: ARG001
    """The setup is what it claims: a bind of the workspace fails on the remote engine."""
    import docker.errors
    from docker.types import Mount

    from sandbox.backends.docker.client import DEFAULT_IMAGE, connect

    client = connect()
    try:
        bind = Mount(target="/w", source=str(workspace), type="bind")
        with pytest.raises(docker.errors.APIError) as info:
            client.api.create_container(
                DEFAULT_IMAGE, ["true"], host_config=client.api.create_host_config(mounts=[bind])
            )
        assert "does not exist" in str(info.value.explanation)
    finally:
        client.close()


@pytest.mark.docker
@pytest.mark.root
@pytest.mark.parametrize(("profile_name", "mount"), [("default", "rw"), ("readonly", "ro")])
async def test_binding_mounts_are_refused_with_the_reason(
    backend: base.Backend, workspace: Path, profile_name: str, mount: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        await backend.open_jail(workspace, make_profile(profile_name))
    assert info.value.code == "INVALID_ARGUMENT"
    assert f"mount {mount!r}" in info.value.message and "remote engine" in info.value.message
    assert "copy" in info.value.message and info.value.data["remote"]


@pytest.mark.docker
@pytest.mark.root
async def test_allowlist_network_is_refused_on_a_remote_engine(backend: base.Backend, workspace: Path) -> None:
    profile = make_profile("untrusted", **{"network.mode": "allowlist", "network.allow": ("example.com",)})
    # The mode implies the net-allowlist guarantee, which the remote engine's report withholds.
    with pytest.raises(GuaranteeUnavailable, match="net-allowlist") as info:
        await backend.open_jail(workspace, profile)
    assert "remote engine" in info.value.message


@pytest.mark.docker
@pytest.mark.root
async def test_agent_calls_take_the_attach_stream_because_the_engine_is_remote(
    backend: base.Backend, workspace: Path, lifecycle: str
) -> None:
    """Chosen because the engine is remote, not because a bind of our socket happened to fail there."""
    jail = await backend.open_jail(workspace, make_profile("untrusted", **{"docker.lifecycle": lifecycle}))
    try:
        assert "a remote engine cannot bind our socket's directory" in jail.stream_note  # type: ignore[attr-defined]
        result = await contracts.sh(jail, "echo out; echo err >&2")
        assert (result.stdout, result.stderr) == ("out\n", "err\n")
        assert "a remote engine cannot bind our socket's directory" in jail.stream_note  # type: ignore[attr-defined]
        if lifecycle == "session":
            assert jail.stream == "attach"  # type: ignore[attr-defined]
    finally:
        await jail.aclose()


@pytest.mark.docker
@pytest.mark.root
async def test_one_profile_table_moves_the_session(
    remote_engine: RemoteEngine, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No DOCKER_* variable: ``[docker] host`` and its TLS files alone reach the remote engine."""
    for key in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(key, raising=False)
    own_like_a_checkout(workspace)
    backend = backend_or_skip("docker")  # the host's engine answers the probe; the jail goes remote
    profile = make_profile("untrusted", **remote_engine.profile_overrides())
    jail = await backend.open_jail(workspace, profile)
    try:
        result = await contracts.sh(jail, "echo remote > made-there.txt; cat README.md")
        assert result.exit_code == 0 and result.stdout == "# sample\n", result.stderr
        changes = await jail.changes()
        assert changes is not None
        assert [(c.path, c.status) for c in changes.changes] == [("made-there.txt", "added")]
        assert not (workspace / "made-there.txt").exists()
        container = jail.container_id  # type: ignore[attr-defined]
    finally:
        await jail.aclose()
    import docker.errors

    from sandbox.backends.docker.client import connect, engine_of

    client = connect(engine=engine_of(profile.docker))
    try:
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_container(container)  # it ran there, and is gone with the jail
        leftovers = client.volumes.list(filters={"label": "sandbox.jail"})
        assert leftovers == [], "the jail's volume outlived it"
    finally:
        client.close()


@pytest.mark.docker
@pytest.mark.root
@pytest.mark.parametrize("mistake", ["wrong CA", "no client certificate"])
async def test_tls_mistakes_are_backend_unavailable_with_the_reason(
    remote_engine: RemoteEngine, workspace: Path, tmp_path: Path, mistake: str
) -> None:
    from tests.remote_engine import make_ca

    overrides = remote_engine.profile_overrides()
    if mistake == "wrong CA":
        overrides["docker.tls_ca"] = str(make_ca(tmp_path / "other-ca", "not-the-engine-ca"))
    else:
        del overrides["docker.tls_cert"], overrides["docker.tls_key"]
    backend = backend_or_skip("docker")
    with pytest.raises(BackendUnavailable) as info:
        await backend.open_jail(workspace, make_profile("untrusted", **overrides))
    assert info.value.code == "BACKEND_UNAVAILABLE"
    assert "TLS" in info.value.message, info.value.message
    reason = str(info.value.data.get("tls", "")).upper()
    expected = "CERTIFICATE_VERIFY_FAILED" if mistake == "wrong CA" else "CERTIFICATE"
    assert expected in reason, info.value.message


@pytest.mark.docker
@pytest.mark.root
def test_a_wrong_ca_in_the_environment_makes_check_say_why(
    remote_engine: RemoteEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox.backends import docker as docker_backend
    from tests.remote_engine import make_ca

    certs = tmp_path / "certs"
    certs.mkdir()
    make_ca(certs, "not-the-engine-ca")
    for name in ("cert.pem", "key.pem"):
        (certs / name).write_bytes((remote_engine.certs.folder / name).read_bytes())
    monkeypatch.setenv("DOCKER_HOST", remote_engine.host)
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    monkeypatch.setenv("DOCKER_CERT_PATH", str(certs))
    report = docker_backend._report()
    assert not report.available
    assert "TLS handshake" in report.reason and "CERTIFICATE_VERIFY_FAILED" in report.reason


@pytest.mark.docker
@pytest.mark.root
def test_check_names_the_remote_engine_and_what_it_provides(remote_env: RemoteEngine) -> None:
    from sandbox.backends import docker as docker_backend

    report = docker_backend._report()
    assert report.available, report.reason
    assert report.details["engine"].startswith("Docker Engine ")
    assert report.details["remote"] and remote_env.host in report.details["remote"]
    assert report.details["mounts"] == ["copy (archive API)"]
    assert report.details["tls"] is True
    assert report.details["stream"].startswith("attach")
    assert not report.guarantees["net-allowlist"] and not report.guarantees["net-transparent"]
    assert any("only copy mounts, through the archive API" in line for line in report.advice)


# --- the engine's view, as profile settings -------------------------------------------------


def test_engine_of_a_profile() -> None:
    from sandbox.backends.docker.client import engine_of

    assert engine_of(make_profile("untrusted", **{"docker.host": "tcp://10.0.0.2:2376"}).docker).remote
    assert engine_of(make_profile("untrusted", **{"docker.host": "ssh://me@far"}).docker).remote
    assert engine_of(make_profile("untrusted", **{"docker.host": "unix:///run/docker.sock"}).docker).remote is None
    declared = make_profile("untrusted", **{"docker.host": "unix:///run/vm.sock", "docker.remote": True})
    assert engine_of(declared.docker).remote


@pytest.mark.parametrize(
    "overrides",
    [
        {"docker.tls_ca": "/ca.pem"},  # TLS without a tcp host
        {"docker.host": "tcp://h:2376", "docker.tls_cert": "/c.pem"},  # a certificate without its key
        {"docker.host": "tcp://h:2376", "docker.tls_verify": True},  # verify against no CA
        {"docker.host": "http://h:2375"},
    ],
)
def test_engine_settings_that_cannot_work_are_refused(overrides: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        make_profile("untrusted", **overrides)


def test_a_remote_config_binds_nothing(tmp_path: Path) -> None:
    from docker.types import Mount

    from sandbox.backends.docker.config import container_config, for_remote_engine

    ws = tmp_path / "ws"
    ws.mkdir()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    profile = make_profile("untrusted")
    config = container_config(profile, "j1", ws, tmp_path / "copy", scratch, untracked=[".venv"])
    volume = Mount(target=str(ws), source="vol1", type="volume")
    remote = for_remote_engine(config, volume, "1000:1000", scratch)
    assert [m["Type"] for m in remote["mounts"]] == ["volume"]
    assert remote["mounts"][0]["Source"] == "vol1" and remote["mounts"][0]["Target"] == str(ws)
    assert "uid=1000" in remote["tmpfs"][str(scratch)]


# --- the tar attacks, against the copy-out code ---------------------------------------------


TOP = "ws"
WORKSPACE = "/work/ws"


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> list[bytes]:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = out.getvalue()
    return [raw[i : i + 700] for i in range(0, len(raw), 700)]  # chunked, as the engine streams it


def _dir(name: str, mode: int = 0o755) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    return info, None


def _file(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def _node(name: str, kind: bytes) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.devmajor, info.devminor = kind, 0o666, 1, 3
    return info, None


@pytest.fixture
def copy_root(tmp_path: Path) -> Path:
    root = tmp_path / "copy"
    root.mkdir()
    (root / "kept.txt").write_text("same\n")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret").write_text("host file\n")
    return path


def _sync(chunks: list[bytes], root: Path, **limits: int) -> Any:
    from sandbox.backends.docker.archive import Limits, sync_from_tar

    return sync_from_tar(chunks, root, WORKSPACE, Limits(**limits) if limits else None)


def _untouched(root: Path, outside: Path) -> None:
    assert (outside / "secret").read_text() == "host file\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (root / "kept.txt").read_text() == "same\n"


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (_file("/etc/evil"), "absolute"),
        (_file("ws/../evil"), "'..'"),
        (_file("ws/a/../../evil"), "'..'"),
        (_file("other/evil"), "not under"),
        (_file("ws//evil"), "empty"),
        (_file("ws/./evil"), "'.'"),
    ],
)
def test_bad_names_are_refused(copy_root: Path, outside: Path, member: Any, why: str) -> None:
    from sandbox.backends.docker.archive import TarRefused

    with pytest.raises(TarRefused) as info:
        _sync(_tar(_dir("ws"), member), copy_root)
    assert why in info.value.message and info.value.code == "TOOL_FAILED"
    assert not (copy_root.parent / "evil").exists() and not Path("/etc/evil").exists()
    _untouched(copy_root, outside)


def test_nothing_is_written_through_a_symlink_in_the_archive(copy_root: Path, outside: Path) -> None:
    from sandbox.backends.docker.archive import TarRefused

    chunks = _tar(_dir("ws"), _link("ws/out", str(outside)), _file("ws/out/pwned", b"owned"))
    with pytest.raises(TarRefused, match="written through"):
        _sync(chunks, copy_root)
    _untouched(copy_root, outside)
    assert not (copy_root / "out").exists()  # an outside symlink is never created here


def test_nothing_is_written_through_a_relative_symlink_inside(copy_root: Path) -> None:
    from sandbox.backends.docker.archive import TarRefused

    # An inside symlink is created (it is the jail's change), but never written through.
    chunks = _tar(_dir("ws"), _dir("ws/d"), _link("ws/in", "d"), _file("ws/in/f", b"through"))
    with pytest.raises(TarRefused, match="written through"):
        _sync(chunks, copy_root)
    assert not (copy_root / "d" / "f").exists()


def test_a_symlink_planted_in_the_copy_is_replaced_not_followed(copy_root: Path, outside: Path) -> None:
    (copy_root / "d").symlink_to(outside)
    _sync(_tar(_dir("ws"), _file("ws/kept.txt", b"same\n"), _dir("ws/d"), _file("ws/d/secret", b"jail")), copy_root)
    _untouched(copy_root, outside)
    assert (copy_root / "d").is_dir() and not (copy_root / "d").is_symlink()
    assert (copy_root / "d" / "secret").read_bytes() == b"jail"


@pytest.mark.parametrize(
    "target", ["/etc/shadow", "ws/../outside/secret", "../outside/secret", "ws/later.txt", "ws/nothing"]
)
def test_hard_links_out_or_forward_are_refused(copy_root: Path, outside: Path, target: str) -> None:
    from sandbox.backends.docker.archive import TarRefused

    chunks = _tar(_dir("ws"), _link("ws/h", target, tarfile.LNKTYPE), _file("ws/later.txt"))
    with pytest.raises(TarRefused, match="hard link"):
        _sync(chunks, copy_root)
    _untouched(copy_root, outside)


def test_a_hard_link_inside_is_copied_not_linked(copy_root: Path) -> None:
    _sync(_tar(_dir("ws"), _file("ws/a", b"data"), _link("ws/b", "ws/a", tarfile.LNKTYPE)), copy_root)
    assert (copy_root / "b").read_bytes() == b"data"
    assert (copy_root / "a").stat().st_ino != (copy_root / "b").stat().st_ino


@pytest.mark.parametrize(
    ("kind", "mode"),
    [(tarfile.FIFOTYPE, stat.S_IFIFO), (tarfile.CHRTYPE, stat.S_IFCHR), (tarfile.BLKTYPE, stat.S_IFBLK)],
)
def test_devices_and_fifos_are_held_back_not_made(copy_root: Path, kind: bytes, mode: int) -> None:
    from sandbox.backends.docker.archive import held_changes
    from sandbox.mounts import CopyTree

    sync = _sync(_tar(_dir("ws"), _file("ws/kept.txt", b"same\n"), _node("ws/node", kind)), copy_root)
    assert not os.path.lexists(copy_root / "node")
    assert [(h.rel, h.kind, h.mode) for h in sync.held] == [("node", "special", mode)]
    [change] = held_changes(sync.held, CopyTree(Path(WORKSPACE), copy_root))
    assert (change.kind, change.flags, change.applicable) == ("special", ["special-file"], False)


def test_an_outside_symlink_is_held_back_not_made(copy_root: Path) -> None:
    from sandbox.backends.docker.archive import held_changes
    from sandbox.mounts import CopyTree

    chunks = _tar(_dir("ws"), _file("ws/kept.txt", b"same\n"), _link("ws/up", "../../.."), _link("ws/abs", "/etc"))
    sync = _sync(chunks, copy_root)
    assert not os.path.lexists(copy_root / "up") and not os.path.lexists(copy_root / "abs")
    changes = held_changes(sync.held, CopyTree(Path(WORKSPACE), copy_root))
    assert {(c.path, c.target, c.applicable) for c in changes} == {("up", "../../..", False), ("abs", "/etc", False)}
    assert all(c.flags == ["symlink-outside"] for c in changes)


def test_an_absolute_symlink_into_the_workspace_is_made(copy_root: Path) -> None:
    _sync(_tar(_dir("ws"), _file("ws/kept.txt", b"same\n"), _link("ws/abs", f"{WORKSPACE}/kept.txt")), copy_root)
    assert os.readlink(copy_root / "abs") == f"{WORKSPACE}/kept.txt"


def test_oversize_members_and_archives_are_refused(copy_root: Path) -> None:
    from sandbox.backends.docker.archive import TarRefused

    with pytest.raises(TarRefused, match="over the limit"):
        _sync(_tar(_dir("ws"), _file("ws/big", b"x" * 100)), copy_root, member=99)
    with pytest.raises(TarRefused, match="past"):
        _sync(_tar(_dir("ws"), _file("ws/a", b"x" * 60), _file("ws/b", b"x" * 60)), copy_root, total=100)
    with pytest.raises(TarRefused, match="members"):
        _sync(_tar(_dir("ws"), _file("ws/a"), _file("ws/b"), _file("ws/c")), copy_root, members=2)
    assert not (copy_root / "big").exists()


def test_a_member_twice_is_refused(copy_root: Path, outside: Path) -> None:
    from sandbox.backends.docker.archive import TarRefused

    chunks = _tar(_dir("ws"), _file("ws/x", b"first"), _link("ws/x", str(outside / "secret")))
    with pytest.raises(TarRefused, match="twice"):
        _sync(chunks, copy_root)
    _untouched(copy_root, outside)


def test_a_member_before_its_directory_is_refused(copy_root: Path) -> None:
    from sandbox.backends.docker.archive import TarRefused

    with pytest.raises(TarRefused, match="written through"):
        _sync(_tar(_dir("ws"), _file("ws/nodir/f")), copy_root)


def test_garbage_is_refused_not_half_read(copy_root: Path) -> None:
    from sandbox.backends.docker.archive import TarRefused

    with pytest.raises(TarRefused):
        _sync([b"\x00garbage" * 200], copy_root)


def test_a_good_archive_mirrors_the_jail_and_keeps_unchanged_inodes(copy_root: Path) -> None:
    (copy_root / "gone.txt").write_text("deleted in the jail\n")
    (copy_root / "sub").mkdir()
    (copy_root / "sub" / "old").write_text("old\n")
    kept_inode = (copy_root / "kept.txt").stat().st_ino
    chunks = _tar(
        _dir("ws", 0o750),
        _file("ws/kept.txt", b"same\n"),
        _file("ws/new.sh", b"#!/bin/sh\n", 0o755),
        _dir("ws/ro", 0o555),
        _file("ws/ro/inner", b"in a read-only dir"),
        _link("ws/rel", "kept.txt"),
    )
    sync = _sync(chunks, copy_root)
    assert sync.held == []
    assert sorted(p.relative_to(copy_root).as_posix() for p in copy_root.rglob("*")) == [
        "kept.txt",
        "new.sh",
        "rel",
        "ro",
        "ro/inner",
    ]
    assert (copy_root / "kept.txt").stat().st_ino == kept_inode  # unchanged: the changeset sees no change
    assert stat.S_IMODE((copy_root / "new.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((copy_root / "ro").stat().st_mode) == 0o555
    assert stat.S_IMODE(copy_root.stat().st_mode) == 0o750
    assert os.readlink(copy_root / "rel") == "kept.txt"
