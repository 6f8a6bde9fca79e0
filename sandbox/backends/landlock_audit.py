"""What the kernel refused a Landlock call, read back from its audit log (Landlock ABI 7).

The launcher restricts itself with ``LOG_SAME_EXEC_OFF | LOG_NEW_EXEC_ON``: its own work (the
sweep's ``kill(-1)`` over the host's processes) is never logged, the command's denials are. Each
denial is a ``LANDLOCK_ACCESS`` record (``domain=… blockers=… path=…``), and the first one of a
domain brings a ``LANDLOCK_DOMAIN`` record naming the pid that created it: the call's launcher.
A ``SYSCALL`` record of the same event names the process denied (pid, comm, exe, syscall).

One reader per process listens on the audit netlink socket's read-only multicast group (it
needs ``CAP_AUDIT_READ``, and the host's audit on). At a call's end it sends a user message of
its own (``CAP_AUDIT_WRITE``) and waits for it to come back: the kernel's audit queue is FIFO,
so every record of the call was delivered before it. Where the host allows none of that, the
calls' results carry no ``kernel_denials`` and ``sandbox check`` says why.

What is kept is bounded: :data:`EVENTS_PER_CALL` events a call (the rest counted), domains
forgotten oldest first past :data:`DOMAINS_KEPT`.
"""

from __future__ import annotations

import binascii
import contextlib
import errno
import os
import re
import socket
import struct
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

ABI = 7  # the first Landlock ABI that writes audit records
NETLINK_AUDIT = 9
AUDIT_GET, AUDIT_USER = 1000, 1005
AUDIT_SYSCALL, AUDIT_EOE = 1300, 1320
AUDIT_LANDLOCK_ACCESS, AUDIT_LANDLOCK_DOMAIN = 1423, 1424
AUDIT_NLGRP_READLOG = 1
NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR = 2
STATUS = struct.Struct("=IIIIIII")  # mask, enabled, failure, pid, rate_limit, backlog_limit, lost
EVENTS_PER_CALL = 200
DOMAINS_KEPT = 4096
FLUSH_WAIT_S = 2.0
SOURCE = "landlock-audit"
MARK = "sandbox-landlock-flush"

_MARKED = re.compile(MARK + r"-\d+-\d+")
_FIELD = re.compile(r'(\w+)=("[^"]*"|\S+)')
_HEX_KEYS = frozenset({"path", "name", "comm", "exe", "ocomm"})  # audit hex-encodes untrusted text
_SYSCALL_KEYS = ("pid", "comm", "exe", "syscall")


def fields(text: str) -> dict[str, str]:
    """``key=value`` pairs of one record's text (quoted values unquoted, hex-encoded ones decoded)."""
    found: dict[str, str] = {}
    for key, raw in _FIELD.findall(text):
        if raw.startswith('"'):
            value = raw[1:-1]
        elif key in _HEX_KEYS and len(raw) % 2 == 0 and re.fullmatch(r"[0-9A-F]+", raw):
            value = binascii.unhexlify(raw).decode(errors="replace")
        else:
            value = raw
        found.setdefault(key, value)
    return found


def _serial(text: str) -> str:
    """``audit(1729738800.268:30): …`` -> ``30`` (the event a record belongs to)."""
    head, _, _ = text.partition(")")
    return head.rpartition(":")[2]


def _event(record: dict[str, str]) -> dict[str, Any]:
    event: dict[str, Any] = {"blockers": record.get("blockers", "").split(",")}
    for key, value in record.items():
        if key not in ("domain", "blockers"):
            event[key] = int(value) if key in ("ino", "opid", "dest", "lport") and value.isdigit() else value
    return event


@dataclass
class _Domain:
    creator: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    omitted: int = 0


class AuditReader:
    """The process's one listener (:func:`reader`); :meth:`denials_of` is a call's account."""

    def __init__(self, listen: socket.socket, lost: int) -> None:
        self._listen = listen
        self._lost = lost  # the kernel's count of records it dropped, at the last account
        self._lock = threading.Condition()
        self._domains: OrderedDict[str, _Domain] = OrderedDict()
        self._pending: dict[str, list[dict[str, Any]]] = {}  # serial -> its access events, until its SYSCALL
        self._seen_marks: set[str] = set()
        self._marks = iter(range(1, 1 << 62))
        self.broken: str | None = None
        self._overrun = False
        threading.Thread(target=self._run, name="landlock-audit", daemon=True).start()

    # -- the reader thread

    def _run(self) -> None:
        try:
            while True:
                try:
                    data = self._listen.recv(1 << 16)
                except OSError as exc:
                    if exc.errno != errno.ENOBUFS:
                        raise
                    with self._lock:
                        self._overrun = True  # records were dropped: the next accounts may miss some
                    continue
                offset = 0
                while offset + NLMSG.size <= len(data):
                    length, kind, _, _, _ = NLMSG.unpack_from(data, offset)
                    if length < NLMSG.size:
                        break
                    text = data[offset + NLMSG.size : offset + length].rstrip(b"\0").decode(errors="replace")
                    self._record(kind, text)
                    offset += (length + 3) & ~3
        except OSError as exc:
            with self._lock:
                self.broken = f"the audit socket failed: {exc.strerror or exc}"
                self._lock.notify_all()

    def _record(self, kind: int, text: str) -> None:
        with self._lock:
            if kind == AUDIT_LANDLOCK_ACCESS:
                record = fields(text)
                event = _event(record)
                domain = self._domain(record.get("domain", ""))
                if len(domain.events) < EVENTS_PER_CALL:
                    domain.events.append(event)
                    self._pending.setdefault(_serial(text), []).append(event)
                else:
                    domain.omitted += 1
            elif kind == AUDIT_LANDLOCK_DOMAIN:
                record = fields(text)
                if record.get("status") == "allocated" and record.get("pid", "").isdigit():
                    self._domain(record.get("domain", "")).creator = int(record["pid"])
            elif kind == AUDIT_SYSCALL:
                events = self._pending.pop(_serial(text), None)
                if events:
                    record = fields(text)
                    for event in events:
                        event.update({k: record[k] for k in _SYSCALL_KEYS if k in record})
                        for key in ("pid", "syscall"):
                            if isinstance(event.get(key), str) and event[key].isdigit():
                                event[key] = int(event[key])
            elif kind == AUDIT_EOE:
                self._pending.pop(_serial(text), None)
            elif kind == AUDIT_USER and (marked := _MARKED.search(text)) is not None:
                self._seen_marks.add(marked.group())
                self._lock.notify_all()
            if len(self._pending) > DOMAINS_KEPT:
                self._pending.clear()

    def _domain(self, name: str) -> _Domain:
        domain = self._domains.get(name)
        if domain is None:
            domain = self._domains[name] = _Domain()
            while len(self._domains) > DOMAINS_KEPT:
                self._domains.popitem(last=False)
        return domain

    # -- a call's account (blocking: from a worker thread)

    def _mark(self, mark: str, failed: list[OSError]) -> None:
        try:
            _send(AUDIT_USER, mark.encode() + b"\0")  # the kernel drops a message's last byte: a NUL
        except OSError as exc:
            with self._lock:
                failed.append(exc)
                self._lock.notify_all()

    def denials_of(self, launcher: int) -> dict[str, Any] | None:
        """The denials of the domain ``launcher`` created, once every record before now has come;
        ``None`` when the log cannot say (audit turned off meanwhile, the socket gone)."""
        mark = f"{MARK}-{os.getpid()}-{next(self._marks)}"
        failed: list[OSError] = []
        # In a thread of its own: with the kernel's backlog full, writing waits (up to the host's
        # backlog_wait_time, a minute by default); the call's account does not.
        threading.Thread(target=self._mark, args=(mark, failed), name="landlock-audit-mark", daemon=True).start()
        try:
            enabled, lost = status()
        except OSError as exc:
            enabled, lost = 0, 0
            failed.append(exc)
        with self._lock:
            if not enabled:
                self.broken = "the host's audit was turned off"
            # A full backlog drops records (the kernel counts them lost), the mark among them maybe:
            # then the account is given as it stands, said to be incomplete.
            arrived = self._lock.wait_for(lambda: mark in self._seen_marks or self.broken or failed, FLUSH_WAIT_S)
            self._seen_marks.discard(mark)
            if failed:
                self.broken = f"cannot write to the audit log: {failed[0].strerror or failed[0]}"
            if self.broken is not None:
                return None
            complete = bool(arrived) and not self._overrun and lost == self._lost
            self._overrun, self._lost = False, lost
            mine = [name for name, domain in self._domains.items() if domain.creator == launcher]
            events: list[dict[str, Any]] = []
            omitted = 0
            for name in mine:
                domain = self._domains.pop(name)
                events += domain.events
                omitted += domain.omitted
        return {"source": SOURCE, "events": events, "omitted": omitted, "complete": complete}


def _target(event: dict[str, Any]) -> str:
    if "path" in event:
        return str(event["path"])
    if "daddr" in event or "dest" in event:
        return f"{event.get('daddr', '?')} port {event.get('dest', '?')}"
    if "opid" in event:
        return f"process {event['opid']} ({event.get('ocomm', '?')})"
    return " ".join(f"{k}={v}" for k, v in event.items() if k not in ("blockers", *_SYSCALL_KEYS))


def describe(event: dict[str, Any]) -> str:
    """One line for a person: who was refused what, on what."""
    who = f"{event.get('comm', '?')} (pid {event.get('pid', '?')})"
    return f"denied by Landlock: {who}: {', '.join(event.get('blockers', []))} {_target(event)}".rstrip()


def lines(account: dict[str, Any] | None, most: int = 10) -> list[str]:
    """An account as a few lines for a person or a model: the same refusal once with its count, the
    first ``most`` of them, then how many more."""
    if not account:
        return []
    counts: Counter[tuple[str, str, str]] = Counter()
    for event in account.get("events", []):
        counts[(str(event.get("comm", "?")), ", ".join(event.get("blockers", [])), _target(event))] += 1
    shown = [
        f"denied by Landlock: {comm}: {blockers} {target}".rstrip() + (f" ({n} times)" if n > 1 else "")
        for (comm, blockers, target), n in list(counts.items())[:most]
    ]
    rest = sum(n for _, n in list(counts.items())[most:]) + int(account.get("omitted", 0))
    if rest:
        shown.append(f"denied by Landlock: {rest} more not listed")
    return shown


def _send(kind: int, payload: bytes) -> bytes:
    """One request on a socket of its own: the reply to ``AUDIT_GET``; a user message's refusal
    (no ``CAP_AUDIT_WRITE``) raised as the ``OSError`` it is."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT) as control:
        control.bind((0, 0))
        flags = NLM_F_REQUEST if kind == AUDIT_GET else NLM_F_REQUEST | NLM_F_ACK
        control.send(NLMSG.pack(NLMSG.size + len(payload), kind, flags, 1, 0) + payload)
        control.settimeout(1.0)
        reply = control.recv(1 << 16)
        _, answer, _, _, _ = NLMSG.unpack_from(reply)
        if answer == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", reply, NLMSG.size)
            if code:
                raise OSError(-code, os.strerror(-code))
        return reply


def status() -> tuple[int, int]:
    """The host's audit state (0 off, 1 on, 2 locked on) and how many records it has lost so far
    (``OSError`` where it cannot be asked: ``CAP_AUDIT_CONTROL``)."""
    reply = _send(AUDIT_GET, b"")
    _, kind, _, _, _ = NLMSG.unpack_from(reply)
    if kind != AUDIT_GET or len(reply) < NLMSG.size + STATUS.size:
        raise OSError(errno.EPROTO, "no audit status in the kernel's reply")
    _, enabled, _, _, _, _, lost = STATUS.unpack_from(reply, NLMSG.size)
    return int(enabled), int(lost)


def audit_enabled() -> int:
    """The host's audit state: 0 off, 1 on, 2 locked on."""
    return status()[0]


_reader: AuditReader | None = None
_why_not: str | None = None
_started = threading.Lock()


def reader() -> AuditReader | None:
    """The process's reader, started on first use; ``None`` where the audit log cannot be read
    (:func:`why_not` says why). Blocking (netlink): call it off the event loop."""
    global _reader, _why_not
    with _started:
        if _reader is not None and _reader.broken is None:
            return _reader
        _reader, _why_not = None, None
        try:
            enabled, lost = status()
            if not enabled:
                _why_not = "the host's audit is off (`auditctl -e 1` turns it on)"
                return None
            _send(AUDIT_USER, f"{MARK}-probe".encode() + b"\0")  # CAP_AUDIT_WRITE: the flush needs it
            listen = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT)
            try:
                listen.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
                listen.bind((0, AUDIT_NLGRP_READLOG))
            except OSError:
                listen.close()
                raise
        except OSError as exc:
            why = "needs CAP_AUDIT_READ and CAP_AUDIT_WRITE (root on the host)"
            if exc.errno not in (errno.EPERM, errno.EACCES, errno.ECONNREFUSED, errno.EPROTONOSUPPORT):
                why = exc.strerror or str(exc)
            _why_not = f"the audit log cannot be read here: {why}"
            return None
        _reader = AuditReader(listen, lost)
        return _reader


def why_not() -> str | None:
    """Why :func:`reader` gave none (after a call of it)."""
    with contextlib.suppress(Exception):
        if _reader is not None and _reader.broken is not None:
            return _reader.broken
    return _why_not
