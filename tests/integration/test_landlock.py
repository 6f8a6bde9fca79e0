"""The Landlock backend by attack and by use, on this host (as root and, through
``tests/run-as-user.sh``, as an ordinary user): what it confines, what it refuses, and what it
declares it does not give (each in place of the contract test that would claim it).

The contract suites (test_contracts, test_leaks, test_tools, test_limits) and the attack suite
also run on it, less what it declares (``tests/conftest.py``: ``LANDLOCK_DECLARED``);
tests/integration/test_landlock_container.py runs it inside an unprivileged Docker container,
where bubblewrap cannot start.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from sandbox import exec as executor
from sandbox import profile as profiles
from sandbox.backends import base, landlock
from sandbox.errors import BackendUnavailable, GuaranteeUnavailable, InvalidArgument
from sandbox.guarantees import Report
from sandbox.session import Sandbox
from tests import netlab
from tests.conftest import JailFactory, landlock_or_skip, make_profile, survivors
from tests.netlab import HELLO, NetLab

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.anyio, pytest.mark.landlock]


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> base.Backend:
    return landlock_or_skip(monkeypatch)


async def sh(jail: base.Jail, script: str, **kw: Any) -> executor.ExecResult:
    return await executor.run(jail, ["bash", "-c", script], **kw)


# -- the workspace, as the profile says ---------------------------------------------------------


async def test_ro_reads_everything_but_the_secrets_and_writes_nothing(open_jail: JailFactory, workspace: Path) -> None:
    (workspace / ".env").write_text("API_KEY=hunter2\n")
    (workspace / ".env.example").write_text("API_KEY=\n")
    (workspace / "deploy").mkdir()
    (workspace / "deploy" / "server.key").write_text("PRIVATE\n")
    (workspace / "deploy" / "notes.txt").write_text("notes\n")
    jail = await open_jail(make_profile("readonly"))
    result = await sh(
        jail,
        "cat README.md deploy/notes.txt .env.example; cat .env; cat deploy/server.key; cat ./deploy/../.env; "
        "ln -s .env link; echo x > README.md; mkdir d; touch new; rm src/app.py; echo end",
    )
    assert result.stdout == "# sample\nnotes\nAPI_KEY=\nend\n", result
    assert "hunter2" not in result.stderr and "PRIVATE" not in result.stderr
    assert (workspace / "README.md").read_text() == "# sample\n" and (workspace / "src" / "app.py").exists()
    assert sorted(p.name for p in workspace.iterdir()) == [".env", ".env.example", "README.md", "deploy", "src"]


async def test_rw_writes_the_workspace_and_nowhere_else(
    open_jail: JailFactory, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    jail = await open_jail()
    result = await sh(
        jail,
        f'echo new > new.txt && echo ok1; echo x > "$TMPDIR/t" && echo ok2; echo x > {outside}/o; echo x > /tmp/o$$; '
        f"echo x > ~/h && echo ok3; echo x > /var/tmp/o$$; echo x > /dev/shm/o$$; mkdir ../escape; echo end",
    )
    assert result.stdout == "ok1\nok2\nok3\nend\n", result
    assert (workspace / "new.txt").read_text() == "new\n"
    assert list(outside.iterdir()) == [] and not (workspace.parent / "escape").exists()


async def test_rw_is_refused_where_part_of_the_workspace_is_sealed(open_jail: JailFactory, workspace: Path) -> None:
    (workspace / ".git").mkdir()
    with pytest.raises(GuaranteeUnavailable, match=r"\.git \(its hooks and config stay read-only\)"):
        await open_jail()
    (workspace / ".git").rmdir()
    (workspace / ".env").write_text("API_KEY=hunter2\n")
    with pytest.raises(GuaranteeUnavailable, match="secret .env"):
        await open_jail()


async def test_a_secret_that_appears_mid_session_fails_the_next_call_closed(
    open_jail: JailFactory, workspace: Path
) -> None:
    jail = await open_jail()
    assert (await sh(jail, "echo one")).stdout == "one\n"
    (workspace / ".env").write_text("API_KEY=hunter2\n")
    with pytest.raises(GuaranteeUnavailable, match="secret .env"):
        await sh(jail, "cat .env")


async def test_overlay_is_refused_before_any_jail(backend: base.Backend) -> None:
    with pytest.raises(GuaranteeUnavailable, match=r"overlay \(the landlock backend has no mount namespace\)"):
        backend.check(make_profile("default", **{"mount.strategy": "overlay"}))


@pytest.mark.usefixtures("backend")  # for its skip
async def test_copy_is_seen_at_its_own_path_and_the_tools_name_the_workspace(workspace: Path) -> None:
    """The private copy cannot sit at the workspace's path: commands see it at its own, the file
    tools' paths are translated both ways, and the workspace's own path is out of reach."""
    (workspace / ".env").write_text("API_KEY=hunter2\n")
    profile = make_profile("untrusted", **{"limits.tmp_size": "256MiB"})
    async with Sandbox.open(workspace, profile=profile.with_overrides(backend="landlock"), mode="auto") as box:
        assert box.jail.backend == "landlock"
        wrote = await box.call("Write", {"path": str(workspace / "notes.md"), "content": "in the copy\n"})
        found = await box.call("Grep", {"pattern": "copy", "path": str(workspace)})
        globbed = await box.call("Glob", {"pattern": "**/*.md"})
        ran = await box.call("Bash", {"command": f"pwd; cat notes.md; echo x > {workspace}/direct; echo end"})
        masked = await executor.run(box.jail, ["cat", ".env"])  # past the policy: the copy holds none
        changes = await box.jail.changes()
    assert wrote.ok and found.ok and globbed.ok, (wrote, found, globbed)
    copy_root = ran.details["stdout"].splitlines()[0]
    assert copy_root != str(workspace) and copy_root not in found.content + globbed.content
    assert str(workspace / "notes.md") in found.content and str(workspace / "notes.md") in globbed.content
    assert ran.details["stdout"].splitlines()[1:] == ["in the copy", "end"], ran
    assert "hunter2" not in masked.stdout and not (workspace / "direct").exists()
    assert not (workspace / "notes.md").exists()
    assert changes is not None and [c.path for c in changes.changes] == ["notes.md"]


async def test_tmp_size_is_refused_and_tmpdir_is_private(open_jail: JailFactory, backend: base.Backend) -> None:
    """In place of test_tmp_is_private_and_bounded: no tmpfs, so no bound; a TMPDIR of the jail's own."""
    with pytest.raises(GuaranteeUnavailable, match=r"tmp_size = 8388608 \(the landlock backend has no tmpfs /tmp\)"):
        backend.check(make_profile("default", **{"limits.tmp_size": "8MiB"}))
    first, second = await open_jail(), await open_jail()
    assert (await sh(first, 'echo secret > "$TMPDIR/mine"; echo $TMPDIR')).exit_code == 0
    result = await sh(second, 'cat "$TMPDIR/mine"; ls /tmp')
    assert "secret" not in result.stdout and "Permission denied" in result.stderr
    private = Path((await sh(first, "echo $TMPDIR")).stdout.strip())
    assert private.is_dir()
    await first.aclose()
    assert not private.parent.exists()


async def test_host_paths_are_unreadable_though_their_names_show(open_jail: JailFactory, tmp_path: Path) -> None:
    """In place of test_host_files_outside_are_absent: no mount namespace, so a name can be
    ``stat``-ed; nothing outside the rules can be read, listed or connected to."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text("hunter2\n")
    jail = await open_jail()
    result = await sh(
        jail,
        f"cat {secret}; ls {tmp_path}; cat /etc/shadow; ls /root /home; cat ~root/.bash_history; "
        "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"/var/run/docker.sock\")'; echo end",
    )
    assert result.stdout == "end\n", result
    assert "hunter2" not in result.stderr and "root:" not in result.stderr
    assert "PermissionError" in result.stderr


# -- processes: signals, /proc, privileges, survivors -------------------------------------------


async def test_the_jail_cannot_signal_or_read_a_host_process(open_jail: JailFactory) -> None:
    me = os.getpid()
    jail = await open_jail()
    result = await sh(
        jail,
        f"kill -STOP {me}; echo kill=$?; cat /proc/{me}/environ; cat /proc/{me}/maps; "
        f"ls /proc/{me}/fd; python3 -c 'import os; os.kill({me}, 0)'; echo end",
    )
    assert "kill=1" in result.stdout and result.stdout.endswith("end\n"), result
    assert "SANDBOX_DATA_DIR" not in result.stdout and "Operation not permitted" in result.stderr
    assert os.getpid() == me  # still here, not stopped


async def test_one_calls_kill_minus_one_spares_another_call_of_the_same_jail(
    open_jail: JailFactory, marker: str
) -> None:
    jail = await open_jail()
    async with anyio.create_task_group() as tg:
        results: list[executor.ExecResult] = []

        async def slow() -> None:
            results.append(await sh(jail, f"sleep 1.{marker[:3]} && echo survived"))

        tg.start_soon(slow)
        await anyio.sleep(0.3)
        await sh(jail, "kill -9 -1")
    assert results[0].stdout == "survived\n", results[0]
    assert survivors(marker) == []


async def test_no_privileges_and_the_filter_is_on(open_jail: JailFactory) -> None:
    jail = await open_jail()
    result = await sh(
        jail,
        "grep -E '^(NoNewPrivs|CapEff|CapPrm|CapBnd|CapAmb|Seccomp):' /proc/self/status; "
        "unshare -U true || echo unshare-refused",
    )
    fields = dict(line.split(":\t") for line in result.stdout.splitlines() if ":\t" in line)
    assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2", result
    assert all(int(fields[name], 16) == 0 for name in ("CapEff", "CapPrm", "CapAmb"))
    assert os.geteuid() != 0 or int(fields["CapBnd"], 16) == 0  # root's bounding set emptied for good
    assert "unshare-refused" in result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="as an ordinary user non-root holds; this checks root's report")
def test_as_root_the_report_says_non_root_does_not_hold(backend: base.Backend) -> None:
    report = backend.probe()
    assert report.guarantees["non-root"] is False
    assert "Landlock changes no uid" in report.reasons["non-root"]
    with pytest.raises(GuaranteeUnavailable, match="non-root"):
        backend.check(profiles.Profile().with_overrides(requires=("non-root",)))


async def test_survivors_of_a_timeout_and_of_a_normal_end_are_killed(open_jail: JailFactory, marker: str) -> None:
    jail = await open_jail()
    await sh(jail, f"(setsid sleep {marker} &); (trap '' TERM HUP; exec -a x{marker} sleep 300) & echo started")
    assert survivors(marker) == []
    result = await sh(jail, f"trap '' TERM; (setsid sleep {marker} &); sleep 300", timeout=1)
    assert result.timed_out and survivors(marker) == []


async def test_a_launcher_that_cannot_confine_runs_nothing(open_jail: JailFactory, workspace: Path) -> None:
    jail = await open_jail()
    assert isinstance(jail, landlock.LandlockJail)
    jail._seccomp = str(workspace / "no-such-program.bpf")
    with pytest.raises(BackendUnavailable, match="could not be set up: .*no-such-program.bpf"):
        await sh(jail, "touch ran")
    assert not (workspace / "ran").exists()


async def waiting(jail: landlock.LandlockJail) -> Any:
    """The launcher started ahead for the next call, once its thread is done."""
    thread = jail._ahead._thread
    if thread is not None:
        await anyio.to_thread.run_sync(thread.join)
    assert jail._ahead._done is not None and jail._ahead._done[0] is not None
    return jail._ahead._done[0][0]


async def test_the_launcher_started_ahead_serves_a_call_and_a_dead_one_is_replaced(
    open_jail: JailFactory, workspace: Path
) -> None:
    """Each call takes the launcher started ahead (its interpreter's start off the call's path),
    with the call's environment, working directory and a request longer than a pipe holds; one
    killed meanwhile is replaced; bad input is refused before any runs."""
    jail = await open_jail()
    assert isinstance(jail, landlock.LandlockJail)
    spare = await waiting(jail)
    assert Path(f"/proc/{spare.pid}/environ").read_bytes() == b""  # it holds nothing of a call's yet
    placed = jail._ahead._done[1] if jail._ahead._done else None
    assert placed is None or spare.pid in placed.pids()  # in the call's cgroups before the call
    big = "x" * 100_000
    result = await executor.run(
        jail,
        ["bash", "-c", 'pwd; echo "$MINE"; echo ${#BIG}; echo "$1"', "-", "a b"],
        env={"MINE": "1", "BIG": big},
        cwd=str(workspace / "src"),
    )
    assert result.stdout.splitlines()[1:] == ["1", "100000", "a b"], result
    assert result.stdout.splitlines()[0].endswith("/src")
    following = await waiting(jail)
    assert following.pid != spare.pid  # the next one started while the command ran
    os.kill(following.pid, 9)
    following.popen.wait()  # dead before the call takes it (one dying as it is told is a broken pipe: retried)
    assert (await sh(jail, "echo again")).stdout == "again\n"
    with pytest.raises(InvalidArgument, match="NUL"):
        await executor.run(jail, ["echo", "a\0b"])
    with pytest.raises(InvalidArgument, match="does not exist"):
        await executor.run(jail, ["true"], cwd=str(workspace / "no-such-dir"))
    assert (await sh(jail, "echo still")).stdout == "still\n"


async def test_a_rule_on_a_path_swapped_for_a_link_grants_nothing(
    open_jail: JailFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher opens each rule's path without following a link: a path that became a symlink
    between the rules' making and the jail's start grants the link, not what it points to."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "f").write_text("hunter2\n")
    link = tmp_path / "link"
    link.symlink_to(secret)
    jail = await open_jail()
    assert isinstance(jail, landlock.LandlockJail)
    spec = jail.spec()
    paths = spec["paths"]
    assert isinstance(paths, list)
    monkeypatch.setattr(jail, "spec", lambda: {**spec, "paths": [*paths, (str(link), "ro")]})
    result = await sh(jail, f"cat {link}/f; cat {secret}/f; echo end")
    assert result.stdout == "end\n" and "Permission denied" in result.stderr, result


# -- the network ---------------------------------------------------------------------------------


@contextlib.contextmanager
def listener() -> Iterator[tuple[int, list[str]]]:
    """A TCP server on this host's loopback, and what reached it."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    reached: list[str] = []
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                conn, _ = server.accept()
                reached.append("tcp")
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], reached
    finally:
        done.set()
        thread.join()
        server.close()


PROBE = """
import socket, sys
port = int(sys.argv[1])
tries = {
    "tcp": lambda: socket.create_connection(("127.0.0.1", port), timeout=2),
    "udp": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", port)),
    "fastopen": lambda: socket.socket().sendto(b"x", socket.MSG_FASTOPEN, ("127.0.0.1", port)),
    "bind": lambda: socket.create_server(("127.0.0.1", 0)),
    "raw": lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1),
    "packet": lambda: socket.socket(17, socket.SOCK_RAW, 0),
    "netlink": lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0),
    "unix": lambda: socket.socket(socket.AF_UNIX).connect("\\0sbx-abstract"),
    "vsock": lambda: socket.socket(40, socket.SOCK_STREAM),
}
for name, attempt in tries.items():
    try:
        attempt()
        print(name, "open")
    except OSError as exc:
        print(name, "refused", exc.errno)
"""


async def test_network_none_refuses_every_family_and_reaches_nothing(open_jail: JailFactory) -> None:
    with listener() as (port, reached):
        jail = await open_jail()
        result = await executor.run(jail, ["python3", "-c", PROBE, str(port)])
        curl = await sh(jail, f"curl -sS -m 3 http://127.0.0.1:{port}/ || echo refused")
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines.keys() == {"tcp", "udp", "fastopen", "bind", "raw", "packet", "netlink", "unix", "vsock"}, result
    assert all(state.startswith("refused") for state in lines.values()), lines
    assert "refused" in curl.stdout and reached == []


@pytest.fixture(scope="module")
def lab() -> Iterator[NetLab]:
    with NetLab() as running:
        yield running


async def test_allowlist_goes_through_the_proxy_and_only_there(
    open_jail: JailFactory, lab: NetLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    netlab.resolve_in(lab, monkeypatch)
    allow = [f"allowed.test:{lab.http_port}", f"{lab.address}:{lab.http_port}"]
    jail = await open_jail(make_profile("default", **{"network.mode": "allowlist", "network.allow": allow}))
    assert jail.egress is not None and jail.egress.tcp_port
    url = lab.http_url("allowed.test", "/hello.txt")
    result = await sh(
        jail,
        f"curl -sSf {url}; curl -sSf {lab.http_url('denied.test', '/hello.txt')} || echo denied; "
        f"curl -sS -m 3 --noproxy '*' http://{lab.address}:{lab.http_port}/hello.txt || echo direct-refused",
    )
    assert result.stdout.startswith(HELLO.decode()), result
    assert "denied\n" in result.stdout and "direct-refused" in result.stdout
    assert result.network is not None and [d["host"] for d in result.network["denials"]] == ["denied.test"]


async def test_secrets_are_refused_with_the_reason(backend: base.Backend, workspace: Path, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cr3t-token-value\n")
    profile = make_profile(
        "default",
        **{
            "network.mode": "allowlist",
            "secrets": {"API": {"from": f"file:{token}", "hosts": ["api.test"], "as": "bearer"}},
        },
    )
    with pytest.raises(GuaranteeUnavailable, match=r"use bwrap or docker for \[secrets\]"):
        await backend.open_jail(workspace, profile)


# -- choosing it --------------------------------------------------------------------------------


def test_auto_falls_back_to_landlock_only_where_the_others_cannot_run(
    backend: base.Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("bwrap", "docker"):
        monkeypatch.setattr(base.get(name), "_probed", Report(name, False, f"{name} cannot start here (test)"))
    prof = make_profile("readonly")
    chosen = base.choose("auto", prof)
    assert chosen is backend
    note = base.fallback_note(chosen, prof)
    assert note is not None and "bwrap: backend bwrap is unavailable: bwrap cannot start here (test)" in note
    with pytest.raises(GuaranteeUnavailable, match=r"tmp-size-limit \(landlock: the landlock backend has no tmpfs"):
        base.choose("auto", profiles.load("untrusted"))


def test_check_says_what_it_rests_on(backend: base.Backend) -> None:
    report = backend.probe()
    assert report.details["abi"] == landlock.abi() >= landlock.MIN_ABI
    text = report.to_text()
    assert f"note: Landlock ABI {landlock.abi()}" in text and "the host's process list" in text
    assert report.guarantees["overlay"] is False and report.guarantees["net-transparent"] is False


def test_sandbox_run_uses_it(workspace: Path, backend: base.Backend) -> None:
    del backend  # only for its skip
    sandbox = Path(os.environ.get("SANDBOX_BIN", Path(__file__).parents[2] / ".venv" / "bin" / "sandbox"))
    if not sandbox.exists():
        pytest.skip(f"no sandbox command at {sandbox} (set SANDBOX_BIN)")
    done = subprocess.run(
        [str(sandbox), "run", "--backend", "landlock", "--profile", _profile_file(workspace), "--", "cat", "README.md"],
        cwd=workspace,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "# sample\n"), done.stderr


def _profile_file(workspace: Path) -> str:
    path = workspace.parent / "ro.toml"
    path.write_text('description = "read-only, nothing required"\nrequires = []\n[mount]\nstrategy = "ro"\n')
    return str(path)
