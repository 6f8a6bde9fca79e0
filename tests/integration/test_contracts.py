"""The contract and attack suite every backend passes (ARCHITECTURE.md, "Contracts").

Parametrised over real backends: bubblewrap and a real dockerd. Each attack is a command a
hostile agent might run; each assertion checks the host afterwards, not the command's word.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import psutil
import pytest

from sandbox import exec as executor
from sandbox.backends import base, seccomp
from sandbox.errors import GuaranteeUnavailable
from tests.conftest import JailFactory, make_profile, survivors

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sandbox.backends import base

pytestmark = pytest.mark.anyio


async def sh(jail: object, script: str, **kw: object) -> executor.ExecResult:
    return await executor.run(jail, ["/bin/sh", "-c", script], **kw)  # type: ignore[arg-type]


# --- streams -------------------------------------------------------------------------------


async def test_stdout_and_stderr_are_apart_and_exit_code_kept(open_jail: JailFactory) -> None:
    jail = await open_jail()
    result = await sh(jail, "for i in 1 2 3; do echo out$i; echo err$i >&2; done; exit 3")
    assert result.stdout == "out1\nout2\nout3\n"
    assert result.stderr == "err1\nerr2\nerr3\n"
    assert (result.exit_code, result.signal, result.timed_out) == (3, None, False)


async def test_output_streams_as_it_comes(open_jail: JailFactory) -> None:
    jail = await open_jail()
    seen: list[tuple[str, bytes]] = []
    first_at: list[float] = []

    def on_out(chunk: bytes) -> None:
        first_at.append(time.monotonic())
        seen.append(("out", chunk))

    started = time.monotonic()
    result = await sh(
        jail,
        "echo early; echo warn >&2; sleep 3; echo late",
        on_stdout=on_out,
        on_stderr=lambda c: seen.append(("err", c)),
    )
    assert b"".join(c for k, c in seen if k == "out") == b"early\nlate\n"
    assert b"".join(c for k, c in seen if k == "err") == b"warn\n"
    # The first chunk arrived while the command was still sleeping, not at its end.
    assert first_at[0] - started < result.duration_ms / 1000 - 1.5


async def test_killed_by_signal_reports_128_plus_n(open_jail: JailFactory) -> None:
    jail = await open_jail()
    result = await sh(jail, "kill -9 $$")
    assert (result.exit_code, result.signal) == (137, 9)


async def test_big_output_is_bounded_per_stream(open_jail: JailFactory) -> None:
    jail = await open_jail(make_profile(**{"limits.capture_bytes": 65536}))
    result = await sh(jail, "head -c 104857600 /dev/zero | tr '\\0' x; echo; echo tail-marker")
    assert result.stdout_bytes == 100 * 1024 * 1024 + 13
    assert result.stdout_truncated and not result.stderr_truncated
    assert len(result.stdout) < 70_000
    assert result.stdout.startswith("xxxx") and result.stdout.endswith("tail-marker\n")
    assert "bytes omitted" in result.stdout


@pytest.mark.slow
async def test_one_gib_of_output_keeps_memory_flat(open_jail: JailFactory) -> None:
    jail = await open_jail()
    me = psutil.Process()
    before = me.memory_info().rss
    peak = before

    def watch(_chunk: bytes) -> None:
        nonlocal peak
        peak = max(peak, me.memory_info().rss)

    result = await sh(jail, "head -c 1073741824 /dev/zero", on_stdout=watch)
    assert result.stdout_bytes == 1 << 30
    assert peak - before < 64 * 1024 * 1024


# --- process tree --------------------------------------------------------------------------

SURVIVORS = (
    "trap '' TERM; "
    "setsid sh -c 'trap \"\" TERM; exec sleep {m}' & "
    "( (sleep {m} &) & ) ; "
    "nohup sleep {m} >/dev/null 2>&1 & "
    "sleep {m}"
)


async def _assert_all_dead(marker: str) -> None:
    assert survivors(marker) == [], "a process of the call outlived it"


async def test_timeout_kills_setsid_double_fork_and_term_ignoring(open_jail: JailFactory, marker: str) -> None:
    jail = await open_jail(make_profile(**{"timeouts.kill_grace_s": 0.3}))
    result = await sh(jail, SURVIVORS.format(m=marker), timeout=1)
    assert result.timed_out and result.exit_code != 0
    await _assert_all_dead(marker)
    assert result.kill_ms is not None and result.kill_ms < 300 + 2000


async def test_abort_kills_the_tree(open_jail: JailFactory, marker: str) -> None:
    jail = await open_jail()
    abort = anyio.Event()

    async def fire() -> None:
        while not survivors(marker):
            await anyio.sleep(0.05)
        await anyio.sleep(0.3)
        abort.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(fire)
        result = await sh(jail, SURVIVORS.format(m=marker), timeout=60, abort=abort)
    assert result.aborted and not result.timed_out
    await _assert_all_dead(marker)


async def test_cancellation_kills_the_tree_and_propagates(open_jail: JailFactory, marker: str) -> None:
    jail = await open_jail()
    with anyio.move_on_after(2) as scope:
        await sh(jail, SURVIVORS.format(m=marker), timeout=60)
    assert scope.cancelled_caught
    await _assert_all_dead(marker)


async def test_background_process_dies_with_a_normal_exit(open_jail: JailFactory, marker: str) -> None:
    jail = await open_jail()
    result = await sh(jail, f"(while :; do sleep {marker}; done) & setsid sleep {marker} & echo started")
    assert result.exit_code == 0 and result.stdout == "started\n"
    await _assert_all_dead(marker)


async def test_descendant_holding_stdout_cannot_hang_the_call(open_jail: JailFactory, marker: str) -> None:
    jail = await open_jail()
    started = time.monotonic()
    result = await sh(jail, f"setsid sh -c 'sleep {marker}' & echo parent-done", timeout=60)
    assert result.stdout == "parent-done\n" and not result.timed_out
    assert time.monotonic() - started < 30
    await _assert_all_dead(marker)


async def test_jail_close_kills_what_it_runs(open_jail: JailFactory, marker: str) -> None:
    jail = await open_jail()
    await jail.spawn(["/bin/sh", "-c", f"setsid sleep {marker} & sleep {marker}"])
    deadline = time.monotonic() + 10
    while len(survivors(marker)) < 2 and time.monotonic() < deadline:
        await anyio.sleep(0.05)
    await jail.aclose()
    await _assert_all_dead(marker)


# --- limits --------------------------------------------------------------------------------


async def test_fork_bomb_is_contained(open_jail: JailFactory) -> None:
    jail = await open_jail(make_profile(**{"limits.pids": 64}))
    result = await sh(jail, "bomb() { bomb | bomb & }; bomb; sleep 2; echo alive", timeout=10)
    assert not result.timed_out or result.kill_ms is not None
    after = await sh(jail, "echo still-works")
    assert after.stdout == "still-works\n"


async def test_memory_bomb_kills_only_the_call(open_jail: JailFactory, backend: base.Backend) -> None:
    jail = await open_jail(make_profile(**{"limits.memory": "64MiB"}))
    result = await sh(jail, "python3 -c 'x = []\nwhile True: x.append(bytearray(1 << 20))'", timeout=60)
    memory = backend.probe().limits.get("memory")
    if memory is not None and memory.scope == "process":
        # No memory cgroup (an ordinary user here): RLIMIT_DATA fails the allocation in the process.
        assert result.exit_code != 0 and "MemoryError" in result.stderr and not result.oom_killed
    else:
        assert result.exit_code != 0 and result.signal == 9
        assert result.oom_killed
    assert (await sh(jail, "echo ok")).stdout == "ok\n"


async def test_file_size_limit(open_jail: JailFactory) -> None:
    jail = await open_jail(make_profile(**{"limits.file_size": "1MiB"}))
    result = await sh(jail, 'head -c 4194304 /dev/zero > "$TMPDIR/big"; stat -c %s "$TMPDIR/big"')
    assert result.stdout.strip() == str(1024 * 1024)


@pytest.mark.usefixtures("workspace")
async def test_tmp_is_private_and_bounded(open_jail: JailFactory) -> None:
    jail = await open_jail(make_profile(**{"limits.tmp_size": "8MiB"}))
    name = f"sandbox-probe-{os.getpid()}"
    result = await sh(jail, f"echo x > /tmp/{name} && head -c 33554432 /dev/zero > /tmp/fill; echo rc=$?")
    assert not Path("/tmp", name).exists()
    assert "rc=1" in result.stdout and "No space left" in result.stderr


# --- filesystem ----------------------------------------------------------------------------


async def test_workspace_is_cwd_at_the_same_path(open_jail: JailFactory, workspace: Path) -> None:
    jail = await open_jail()
    result = await sh(jail, "pwd; cat src/app.py")
    assert result.stdout == f"{workspace}\nprint('hello')\n"


async def test_dotdot_write_escape_fails(open_jail: JailFactory, workspace: Path) -> None:
    jail = await open_jail()
    result = await sh(jail, "echo pwned > ../escaped; echo pwned > /escaped-root; echo pwned > /usr/escaped")
    assert not (workspace.parent / "escaped").exists()
    assert not Path("/escaped-root").exists() and not Path("/usr/escaped").exists()
    assert result.stderr.count("escaped") >= 2


async def test_planted_symlink_cannot_reach_outside(open_jail: JailFactory, workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    (workspace / "link").symlink_to(outside)
    (workspace / "filelink").symlink_to(outside / "secret.txt")
    jail = await open_jail()
    result = await sh(jail, "cat filelink; cat link/secret.txt; echo pwned > link/new; echo pwned >> filelink")
    assert "top secret" not in result.stdout
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "top secret\n"


async def test_host_files_outside_are_absent(open_jail: JailFactory, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("hunter2\n")
    jail = await open_jail()
    result = await sh(jail, f"cat {secret}; cat /etc/shadow; ls /root /var/run/docker.sock; ls /home")
    assert "hunter2" not in result.stdout and "root:" not in result.stdout
    assert "docker.sock" not in result.stdout


async def test_readonly_mount_refuses_writes(open_jail: JailFactory, workspace: Path) -> None:
    jail = await open_jail(make_profile("readonly"))
    result = await sh(jail, "echo x > README.md; rm -f src/app.py; touch new")
    assert result.exit_code != 0
    assert (workspace / "README.md").read_text() == "# sample\n"
    assert (workspace / "src" / "app.py").exists() and not (workspace / "new").exists()


async def test_copy_mount_leaves_host_untouched_until_apply(open_jail: JailFactory, workspace: Path) -> None:
    jail = await open_jail(make_profile("untrusted"))
    result = await sh(
        jail,
        "echo changed > README.md; rm src/app.py; echo new > new.txt; "
        "mkdir -p .git/hooks; echo evil > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit",
    )
    assert result.exit_code == 0
    assert (workspace / "README.md").read_text() == "# sample\n"
    assert (workspace / "src" / "app.py").exists() and not (workspace / "new.txt").exists()
    changes = await jail.changes()
    assert changes is not None
    status = {c.path: (c.status, c.flags) for c in changes.changes}
    assert status["README.md"] == ("modified", [])
    assert status["src/app.py"] == ("deleted", [])
    assert status["new.txt"] == ("added", [])
    assert set(status[".git/hooks/pre-commit"][1]) >= {"git-hook", "new-executable"}
    report = await jail.apply(changes, paths=["README.md", "new.txt", "src/app.py"])
    assert sorted(report.applied) == ["README.md", "new.txt", "src/app.py"]
    assert (workspace / "README.md").read_text() == "changed\n"
    assert not (workspace / "src" / "app.py").exists()
    assert not (workspace / ".git").exists()


async def test_copy_apply_holds_flagged_changes_back_without_consent(open_jail: JailFactory, workspace: Path) -> None:
    jail = await open_jail(make_profile("untrusted"))
    await sh(jail, "echo ok > ok.txt; mkdir -p .git/hooks; echo : > .git/hooks/pre-commit; chmod +x .git/hooks/*")
    changes = await jail.changes()
    assert changes is not None
    report = await jail.apply(changes)
    assert report.applied == ["ok.txt"]
    assert {h["path"] for h in report.held_back} == {".git", ".git/hooks", ".git/hooks/pre-commit"}
    assert not (workspace / ".git").exists()
    hook = [".git", ".git/hooks", ".git/hooks/pre-commit"]
    consented = await jail.apply(changes, paths=hook)  # naming a flagged change is consent
    assert consented.applied == hook and consented.conflicts == [] and consented.held_back == []
    assert (workspace / ".git" / "hooks" / "pre-commit").stat().st_mode & 0o111


async def test_copy_apply_refuses_a_file_changed_on_the_host(open_jail: JailFactory, workspace: Path) -> None:
    jail = await open_jail(make_profile("untrusted"))
    await sh(jail, "echo from-jail > README.md")
    (workspace / "README.md").write_text("edited by the user meanwhile\n")
    changes = await jail.changes()
    assert changes is not None
    report = await jail.apply(changes)
    assert [c["path"] for c in report.conflicts] == ["README.md"]
    assert (workspace / "README.md").read_text() == "edited by the user meanwhile\n"


async def test_copy_special_files_and_outside_symlinks_never_come_back(open_jail: JailFactory, workspace: Path) -> None:
    jail = await open_jail(make_profile("untrusted"))
    await sh(jail, "mkfifo fifo; ln -s /etc/passwd pw; ln -s ../../.. up; cp /bin/sh suid; chmod 4755 suid")
    changes = await jail.changes()
    assert changes is not None
    report = await jail.apply(changes, include_flagged=True)  # consent: even then, no setuid bit comes back
    assert {s["path"] for s in report.skipped} >= {"fifo", "pw", "up"}
    assert not (workspace / "fifo").exists() and not (workspace / "pw").is_symlink()
    assert not (workspace / "up").is_symlink()
    assert (workspace / "suid").stat().st_mode & 0o7000 == 0


# --- identity, network, environment --------------------------------------------------------


async def test_non_root_without_privileges(open_jail: JailFactory) -> None:
    jail = await open_jail()
    result = await sh(jail, "id -u; grep -E '^(NoNewPrivs|CapEff)' /proc/self/status")
    lines = result.stdout.split()
    assert lines[0] != "0"
    assert "NoNewPrivs:" in lines and lines[lines.index("NoNewPrivs:") + 1] == "1"
    assert int(lines[lines.index("CapEff:") + 1], 16) == 0


async def test_new_session_no_terminal(open_jail: JailFactory, marker: str) -> None:
    """TIOCSTI needs the caller's terminal: the call runs in a session of its own without one."""
    jail = await open_jail()
    proc = await jail.spawn(["/bin/sh", "-c", f"( exec 3</dev/tty ) 2>/dev/null && echo tty; sleep {marker}"])
    try:
        deadline = time.monotonic() + 10
        while not any(psutil.Process(p).cmdline() == ["sleep", marker] for p in survivors(marker)):
            assert time.monotonic() < deadline
            await anyio.sleep(0.05)
        pid = next(p for p in survivors(marker) if psutil.Process(p).cmdline() == ["sleep", marker])
        assert os.getsid(pid) != os.getsid(0)
        assert psutil.Process(pid).terminal() is None
    finally:
        await proc.kill_tree(0)
        proc.release()


async def test_environment_is_scrubbed(open_jail: JailFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "AKIAsecretvalue")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secretvalue")
    jail = await open_jail()
    result = await sh(jail, "env")
    assert "secretvalue" not in result.stdout
    assert "PATH=" in result.stdout


async def test_no_network_egress(open_jail: JailFactory) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.1)
    port = server.getsockname()[1]
    jail = await open_jail()
    script = (
        "import socket\n"
        "for target in [('127.0.0.1', PORT), ('1.1.1.1', 53)]:\n"
        "    s = socket.socket(); s.settimeout(3)\n"
        "    try: s.connect(target); print('CONNECTED', target)\n"
        "    except OSError as e: print('blocked', e)\n"
        "try: print('RESOLVED', socket.gethostbyname('deb.debian.org'))\n"
        "except OSError as e: print('no dns', e)\n"
    ).replace("PORT", str(port))
    result = await executor.run(jail, ["python3", "-c", script])
    server.close()
    assert "CONNECTED" not in result.stdout and "RESOLVED" not in result.stdout
    assert result.stdout.count("blocked") == 2


async def test_required_guarantee_missing_refuses(
    backend: base.Backend, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prof = make_profile(requires=["overlay", "seccomp", "fs-readonly-root"])
    fresh = type(backend)()  # its own probe, not the fixture's cached one
    if fresh.name == "bwrap":
        # bwrap has both here: take libseccomp away, as on a host without it (the binding's import fails).
        monkeypatch.setitem(sys.modules, "pyseccomp", None)
        monkeypatch.setattr(seccomp, "kept_filter", lambda *_: None)
        seccomp.filter_path.cache_clear()
    try:
        report = fresh.probe()
        assert not (report.guarantees.get("overlay") and report.guarantees.get("seccomp")), report.guarantees
        with pytest.raises(GuaranteeUnavailable) as info:
            await fresh.open_jail(workspace, prof)
    finally:
        seccomp.filter_path.cache_clear()
    assert info.value.code == "GUARANTEE_UNAVAILABLE"


async def test_overlay_mount_reads_changes_from_the_upper_layer(
    backend: object, open_jail: JailFactory, workspace: Path
) -> None:
    report = backend.probe()  # type: ignore[attr-defined]
    if not report.guarantees.get("overlay"):
        pytest.skip(f"{report.backend} cannot mount an overlay here: {report.reasons.get('overlay')}")
    (workspace / "gone").mkdir()
    (workspace / "gone" / "f.txt").write_text("f\n")
    jail = await open_jail(make_profile("untrusted", **{"mount.strategy": "overlay"}))
    result = await sh(jail, "echo changed > README.md; rm -rf gone; echo new > new.txt; ln -s /etc/passwd pw")
    assert result.exit_code == 0
    assert (workspace / "README.md").read_text() == "# sample\n" and (workspace / "gone" / "f.txt").exists()
    changes = await jail.changes()
    assert changes is not None
    status = {c.path: c.status for c in changes.changes}
    assert status == {
        "README.md": "modified",
        "gone": "deleted",
        "gone/f.txt": "deleted",
        "new.txt": "added",
        "pw": "added",
    }
    (workspace / "new.txt").write_text("the user was faster\n")
    report_ = await jail.apply(changes)
    assert sorted(report_.applied) == ["README.md", "gone", "gone/f.txt"]
    assert [c["path"] for c in report_.conflicts] == ["new.txt"]
    assert [s["path"] for s in report_.skipped] == ["pw"]
    assert (workspace / "README.md").read_text() == "changed\n" and not (workspace / "gone").exists()


@pytest.mark.root
async def test_copy_mount_of_another_users_workspace_keeps_owners_on_apply(
    open_jail: JailFactory, workspace: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to own files as another user")
    for path in (workspace, *workspace.rglob("*")):
        os.chown(path, 1234, 1234, follow_symlinks=False)
    jail = await open_jail(make_profile("untrusted"))
    result = await sh(jail, "echo changed > README.md; mkdir -p new/dir; echo x > new/dir/f")
    assert result.exit_code == 0, result.stderr
    changes = await jail.changes()
    assert changes is not None
    report = await jail.apply(changes)
    assert not report.conflicts and not report.skipped
    for rel in ("README.md", "new", "new/dir", "new/dir/f"):
        st = (workspace / rel).stat()
        assert (st.st_uid, st.st_gid) == (1234, 1234), rel


def effective_caps() -> str:
    """This process's effective capabilities (hex, from /proc)."""
    status = Path("/proc/self/status").read_text()
    return next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:"))


@pytest.fixture
def small_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 512 KiB tmpfs as the sandbox's data directory: a full disk on demand."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs as the data directory")
    if not int(effective_caps(), 16) & (1 << 21):  # CAP_SYS_ADMIN
        pytest.skip("needs CAP_SYS_ADMIN to mount a small tmpfs as the data directory (root in a container has none)")
    small = tmp_path / "small-data"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(small)], check=True)
    monkeypatch.setenv("SANDBOX_DATA_DIR", str(small))
    try:
        yield small
    finally:
        subprocess.run(["umount", str(small)], check=False)


@pytest.mark.root
async def test_full_disk_during_copy_in_is_a_clear_error_and_loses_nothing(
    backend: object, workspace: Path, small_data_dir: Path
) -> None:
    from sandbox.errors import SandboxError

    (workspace / "big.bin").write_bytes(os.urandom(2 * 1024 * 1024))
    with pytest.raises(SandboxError) as info:
        await backend.open_jail(workspace, make_profile("untrusted"))  # type: ignore[attr-defined]
    assert "No space left" in info.value.message or info.value.data.get("errno") == "ENOSPC"
    assert (workspace / "big.bin").stat().st_size == 2 * 1024 * 1024
    assert not list((small_data_dir / "copies").iterdir())
