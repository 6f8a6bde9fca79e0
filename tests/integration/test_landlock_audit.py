"""The Landlock backend's per-call denials, read back from the kernel's audit log (ABI 7).

As root the module turns the host's audit on for its tests (``AUDIT_SET``, as ``auditctl -e 1``
does) and puts it back as it was; the product itself never changes it. As an ordinary user (through
``tests/run-as-user.sh``) it checks what such a user is told: no denials, and why.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from sandbox import exec as executor
from sandbox.backends import base, landlock, landlock_audit
from sandbox.session import Sandbox
from tests.conftest import JailFactory, landlock_or_skip, make_profile

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.anyio, pytest.mark.landlock]
AUDIT_SET = 1001


def _controllable() -> bool:
    try:
        landlock_audit.status()
    except OSError:
        return False
    return True


CONTROLLABLE = _controllable()  # root on the host; not an ordinary user, nor root in a container
AS_ROOT = pytest.mark.skipif(
    not CONTROLLABLE,
    reason="turning the host's audit on needs CAP_AUDIT_CONTROL (root on the host, not in a container)",
)


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> base.Backend:
    found = landlock_or_skip(monkeypatch)
    if landlock.abi() < landlock_audit.ABI:
        pytest.skip(f"Landlock ABI {landlock.abi()} here writes no audit records (ABI {landlock_audit.ABI} does)")
    return found


def set_audit(enabled: int, backlog: int | None = None) -> None:
    """``auditctl -e enabled [-b backlog]``."""
    mask = 0x1 | (0x4 if backlog is not None else 0)  # AUDIT_STATUS_ENABLED, AUDIT_STATUS_BACKLOG_LIMIT
    status = struct.pack("=IIIIIIII", mask, enabled, 0, 0, 0, backlog or 0, 0, 0) + bytes(12)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, landlock_audit.NETLINK_AUDIT) as control:
        control.bind((0, 0))
        header = landlock_audit.NLMSG.pack(landlock_audit.NLMSG.size + len(status), AUDIT_SET, 0x5, 1, 0)
        control.send(header + status)
        reply = control.recv(4096)
    (code,) = struct.unpack_from("=i", reply, landlock_audit.NLMSG.size)
    assert code == 0, os.strerror(-code)


def forget_reader() -> None:
    landlock_audit._reader = None  # the next jail asks the host again


def backlog_limit() -> int:
    reply = landlock_audit._send(landlock_audit.AUDIT_GET, b"")
    return int(landlock_audit.STATUS.unpack_from(reply, landlock_audit.NLMSG.size)[5])


@pytest.fixture
def audit_on() -> Iterator[None]:
    """The host's audit on, with a backlog deep enough for the flood below (the kernel's default of
    64 loses records with no auditd draining them; the account then says it is incomplete)."""
    before, backlog = landlock_audit.audit_enabled(), backlog_limit()
    set_audit(max(before, 1), backlog=8192)
    forget_reader()
    yield
    set_audit(before, backlog=backlog)
    forget_reader()


async def sh(jail: base.Jail, script: str) -> executor.ExecResult:
    return await executor.run(jail, ["bash", "-c", script])


def blocked(result: executor.ExecResult) -> list[tuple[str, Any]]:
    assert result.kernel_denials is not None, result
    events = result.kernel_denials["events"]
    assert all(isinstance(e["pid"], int) and e["exe"] and e["comm"] and e["syscall"] for e in events), events
    return [(",".join(e["blockers"]), e.get("path") or e.get("opid") or e.get("dest")) for e in events]


@AS_ROOT
@pytest.mark.usefixtures("audit_on")
async def test_each_denial_of_a_call_is_reported_with_who_and_what(
    open_jail: JailFactory, workspace: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret\n")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        jail = await open_jail(make_profile("readonly"))
        result = await sh(
            jail,
            f"cat {secret}; echo x > README.md; kill -9 1; "
            f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))' 2>/dev/null; echo done",
        )
    assert result.stdout == "done\n", result
    assert blocked(result) == [
        ("fs.read_file", str(secret)),
        ("fs.write_file", str(workspace / "README.md")),
        ("scope.signal", 1),  # the command's own kill, and only it: the launcher's sweep is never logged
        ("net.connect_tcp", port),
    ]
    by = {e["blockers"][0]: e for e in result.kernel_denials["events"]}  # type: ignore[index]
    assert by["fs.read_file"]["comm"] == "cat" and by["net.connect_tcp"]["daddr"] == "127.0.0.1"
    assert result.kernel_denials["omitted"] == 0 and result.kernel_denials["complete"] is True  # type: ignore[index]


@AS_ROOT
@pytest.mark.usefixtures("audit_on")
async def test_a_call_that_was_refused_nothing_has_an_empty_account_and_calls_do_not_mix(
    open_jail: JailFactory, tmp_path: Path
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text("1")
    second.write_text("2")
    jails = [await open_jail(), await open_jail()]
    quiet = await sh(jails[0], "true")
    assert quiet.kernel_denials == {"source": "landlock-audit", "events": [], "omitted": 0, "complete": True}
    results: dict[int, executor.ExecResult] = {}

    async def one(index: int, path: Path) -> None:
        results[index] = await sh(jails[index], f"for i in 1 2 3; do cat {path}; sleep 0.05; done")

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 0, first)
        tg.start_soon(one, 1, second)
    assert blocked(results[0]) == [("fs.read_file", str(first))] * 3
    assert blocked(results[1]) == [("fs.read_file", str(second))] * 3


@AS_ROOT
@pytest.mark.usefixtures("audit_on")
async def test_a_flood_of_denials_is_bounded_and_counted(open_jail: JailFactory, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    jail = await open_jail()
    result = await sh(jail, f"for i in $(seq 300); do cat {tmp_path}/f 2>/dev/null; done; true")
    account = result.kernel_denials
    assert account is not None and len(account["events"]) == landlock_audit.EVENTS_PER_CALL
    assert account["omitted"] == 300 - landlock_audit.EVENTS_PER_CALL and account["complete"], account["omitted"]


@AS_ROOT
@pytest.mark.usefixtures("audit_on", "backend")
async def test_the_bash_tool_tells_the_model_what_was_denied(workspace: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret\n")
    profile = make_profile("untrusted", **{"limits.tmp_size": "256MiB"}).with_overrides(backend="landlock")
    async with Sandbox.open(workspace, profile=profile, mode="auto") as box:
        ran = await box.call("Bash", {"command": f"cat {secret}; cat {secret}; echo x > {workspace}/direct; true"})
    assert ran.ok, ran
    assert f"denied by Landlock: cat: fs.read_file {secret} (2 times)" in ran.content
    assert f"denied by Landlock: bash: fs.make_reg {workspace}" in ran.content  # the workspace, past its copy
    assert [e["comm"] for e in ran.details["kernel_denials"]["events"]] == ["cat", "cat", "bash"]


@AS_ROOT
async def test_with_the_hosts_audit_off_there_are_no_denials_and_check_says_why(
    open_jail: JailFactory, backend: base.Backend
) -> None:
    before = landlock_audit.audit_enabled()
    if before == 2:
        pytest.skip("the host's audit is locked on (-e 2): it cannot be turned off to test this")
    set_audit(0)
    forget_reader()
    try:
        result = await sh(await open_jail(), "cat /root/.bashrc 2>/dev/null; true")
        report = type(backend)().probe()  # a probe is kept per instance: a new one looks again
    finally:
        set_audit(before)
        forget_reader()
    assert result.kernel_denials is None
    assert report.details["audit"] is False
    assert "no per-call denials: the host's audit is off (`auditctl -e 1` turns it on)" in report.notes


@pytest.mark.skipif(
    CONTROLLABLE, reason="where the log cannot be read: tests/run-as-user.sh and test_landlock_container.py run it"
)
async def test_where_the_log_cannot_be_read_there_are_no_denials_and_it_is_said_why(
    open_jail: JailFactory, backend: base.Backend
) -> None:
    forget_reader()
    result = await sh(await open_jail(), "cat /root/.bashrc 2>/dev/null; true")
    report = type(backend)().probe()
    assert result.kernel_denials is None and report.details["audit"] is False
    assert any("no per-call denials" in note for note in report.notes), report.notes
