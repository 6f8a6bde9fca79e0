"""The Landlock audit reader's accounts, fed the records a kernel writes (no audit needed): an
event joined with its process, each domain given to the launcher that created it, the bounds, and
an account said to be incomplete when the kernel lost records or the flush mark never came."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

import pytest

from sandbox.backends import landlock_audit as la

if TYPE_CHECKING:
    from collections.abc import Iterator


class Kernel:
    """The multicast socket's far end, and the kernel's answers to a mark and a status request."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ours, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.lost = 0
        self.drop_marks = False
        self.serial = 100
        monkeypatch.setattr(la, "_send", self._sent)
        monkeypatch.setattr(la, "status", lambda: (1, self.lost))
        monkeypatch.setattr(la, "FLUSH_WAIT_S", 0.3)
        self.reader = la.AuditReader(self.ours, 0)

    def record(self, kind: int, text: str, serial: int | None = None) -> None:
        body = f"audit(1796570000.000:{serial or self.serial}): {text}".encode()
        self.theirs.send(la.NLMSG.pack(la.NLMSG.size + len(body), kind, 0, 0, 0) + body)

    def denial(self, domain: str, creator: int | None, access: str, pid: int, comm: str) -> None:
        self.serial += 1
        self.record(la.AUDIT_LANDLOCK_ACCESS, f"domain={domain} {access}")
        if creator is not None:
            self.record(la.AUDIT_LANDLOCK_DOMAIN, f"domain={domain} status=allocated mode=enforcing pid={creator}")
        self.record(la.AUDIT_SYSCALL, f'arch=c000003e syscall=257 success=no pid={pid} comm="{comm}" exe="/bin/{comm}"')
        self.record(la.AUDIT_EOE, "")

    def _sent(self, kind: int, payload: bytes) -> bytes:
        if kind == la.AUDIT_USER and not self.drop_marks:
            text = payload.rstrip(b"\0").decode()
            self.record(la.AUDIT_USER, f"pid=1 uid=0 msg='{text}'", serial=1)
        return b""

    def close(self) -> None:
        self.theirs.close()
        self.ours.close()


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> Iterator[Kernel]:
    k = Kernel(monkeypatch)
    yield k
    k.close()


def test_each_launcher_gets_its_domains_denials_joined_with_the_process(kernel: Kernel) -> None:
    kernel.denial("a1", 500, 'blockers=fs.read_file path="/root/.ssh/id_rsa" dev="vda" ino=7', 501, "cat")
    kernel.denial("b2", 600, "blockers=net.connect_tcp daddr=10.0.0.1 dest=443", 601, "curl")
    kernel.denial("a1", None, 'blockers=scope.signal opid=1 ocomm="init"', 502, "kill")
    account = kernel.reader.denials_of(500)
    assert account == {
        "source": "landlock-audit",
        "events": [
            {
                "blockers": ["fs.read_file"],
                "path": "/root/.ssh/id_rsa",
                "dev": "vda",
                "ino": 7,
                "pid": 501,
                "comm": "cat",
                "exe": "/bin/cat",
                "syscall": 257,
            },
            {
                "blockers": ["scope.signal"],
                "opid": 1,
                "ocomm": "init",
                "pid": 502,
                "comm": "kill",
                "exe": "/bin/kill",
                "syscall": 257,
            },
        ],
        "omitted": 0,
        "complete": True,
    }
    assert [e["dest"] for e in kernel.reader.denials_of(600)["events"]] == [443]  # type: ignore[index]
    assert kernel.reader.denials_of(500) == {"source": "landlock-audit", "events": [], "omitted": 0, "complete": True}


def test_a_flood_keeps_a_bounded_account_and_counts_the_rest(kernel: Kernel) -> None:
    for i in range(la.EVENTS_PER_CALL + 25):
        kernel.denial("c3", 700 if i == 0 else None, f'blockers=fs.read_file path="/f{i}"', 701, "cat")
    account = kernel.reader.denials_of(700)
    assert account is not None and len(account["events"]) == la.EVENTS_PER_CALL and account["omitted"] == 25


def test_records_the_kernel_lost_or_a_mark_that_never_came_make_it_incomplete(kernel: Kernel) -> None:
    kernel.denial("d4", 800, 'blockers=fs.read_file path="/x"', 801, "cat")
    kernel.lost = 3  # the backlog overflowed since the last account
    account: dict[str, Any] | None = kernel.reader.denials_of(800)
    assert account is not None and account["complete"] is False and len(account["events"]) == 1
    assert kernel.reader.denials_of(800)["complete"] is True  # type: ignore[index]
    kernel.drop_marks = True
    kernel.denial("e5", 900, 'blockers=fs.read_file path="/y"', 901, "cat")
    account = kernel.reader.denials_of(900)
    assert account is not None and account["complete"] is False and kernel.reader.broken is None


def test_a_mark_that_cannot_be_written_ends_the_accounts(kernel: Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*_: object) -> bytes:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(la, "_send", refused)
    assert kernel.reader.denials_of(1) is None
    assert kernel.reader.broken == "cannot write to the audit log: Operation not permitted"


def test_records_are_parsed_as_the_kernel_writes_them() -> None:
    record = la.fields(
        'domain=1a6fdc66f blockers=fs.write_file,fs.read_file path=2F746D702F6120622263 dev="vda" ino=9 comm="c a"'
    )
    assert record == {
        "domain": "1a6fdc66f",
        "blockers": "fs.write_file,fs.read_file",
        "path": '/tmp/a b"c',  # audit hex-encodes text with spaces or quotes
        "dev": "vda",
        "ino": "9",
        "comm": "c a",
    }
    line = la.describe({"blockers": ["fs.read_file"], "path": "/etc/shadow", "comm": "cat", "pid": 7})
    assert line == "denied by Landlock: cat (pid 7): fs.read_file /etc/shadow"


def test_repeated_refusals_read_as_one_line_with_their_count() -> None:
    same = {"blockers": ["fs.read_file"], "path": "/etc/shadow", "comm": "cat"}
    account = {
        "events": [{**same, "pid": p} for p in range(12)]
        + [{"blockers": ["scope.signal"], "opid": 1, "ocomm": "init", "comm": "kill", "pid": 99}],
        "omitted": 5,
    }
    assert la.lines(account) == [
        "denied by Landlock: cat: fs.read_file /etc/shadow (12 times)",
        "denied by Landlock: kill: scope.signal process 1 (init)",
        "denied by Landlock: 5 more not listed",
    ]
    assert la.lines(account, most=1)[-1] == "denied by Landlock: 6 more not listed"
    assert la.lines(None) == []
