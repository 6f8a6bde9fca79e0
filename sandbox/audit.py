"""The audit log: one SQLite row per tool call, secrets redacted before they are written, and one
per connection an allowlist refused (table ``network_denials``).

WAL journal and one transaction per record: a crash (even SIGKILL mid-write) leaves either the
whole row or nothing, never half a record. Columns are NOT NULL where a value always exists.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from typing import IO, TYPE_CHECKING, Any, Literal

from sandbox import datadir
from sandbox.errors import map_errors
from sandbox.redaction import redact, redact_value

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from pydantic import BaseModel

    from sandbox.policy.authorize import Authorization
    from sandbox.policy.gate import ToolCall
    from sandbox.vocabulary import (
        Answer,
        ClassifierVerdict,
        DecidedBy,
        Decision,
        ErrorCode,
        External,
        Level,
        OperatingMode,
        PermissionMode,
        Root,
    )

SCHEMA_VERSION = 6  # 2: operating_mode and delegate; 3: the classifier's columns; 4: quarantined; 5: the loop guard's;
# 6: network_denials.method and path (a request the secret broker refused), network_changes
# (each added on open to an older log)
PREVIEW_CHARS = 400
_BODY_KEYS = frozenset({"content", "edits"})  # Write's and Edit's file bodies: previews keep digest and size


def args_digest(args: Mapping[str, Any]) -> str:
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def body_summary(body: Any) -> dict[str, Any]:
    """What the audit keeps of a file body (Write's content, Edit's edits): its digest and size, never the text."""
    raw = body.encode() if isinstance(body, str) else json.dumps(body, sort_keys=True, default=str).encode()
    summary: dict[str, Any] = {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
    if isinstance(body, list):
        summary["count"] = len(body)
    return summary


def args_preview(args: Mapping[str, Any]) -> str:
    """The redacted, bounded JSON of a call's arguments; a file body is replaced by :func:`body_summary`."""
    # By key, not by tool: a Write refused before validation still carries its content. The summary
    # skips redaction, which would take its hex digest for a key.
    shown = redact_value({k: v for k, v in args.items() if k not in _BODY_KEYS})
    shown.update({k: body_summary(v) for k, v in args.items() if k in _BODY_KEYS})
    text = json.dumps(shown, sort_keys=True, default=str, ensure_ascii=False)
    # Redact again after truncation would be useless; truncate after redacting so a cut cannot
    # split a secret into an unrecognisable (and so unredacted) half.
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


@dataclass(frozen=True, slots=True)
class AuditRecord:
    session_id: str
    turn_id: str
    tool_call_id: str
    tool: str
    args_hash: str
    args_preview: str
    resource: str
    root: Root | Literal[""]  # "": the call was refused before it had a target
    external: External
    level: Level  # what the policy said
    decision: Decision  # the final word
    decided_by: DecidedBy
    rule_id: str
    mode: PermissionMode
    prompted: bool
    permission_wait_ms: float
    duration_ms: float
    overhead_ms: float
    total_ms: float
    ok: bool
    error_code: ErrorCode | None
    policy_version: str
    ts: float = field(default_factory=time.time)
    operating_mode: OperatingMode = "agent"  # a contract mode's denial says so (seed 003 §11)
    delegate: str | None = None  # the delegate that made the call (seed 003 §10.2)
    # Seed 004's classifier: its verdict, reason, model and latency (0 for a cached judgement), and what
    # the user then chose when asked (null: nobody answered, or nobody was asked).
    classifier_verdict: ClassifierVerdict | None = None
    classifier_reason: str | None = None
    classifier_model: str | None = None
    classifier_ms: float | None = None
    user_choice: Answer | None = None
    # rw: what a call left in a git directory that git would obey, moved to the quarantine
    # (sandbox.gitsweep): a JSON list of {path, moved_to, why}; null when nothing was.
    quarantined: str | None = None
    # Seed 003 §4d's repair-loop guard: a failed Edit or patch command's kind and attempt in its
    # turn, and whether it ended the loop (terminate); null for every other call.
    mutation_failure_kind: str | None = None
    mutation_failure_attempt: int | None = None
    terminate: bool | None = None

    @classmethod
    def build(
        cls,
        call: ToolCall,
        auth: Authorization,
        *,
        args: Mapping[str, Any] | None = None,
        duration_ms: float = 0.0,
        overhead_ms: float = 0.0,
        total_ms: float = 0.0,
        ok: bool = False,
        error_code: ErrorCode | None = None,
        policy_version: str = "",
    ) -> AuditRecord:
        """From a call and its authorization; ``args`` defaults to the validated params."""
        data = dict(args) if args is not None else _dump(call.params)
        decision = auth.decision
        final: Decision = (auth.answer or "allow") if auth.allowed else "deny"
        external: External = decision.escape or ("command" if decision.external else "none")
        judgement = auth.judgement
        classifier: dict[str, Any] = {}
        if judgement is not None:
            classifier = {
                "classifier_verdict": judgement.verdict,
                "classifier_reason": redact(judgement.reason),
                "classifier_model": judgement.model,
                "classifier_ms": judgement.latency_ms,
                "user_choice": auth.answer if auth.decided_by == "user" else None,
            }
        return cls(
            call.session_id,
            call.turn_id,
            call.tool_call_id,
            call.name,
            args_digest(data),
            args_preview(data),
            redact(decision.resource),
            decision.root or "",
            external,
            decision.level,
            final,
            "classifier" if judgement is not None else auth.decided_by,
            decision.rule_id,
            decision.mode,
            auth.prompted,
            auth.wait_ms,
            duration_ms,
            overhead_ms,
            total_ms,
            ok,
            error_code,
            policy_version,
            operating_mode=decision.operating_mode,
            delegate=call.delegate.name if call.delegate is not None else None,
            **classifier,
        )


def _dump(params: BaseModel) -> dict[str, Any]:
    return params.model_dump(mode="json")


_COLUMNS = tuple(f.name for f in fields(AuditRecord))
_SQL_TYPES = {
    "bool": "INTEGER",
    "float": "REAL",
    "float | None": "REAL",
}  # every other field is text: a str or a Literal of them
# Columns added after schema 1, with what an older row holds there: ALTER TABLE adds them on open.
_ADDED = {
    "operating_mode": "TEXT NOT NULL DEFAULT 'agent'",
    "delegate": "TEXT",
    "classifier_verdict": "TEXT",
    "classifier_reason": "TEXT",
    "classifier_model": "TEXT",
    "classifier_ms": "REAL",
    "user_choice": "TEXT",
    "quarantined": "TEXT",
    "mutation_failure_kind": "TEXT",
    "mutation_failure_attempt": "INTEGER",
    "terminate": "INTEGER",
}


# Seed 004's four layers, per row: what the classifier judged; what the deny and ask layers (or a
# contract mode) decided; what ran without asking (exempt: a rule; mode: the permission mode; grant).
_LAYER = (
    "CASE WHEN classifier_verdict IS NOT NULL THEN 'classifier' WHEN level = 'deny' THEN 'deny' "
    "WHEN level = 'confirm' THEN 'ask' WHEN decided_by = 'rule' THEN 'exempt' ELSE decided_by END"
)

_DENIAL_COLUMNS = ("session_id", "tool_call_id", "host", "port", "reason", "rule", "message", "method", "path", "ts")
_DENIALS = (
    "CREATE TABLE IF NOT EXISTS network_denials (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, "
    "tool_call_id TEXT NOT NULL, host TEXT NOT NULL, port INTEGER NOT NULL, reason TEXT NOT NULL, rule TEXT, "
    "message TEXT NOT NULL, method TEXT, path TEXT, ts REAL NOT NULL)"
)
_DENIALS_ADDED = {"method": "TEXT", "path": "TEXT"}  # schema 6: a request the broker refused
_NETWORK_CHANGES = (
    "CREATE TABLE IF NOT EXISTS network_changes (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, "
    "source TEXT NOT NULL, change TEXT NOT NULL, ts REAL NOT NULL)"
)  # schema 6: a session's allowlist, rules or secrets changed while it ran (configure, or an allow-session answer)


def _schema() -> str:
    cols = []
    for f in fields(AuditRecord):
        annotation = str(f.type)  # the annotation as written: this module defers them all
        kind = _SQL_TYPES.get(annotation, "TEXT")
        null = "" if annotation.endswith("| None") else " NOT NULL"
        cols.append(f"{f.name} {_ADDED.get(f.name, kind + null)}")  # an added column as an older log gets it
    return f"CREATE TABLE IF NOT EXISTS calls (id INTEGER PRIMARY KEY AUTOINCREMENT, {', '.join(cols)})"


def _add_columns(db: sqlite3.Connection, table: str, columns: Mapping[str, str]) -> None:
    """The columns an older log's ``table`` lacks, added (by whichever process opens it first)."""
    present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    for column, kind in columns.items():
        if column not in present:
            try:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            except sqlite3.OperationalError as exc:  # another process added it first
                if "duplicate column" not in str(exc):
                    raise


class AuditLog:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or datadir.subdir("audit") / "audit.sqlite3"
        self._lock = threading.Lock()
        with map_errors(f"cannot open the audit log {self.path}"):
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._db = self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: atomic, survives process crashes
            db.execute(_schema())
            _add_columns(db, "calls", _ADDED)
            db.execute("CREATE INDEX IF NOT EXISTS calls_session ON calls(session_id, ts)")
            db.execute(_DENIALS)
            _add_columns(db, "network_denials", _DENIALS_ADDED)
            db.execute(_NETWORK_CHANGES)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            db.close()
            raise _os_error(exc, "audit database unusable: ") from exc
        return db

    def record(self, record: AuditRecord) -> None:
        values = [getattr(record, name) for name in _COLUMNS]
        sql = f"INSERT INTO calls ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
        with self._lock, map_errors("cannot write the audit log"):
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute(sql, values)
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                raise _os_error(exc) from exc

    def record_denial(self, session_id: str, tool_call_id: str, denial: Mapping[str, Any]) -> None:
        """One refused connection: ``denial`` carries host, port, reason, rule and message."""
        values = [session_id, tool_call_id, *(denial.get(k) for k in _DENIAL_COLUMNS[2:-1]), time.time()]
        values[6] = redact(str(values[6]))  # the message may quote a URL with credentials
        sql = f"INSERT INTO network_denials ({', '.join(_DENIAL_COLUMNS)}) VALUES ({', '.join('?' * len(values))})"
        with self._lock, map_errors("cannot write the audit log"):
            try:
                self._db.execute(sql, values)
            except sqlite3.Error as exc:
                raise _os_error(exc) from exc

    def record_network_change(self, session_id: str, source: str, change: Mapping[str, Any]) -> None:
        """A live change of a session's network: ``source`` is ``configure`` or ``ask``; ``change``
        what it became (hosts, rules, the secrets' names and hosts: never a value)."""
        values = (session_id, source, json.dumps(change, sort_keys=True), time.time())
        sql = "INSERT INTO network_changes (session_id, source, change, ts) VALUES (?, ?, ?, ?)"
        with self._lock, map_errors("cannot write the audit log"):
            try:
                self._db.execute(sql, values)
            except sqlite3.Error as exc:
                raise _os_error(exc) from exc

    def network_changes(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """The live changes of sessions' networks, oldest first (of one session when given)."""
        where, args = ("WHERE session_id = ?", (session_id,)) if session_id else ("", ())
        with self._lock:
            cursor = self._db.execute(
                f"SELECT id, session_id, source, change, ts FROM network_changes {where} ORDER BY id", args
            )
            rows = [dict(zip([d[0] for d in cursor.description], row, strict=True)) for row in cursor.fetchall()]
        return [{**row, "change": json.loads(row["change"])} for row in rows]

    def denials(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """The refused connections, oldest first (of one session when given)."""
        where, args = ("WHERE session_id = ?", (session_id,)) if session_id else ("", ())
        with self._lock:
            cursor = self._db.execute(
                f"SELECT id, {', '.join(_DENIAL_COLUMNS)} FROM network_denials {where} ORDER BY id", args
            )
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):  # no transaction was open
            self._db.execute("ROLLBACK")

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            cursor = self._db.execute(f"SELECT id, {', '.join(_COLUMNS)} FROM calls ORDER BY id")
            names = [d[0] for d in cursor.description]
            return [_typed(dict(zip(names, row, strict=True))) for row in cursor.fetchall()]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            total = self._db.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
            by = {
                col: dict(
                    self._db.execute(
                        f"SELECT {col}, COUNT(*) FROM calls GROUP BY {col} ORDER BY COUNT(*) DESC"
                    ).fetchall()
                )
                for col in ("decision", "decided_by", "tool", "level")
            }
            denied = self._db.execute(
                "SELECT rule_id, COUNT(*) FROM calls WHERE decision = 'deny' GROUP BY rule_id "
                "ORDER BY COUNT(*) DESC LIMIT 10"
            ).fetchall()
            prompted, wait = self._db.execute(
                "SELECT COALESCE(SUM(prompted), 0), COALESCE(AVG(permission_wait_ms), 0) FROM calls WHERE prompted = 1"
            ).fetchone()
            layers = dict(
                self._db.execute(f"SELECT {_LAYER}, COUNT(*) FROM calls GROUP BY 1 ORDER BY 2 DESC").fetchall()
            )
            verdicts = dict(
                self._db.execute(
                    "SELECT classifier_verdict, COUNT(*) FROM calls WHERE classifier_verdict IS NOT NULL "
                    "GROUP BY 1 ORDER BY 2 DESC"
                ).fetchall()
            )
            after_block = dict(
                self._db.execute(
                    "SELECT COALESCE(user_choice, CASE WHEN prompted = 1 THEN 'unanswered' ELSE 'refused' END), "
                    "COUNT(*) FROM calls WHERE classifier_verdict = 'block' GROUP BY 1 ORDER BY 2 DESC"
                ).fetchall()
            )
            latency = self._db.execute(
                "SELECT COALESCE(AVG(classifier_ms), 0) FROM calls WHERE classifier_ms > 0"
            ).fetchone()[0]
        return {
            "total": total,
            "by_decision": by["decision"],
            "by_decided_by": by["decided_by"],
            "by_tool": by["tool"],
            "by_level": by["level"],
            "top_denying_rules": dict(denied),
            "prompted": prompted,
            "mean_permission_wait_ms": round(wait, 3),
            "by_layer": layers,
            "classifier": {
                "by_verdict": verdicts,
                "after_block": after_block,
                "mean_latency_ms": round(latency, 3),
            },
        }

    def export_jsonl(self, fp: IO[str]) -> int:
        rows = self.rows()
        for row in rows:
            fp.write(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n")
        return len(rows)

    def close(self) -> None:
        with self._lock:
            self._db.close()


# SQLite's result codes for a resource running out, as the errno a caller tells them apart by
# (map_errors puts it in the error's data): a full disk is ENOSPC whether SQLite or the OS saw it.
_SQLITE_ERRNO = {7: errno.ENOMEM, 10: errno.EIO, 13: errno.ENOSPC}


def _os_error(exc: sqlite3.Error, prefix: str = "") -> OSError:
    """``exc`` as an ``OSError`` with an errno when SQLite's code maps to one (SQLITE_NOMEM,
    SQLITE_IOERR, SQLITE_FULL), else without."""
    code = getattr(exc, "sqlite_errorcode", None)
    found = _SQLITE_ERRNO.get(code & 0xFF) if isinstance(code, int) else None
    if found is None:
        return OSError(f"{prefix}{exc}")
    return OSError(found, f"{prefix}{exc}")


def _typed(row: dict[str, Any]) -> dict[str, Any]:
    row["prompted"] = bool(row["prompted"])
    row["ok"] = bool(row["ok"])
    if row["terminate"] is not None:
        row["terminate"] = bool(row["terminate"])
    return row


__all__ = [
    "AuditLog",
    "AuditRecord",
    "args_digest",
    "args_preview",
    "asdict",
    "body_summary",
    "redact",
    "redact_value",
]
