"""The microvm backend, attacked: a guest kernel of its own, the workspace over 9p, QEMU the only host process.

Each test boots real QEMU microVMs with the Debian kernel and root file system that
``sandbox image build --microvm`` builds (``make test`` builds them); skipped, saying what is
missing, where QEMU or those are absent. Where ``/dev/kvm`` is a hardware KVM the guests run on
it; here (PVM) they are emulated, so each boot costs seconds and the tests share VMs where the
attack allows.
"""

from __future__ import annotations

import http.server
import os
import platform
import socket
import threading
from typing import TYPE_CHECKING

import anyio
import psutil
import pytest

from sandbox import exec as executor
from sandbox.errors import BackendUnavailable, GuaranteeUnavailable, InvalidArgument
from tests.conftest import backend_or_skip, make_profile

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
    from pathlib import Path
    from typing import TypeAlias

    from sandbox.backends import base

    Opener: TypeAlias = Callable[..., Awaitable[base.Jail]]

pytestmark = [pytest.mark.anyio, pytest.mark.microvm, pytest.mark.slow]


@pytest.fixture
def microvm() -> base.Backend:
    return backend_or_skip("microvm")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "README.md").write_text("# sample\n")
    if os.geteuid() == 0:  # the command uid is the workspace owner's (a root-owned one gets 1000)
        os.chown(tmp_path, 1000, 1000)
        os.chown(workspace, 1000, 1000)
        os.chown(workspace / "README.md", 1000, 1000)
    return workspace


@pytest.fixture
async def vm(microvm: base.Backend, ws: Path) -> AsyncIterator[Callable[..., Awaitable[base.Jail]]]:
    opened: list[base.Jail] = []

    async def open_(mount: str = "rw", **overrides: object) -> base.Jail:
        jail = await microvm.open_jail(ws, make_profile(**{"mount.strategy": mount, **overrides}))
        opened.append(jail)
        return jail

    yield open_
    for jail in opened:
        await jail.aclose()


async def sh(jail: base.Jail, script: str, **kw: object) -> executor.ExecResult:
    return await executor.run(jail, ["/bin/sh", "-c", script], **kw)  # type: ignore[arg-type]


def qemus() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline and cmdline[0].endswith("qemu-system-x86_64") and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def qemu_of(jail: base.Jail) -> psutil.Process:
    guest = jail.guest  # type: ignore[attr-defined]
    assert guest is not None
    return psutil.Process(guest.vm.pid)


# --- what the boundary is ------------------------------------------------------------------


async def test_a_guest_kernel_of_its_own_streams_apart_and_the_owner_uid(vm: Opener, ws: Path) -> None:
    jail = await vm()
    result = await sh(jail, "echo out; echo err >&2; uname -r; cat /proc/version; id -u; exit 3")
    lines = result.stdout.splitlines()
    assert (lines[0], result.stderr, result.exit_code) == ("out", "err\n", 3)
    assert lines[1] != platform.release()  # the guest's kernel, not the host's
    assert "Debian" in lines[2]
    assert lines[3] == str(ws.stat().st_uid if ws.stat().st_uid else 1000)
    # QEMU is the one host process, and it is not root.
    proc = qemu_of(jail)
    assert proc.uids().real != 0 or os.geteuid() != 0
    assert [child.pid for child in proc.children(recursive=True)] == []


async def test_check_grants_kernel_isolated_and_a_profile_can_require_it(microvm: base.Backend, ws: Path) -> None:
    report = microvm.probe()
    assert report.guarantees["kernel-isolated"] is True
    assert report.details["accel"] in ("kvm", "tcg")
    assert report.guarantees["net-allowlist"] is True  # the host's proxy, over a port of its own
    assert report.guarantees["net-transparent"] is False  # no network device to redirect
    bwrap = backend_or_skip("bwrap")
    assert bwrap.probe().guarantees.get("kernel-isolated") is not True
    with pytest.raises(GuaranteeUnavailable, match="kernel-isolated"):
        await bwrap.open_jail(ws, make_profile(requires=("kernel-isolated",)))


# --- kill ------------------------------------------------------------------------------------


async def test_a_setsid_term_ignoring_survivor_dies_with_its_call(vm: Opener) -> None:
    jail = await vm()
    script = "setsid sh -c 'trap \"\" TERM; sleep 300' >/dev/null 2>&1 & (sleep 301 &) ; echo started"
    result = await sh(jail, script)
    assert result.stdout == "started\n"
    after = await sh(jail, "ps -eo user,args | grep -c '[s]leep 30' || true")
    assert after.stdout.strip() == "0"


async def test_a_timeout_kills_the_tree_and_the_vm_goes_on(vm: Opener) -> None:
    jail = await vm()
    result = await sh(jail, "sleep 200 & sleep 201; echo never", timeout=3)
    assert result.timed_out and "never" not in result.stdout
    after = await sh(jail, "ps -eo args | grep -c '[s]leep 20' || true; echo alive")
    assert after.stdout.split() == ["0", "alive"]


GUEST_SURVIVORS = "ps -eo args | grep -c '[s]leep 30' || true"
SURVIVORS = "setsid sh -c 'trap \"\" TERM; sleep 300' & (sleep 301 &); sh -c 'trap \"\" TERM; sleep 302' & sleep 303"


async def test_abort_and_cancellation_kill_the_tree_seen_from_inside(vm: Opener) -> None:
    jail = await vm()
    abort = anyio.Event()

    async def fire() -> None:
        await anyio.sleep(4)
        abort.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(fire)
        result = await sh(jail, SURVIVORS, timeout=60, abort=abort)
    assert result.aborted and not result.timed_out
    assert (await sh(jail, GUEST_SURVIVORS)).stdout.strip() == "0"
    with anyio.move_on_after(4) as scope:
        await sh(jail, SURVIVORS, timeout=60)
    assert scope.cancelled_caught
    assert (await sh(jail, GUEST_SURVIVORS)).stdout.strip() == "0"


async def test_a_descendant_holding_stdout_does_not_hang_the_call(vm: Opener) -> None:
    jail = await vm()
    result = await sh(jail, "sleep 300 & echo started", timeout=60)
    assert result.stdout == "started\n" and not result.timed_out
    assert (await sh(jail, GUEST_SURVIVORS)).stdout.strip() == "0"


async def test_each_call_is_a_session_of_its_own_without_a_terminal(vm: Opener) -> None:
    jail = await vm()
    result = await sh(jail, "( exec 3</dev/tty ) 2>/dev/null && echo tty; ps -o sid= -p $$; echo $$")
    sid, pid = result.stdout.split()
    assert "tty" not in result.stdout and sid == pid


async def test_a_killed_qemu_ends_the_call_cleanly_and_the_next_call_gets_a_new_vm(vm: Opener) -> None:
    jail = await vm()
    first = qemu_of(jail)
    async with anyio.create_task_group() as tg:

        async def kill_soon() -> None:
            await anyio.sleep(2)
            first.kill()

        tg.start_soon(kill_soon)
        with pytest.raises(BackendUnavailable, match="microVM ended"):
            await sh(jail, "sleep 60")
    assert not first.is_running() or first.status() == psutil.STATUS_ZOMBIE
    again = await sh(jail, "echo back")
    assert again.stdout == "back\n"
    assert qemu_of(jail).pid != first.pid


async def test_closing_the_jail_leaves_no_qemu(microvm: base.Backend, ws: Path) -> None:
    jail = await microvm.open_jail(ws, make_profile())
    pid = qemu_of(jail).pid
    folder = jail.guest.vm.console.parent  # type: ignore[attr-defined]
    await sh(jail, "sleep 100 >/dev/null 2>&1 &")
    await jail.aclose()
    assert pid not in [proc.pid for proc in qemus()]
    assert not folder.exists()  # its console (and a staging directory) went with it


async def test_a_pooled_vm_is_taken_and_shows_only_its_own_session(microvm: base.Backend, tmp_path: Path) -> None:
    from sandbox.backends.microvm import pool

    if not pool.staged(1000):
        pytest.skip("VMs are booted ahead only as root (their session's directories are bound in later)")
    workspaces = []
    for name in ("one", "two", "three"):
        path = tmp_path / name
        path.mkdir()
        (path / f"{name}.txt").write_text(name)
        for item in (path, path / f"{name}.txt"):
            os.chown(item, 1000, 1000)
        workspaces.append(path)
    for path in workspaces[:2]:  # a kind asked for twice is kept booted
        jail = await microvm.open_jail(path, make_profile())
        kind = jail._kind()  # type: ignore[attr-defined]
        await jail.aclose()
    with anyio.fail_after(180):
        while not pool.POOL._ready.get(kind):
            await anyio.sleep(0.5)
    spare = pool.POOL._ready[kind][0].vm.pid
    jail = await microvm.open_jail(workspaces[2], make_profile(**{"mount.strategy": "ro"}))
    try:
        assert qemu_of(jail).pid == spare
        result = await sh(jail, "ls; ls -A /run/sandbox-stage; echo x > new.txt || echo refused")
        assert result.stdout.split() == ["three.txt", "refused"]
    finally:
        await jail.aclose()


# --- floods and bombs --------------------------------------------------------------------------


async def test_a_fork_bomb_stops_at_the_guest_rlimit_and_the_vm_goes_on(vm: Opener) -> None:
    jail = await vm(**{"limits.pids": 64})
    result = await sh(jail, "bomb() { bomb | bomb & }; bomb; sleep 2; echo done", timeout=60)
    assert not result.timed_out
    after = await sh(jail, "echo alive")
    assert after.stdout == "alive\n"


async def test_a_memory_bomb_ends_in_the_guest_not_on_the_host(vm: Opener) -> None:
    jail = await vm(**{"limits.memory": "128MiB"})
    result = await sh(jail, "python3 -c 'x = []\nwhile True: x.append(bytearray(1 << 20))'", timeout=120)
    assert (result.exit_code, result.signal, result.oom_killed) == (137, 9, True), result
    assert (await sh(jail, "echo alive")).stdout == "alive\n"


async def test_a_stdout_flood_is_bounded_in_capture(vm: Opener) -> None:
    jail = await vm(**{"limits.capture_bytes": 65536})
    result = await sh(jail, "head -c 20000000 /dev/zero | tr '\\0' x; echo; echo tail-marker", timeout=120)
    assert result.stdout_bytes == 20_000_000 + 13
    assert result.stdout_truncated and result.stdout.endswith("tail-marker\n")


# --- mounts ----------------------------------------------------------------------------------


async def test_ro_refuses_writes_and_rw_writes_as_the_owner(vm: Opener, ws: Path) -> None:
    ro = await vm("ro")
    refused = await sh(ro, "echo x > new.txt; echo $?")
    assert refused.stdout.strip() != "0" and not (ws / "new.txt").exists()
    rw = await vm("rw")
    await sh(rw, "echo written > new.txt")
    assert (ws / "new.txt").read_text() == "written\n"
    assert (ws / "new.txt").stat().st_uid == ws.stat().st_uid


async def test_copy_comes_back_as_a_changeset_and_applies(vm: Opener, ws: Path) -> None:
    jail = await vm("copy")
    await sh(jail, "echo changed > README.md; echo new > added.txt")
    assert (ws / "README.md").read_text() == "# sample\n"
    changes = await jail.changes()
    assert changes is not None
    assert {change.path for change in changes.changes} >= {"README.md", "added.txt"}
    report = await jail.apply(changes)
    assert not report.conflicts
    assert (ws / "README.md").read_text() == "changed\n"
    assert (ws / "added.txt").read_text() == "new\n"


async def test_copy_links_out_and_setuid_never_come_back(vm: Opener, ws: Path) -> None:
    jail = await vm("copy")
    await sh(jail, "ln -s /etc/passwd pw; ln -s ../../.. up; cp /bin/sh suid; chmod 4755 suid")
    changes = await jail.changes()
    assert changes is not None
    report = await jail.apply(changes, include_flagged=True)
    assert {s["path"] for s in report.skipped} >= {"pw", "up"}
    assert not (ws / "pw").is_symlink() and not (ws / "up").is_symlink()
    assert (ws / "suid").stat().st_mode & 0o7000 == 0


async def test_a_planted_symlink_leads_into_the_guest_not_the_host(vm: Opener, ws: Path, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET\n")
    secret.chmod(0o644)
    jail = await vm("rw")
    result = await sh(jail, f"ln -s {secret} link; cat link; ln -s / root; ls root/ | head -3; cat root{secret}")
    assert "HOST-SECRET" not in result.stdout
    assert (ws / "link").is_symlink()  # what the guest made is a link on the host, never followed there


async def test_a_masked_secret_and_gits_hooks(vm: Opener, ws: Path) -> None:
    (ws / ".env").write_text("TOKEN=hunter2\n")
    hooks = ws / ".git" / "hooks"
    hooks.mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n")
    if os.geteuid() == 0:
        for path in (ws / ".env", ws / ".git", hooks, ws / ".git" / "config"):
            os.chown(path, 1000, 1000)
    jail = await vm("rw")
    result = await sh(jail, "cat .env; echo 'touch /tmp/pwned' > .git/hooks/pre-commit; echo hook=$?")
    assert "hunter2" not in result.stdout
    assert "hook=0" not in result.stdout
    assert not (hooks / "pre-commit").exists()


# --- network ---------------------------------------------------------------------------------


async def test_no_network_device_and_the_hosts_loopback_is_unreachable(vm: Opener) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        jail = await vm()
        result = await sh(
            jail,
            f"ls /sys/class/net; python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3)\" "
            "2>&1 | tail -1",
        )
    finally:
        listener.close()
    lines = result.stdout.split()
    assert lines[0] == "lo" and "Refused" in result.stdout


async def test_network_modes_it_cannot_give_are_refused(microvm: base.Backend, ws: Path) -> None:
    with pytest.raises(InvalidArgument, match="no network device"):
        await microvm.open_jail(ws, make_profile(**{"network.mode": "host"}))
    allowlist = {"network.mode": "allowlist", "network.allow": ["example.test"]}
    with pytest.raises(GuaranteeUnavailable, match="net-transparent"):
        await microvm.open_jail(ws, make_profile(**allowlist, **{"network.transparent": True}))


@pytest.fixture
def host_http() -> Iterator[int]:
    """An HTTP server on the host's loopback (its port): reachable from a guest only through the proxy."""

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"hello from the host\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


RELAY_CHECK = r"""
import os, socket
def status(pid):
    return {k: v.split() for k, _, v in (line.partition(":") for line in open(f"/proc/{pid}/status"))}
others = [p for p in os.listdir("/proc") if p.isdigit() and status(p)["Uid"][0] not in ("0", str(os.getuid()))]
print("relays", len(others), "uid", status(others[0])["Uid"][0], "parent", status(others[0])["PPid"][0])
try:
    os.kill(int(others[0]), 9)
    print("kill ok")
except PermissionError:
    print("kill refused")
for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    try:
        socket.socket(family).bind((host, 3128))
        print("bind ok")
    except OSError as exc:
        print("bind", exc.errno)
"""


async def test_the_allowlist_relay_reaches_the_proxy_alone_and_the_command_cannot_touch_it(
    vm: Opener, host_http: int
) -> None:
    jail = await vm(**{"network.mode": "allowlist", "network.allow": [f"127.0.0.1:{host_http}"]})
    url = f"http://127.0.0.1:{host_http}/"
    fetch = "curl -sS -m 20 --noproxy '' -x \"$http_proxy\" "
    result = await sh(
        jail,
        f"{fetch} {url}; {fetch} -o /dev/null -w '%{{http_code}}\\n' http://10.9.9.9/; "
        f"curl -sS -m 5 --noproxy '*' {url} >/dev/null 2>&1 || echo direct refused; "
        f"ls /sys/class/net; python3 -c '{RELAY_CHECK}'",
    )
    lines = result.stdout.splitlines()
    assert lines[:4] == ["hello from the host", "403", "direct refused", "lo"], result
    # One process of another uid than root's and the command's: the relay, nobody's, PID 1's child.
    assert lines[4:] == ["relays 1 uid 65534 parent 1", "kill refused", "bind 98", "bind 98"], result
    assert result.network is not None
    assert [(d["host"], d["reason"]) for d in result.network["denials"]] == [("10.9.9.9", "not-allowed")]
    again = await sh(jail, f"{fetch} {url}")  # the relay outlives the call, and the next one uses it
    assert again.stdout == "hello from the host\n", again


async def test_a_killed_qemu_ends_its_relay_on_the_host(vm: Opener, host_http: int) -> None:
    jail = await vm(**{"network.mode": "allowlist", "network.allow": [f"127.0.0.1:{host_http}"]})
    first = qemu_of(jail)
    name = f"microvm-net-{first.pid}"
    assert name in [thread.name for thread in threading.enumerate()]
    first.kill()  # between calls: the next call finds the VM gone and boots another (no call is lost)
    deadline = anyio.current_time() + 10
    while name in [thread.name for thread in threading.enumerate()] and anyio.current_time() < deadline:
        await anyio.sleep(0.05)
    assert name not in [thread.name for thread in threading.enumerate()]
    again = await sh(jail, f"curl -sS -m 20 --noproxy '' -x \"$http_proxy\" http://127.0.0.1:{host_http}/")
    assert again.stdout == "hello from the host\n", again  # a new VM, a new relay
    assert qemu_of(jail).pid != first.pid


# --- the file tools, through the same agent ----------------------------------------------------


@pytest.mark.usefixtures("microvm")
async def test_the_file_tools_run_in_the_guest(ws: Path) -> None:
    from sandbox import profile as profiles
    from sandbox.session import Sandbox

    profile = profiles.load("default").with_overrides(backend="microvm")
    async with Sandbox.open(ws, profile=profile, mode="auto") as session:
        wrote = await session.call("Write", {"path": "notes/todo.txt", "content": "a\nb\nc\n"})
        assert wrote.ok, wrote
        edited = await session.call("Edit", {"path": "notes/todo.txt", "edits": [{"old_text": "b", "new_text": "B"}]})
        assert edited.ok, edited
        read = await session.call("Read", {"path": "notes/todo.txt"})
        assert read.ok and "B" in read.content, read
        found = await session.call("Grep", {"pattern": "sample"})
        assert found.ok and "README.md" in found.content, found
        outside = await session.call("Read", {"path": "/etc/hostname"})
        assert not outside.ok or "Debian" not in outside.content
    assert (ws / "notes" / "todo.txt").read_text() == "a\nB\nc\n"
