"""Audit: secrets never reach the log; a crash leaves whole records or none."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox.audit import AuditLog, AuditRecord, args_preview, redact, redact_value
from sandbox.policy.authorize import Authorization
from sandbox.policy.gate import SessionState

if TYPE_CHECKING:
    from tests.unit.policy.policy_world import World

SECRETS = [
    ("export GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdef"),
    ("curl -H 'Authorization: Bearer eyJhbGciOi.abc.def' x", "eyJhbGciOi"),
    ("git clone https://alice:s3cretpw@example.com/repo.git", "s3cretpw"),
    ("DB_PASSWORD=hunter2 ./manage.py", "hunter2"),
    ("mysql --password hunter2 -u root", "hunter2"),
    ("--api-key=abcd1234efgh", "abcd1234efgh"),
    ('{"client_secret": "xyz-789"}', "xyz-789"),
    ("aws configure set key AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("OPENAI_API_KEY=sk-proj-abcdefghijklmnop1234", "sk-proj-abcdef"),
    ("slack xoxb-123456789012-abcdefABCDEF", "xoxb-1234"),
    (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
        "b3BlbnNzaC1rZXkt",
    ),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEtruncated", "MIIEtruncated"),
    ("MY_SERVICE_SECRET='two words' make", "two words"),
    ("password: hunter2", "hunter2"),
    ("Z9x8C7v6B5n4M3a2S1d0F9g8H7j6K5l4Q3w2E1r0T9y8", "Z9x8C7v6B5n4"),
]


@pytest.mark.parametrize(("text", "secret"), SECRETS)
def test_redact_removes_secrets(text: str, secret: str) -> None:
    assert secret not in redact(text)


def test_redact_keeps_ordinary_commands() -> None:
    for text in ("ls -la src", "git commit -m 'fix token parsing'", "pytest -k password_reset"):
        assert redact(text) == text


def test_environment_values_are_dropped() -> None:
    value = redact_value({"command": "run", "env": {"HOME": "/root", "X": "1"}, "token": "abc"})
    assert value == {"command": "run", "env": {"HOME": "[REDACTED]", "X": "[REDACTED]"}, "token": "[REDACTED]"}
    assert "hunter2" not in args_preview({"content": "PASSWORD=hunter2\n" * 100})


def _record(world: World, command: str) -> AuditRecord:
    gate = world.gate("ask")
    call = world.call("Bash", {"command": command})
    decision = gate.evaluate(call, SessionState("s1"))
    auth = Authorization(decision, False, "user", "the user denied permission", "deny", True, 12.5)
    return AuditRecord.build(call, auth, total_ms=13.0, error_code="TOOL_DENIED", policy_version=gate.policy_version)


def test_records_round_trip_without_secrets(world: World, tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.sqlite3")
    log.record(_record(world, "TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789 make deploy"))
    raw = (tmp_path / "audit.sqlite3").read_bytes() + (tmp_path / "audit.sqlite3-wal").read_bytes()
    assert b"ghp_abcdef" not in raw
    out = io.StringIO()
    assert log.export_jsonl(out) == 1
    row = json.loads(out.getvalue())
    assert (row["decision"], row["decided_by"], row["prompted"], row["error_code"]) == (
        "deny",
        "user",
        True,
        "TOOL_DENIED",
    )
    assert row["rule_id"] == "shell.command" and row["policy_version"].startswith("1+")
    stats = log.stats()
    assert stats["total"] == 1 and stats["by_decision"] == {"deny": 1}
    log.close()


_CRASHER = """
import os, sys
from sandbox.audit import AuditLog, AuditRecord
log = AuditLog(__import__("pathlib").Path(sys.argv[1]))
rec = AuditRecord("s", "t", "c", "Bash", "h", "{}", "ls", "workspace", "none", "allow", "allow", "rule",
                  "exempt.read-only", "ask", False, 0.0, 1.0, 0.1, 1.1, True, None, "1")
for _ in range(20):
    log.record(rec)
# Die in the middle of a transaction: half-written, never committed.
log._db.execute("BEGIN IMMEDIATE")
log._db.execute(
    "INSERT INTO calls (session_id, turn_id, tool_call_id, tool, args_hash, args_preview, resource, root,"
    " external, level, decision, decided_by, rule_id, mode, prompted, permission_wait_ms, duration_ms,"
    " overhead_ms, total_ms, ok, error_code, policy_version, ts)"
    " VALUES ('half','t','c','Bash','h','{}','ls','w','none','allow','allow','rule','r','ask',0,0,0,0,0,1,NULL,'1',0)")
os._exit(9)
"""


def test_a_crash_mid_write_leaves_only_whole_records(tmp_path: Path) -> None:
    path = tmp_path / "audit.sqlite3"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.run([sys.executable, "-c", _CRASHER, str(path)], env=env, timeout=60, check=False)
    assert proc.returncode == 9
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert db.execute("SELECT COUNT(*) FROM calls").fetchone() == (20,)
    assert db.execute("SELECT COUNT(*) FROM calls WHERE session_id = 'half'").fetchone() == (0,)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.close()
    assert len(AuditLog(path).rows()) == 20


def test_not_null_columns_refuse_half_records(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "a.sqlite3")
    with pytest.raises(sqlite3.IntegrityError):
        log._db.execute("INSERT INTO calls (session_id) VALUES ('x')")
    assert log.rows() == []
