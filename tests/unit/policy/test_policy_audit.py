"""Audit: secrets never reach the log; a crash leaves whole records or none."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox.audit import AuditLog, AuditRecord, args_preview, body_summary
from sandbox.policy.authorize import Authorization, request_for
from sandbox.policy.gate import SessionState
from sandbox.redaction import redact, redact_value

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
    # header-style secrets, anywhere on a line
    ("curl -H 'X-Api-Key: k3yvalue' https://api.example.com", "k3yvalue"),
    ('curl -H "x-api-key:k3yvalue" https://api.example.com', "k3yvalue"),
    ("curl -H 'X-Auth-Token: t0kval' https://x", "t0kval"),
    ("curl --header 'X-Vault-Token: s.vaulttok' https://vault", "s.vaulttok"),
    ("curl -H 'PRIVATE-TOKEN: gitlabtok' https://gitlab", "gitlabtok"),
    ("HTTP/1.1 200 OK\nSet-Cookie: sid=c00kie; Path=/\nServer: x", "c00kie"),
    ("curl -b 'Cookie: sid=c00kie' https://x", "c00kie"),
    ("curl -H 'Authorization: Basic dXNlcjpwYXNz' https://x", "dXNlcjpwYXNz"),
    ("curl -H 'Authorization: rawtok3n' https://x", "rawtok3n"),
    ("curl -H 'Proxy-Authorization: Basic cHJveHk6cHc=' https://x", "cHJveHk6cHc="),
    ("requests.get(url, headers={'X-Api-Key': 'k3yvalue'})", "k3yvalue"),
    # inline passwords on command lines
    ("mysql -u root -pS3cret app", "S3cret"),
    ("mysqldump -uroot -pS3cret --all-databases", "S3cret"),
    ("mariadb -h db -p'S3cret' app", "S3cret"),
    ("mysql --password=S3cret -u root", "S3cret"),
    ("sshpass -p S3cret ssh deploy@host", "S3cret"),
    ("sshpass -pS3cret scp f host:", "S3cret"),
    ("PGPASSWORD=S3cret psql -h db -U app", "S3cret"),
    ("MYSQL_PWD=S3cret mysql -u root", "S3cret"),
    ("redis-cli -h cache -a S3cret PING", "S3cret"),
    ("curl -u alice:S3cret https://x", "S3cret"),
    ("curl --user 'alice:S3cret' https://x", "S3cret"),
    # the seeds' last rows (issue 35): registry logins, archive, key and htpasswd passwords
    ("docker login -u alice -p S3cret registry.example.com", "S3cret"),
    ("podman login -pS3cret quay.io", "S3cret"),
    ("docker login --username alice --password S3cret", "S3cret"),
    ("zip -P S3cret out.zip a b", "S3cret"),
    ("zip -r -PS3cret out.zip dir", "S3cret"),
    ("7z a -pS3cret out.7z dir", "S3cret"),
    ("openssl enc -aes-256-cbc -k S3cret -in a -out b", "S3cret"),
    ("openssl pkcs12 -export -passout pass:S3cret -out k.p12", "S3cret"),
    ("openssl rsa -in k.pem -passin 'pass:S3cret'", "S3cret"),
    ("htpasswd -b .htpasswd alice S3cret", "S3cret"),
    ("htpasswd -cbB /etc/nginx/.htpasswd alice S3cret", "S3cret"),
    ("echo 'password: S3cret' >> config.yml", "S3cret"),
    ('printf "db:\n  passwd: S3cret\n" > c.yml', "S3cret"),
    ("sed -i 's/secret: old/secret: S3cret/' app.yml", "S3cret"),
    # URLs with credentials
    ("psql postgres://app:S3cret@db:5432/app", "S3cret"),
    ("redis-cli -u redis://:S3cret@cache:6379", "S3cret"),
    ("mongosh 'mongodb+srv://app:S3cret@cluster0.example.net/db'", "S3cret"),
    ("git push HTTPS://alice:S3cret@example.com/r.git", "S3cret"),
    ("git clone https://alice:p4ss@w0rd@example.com/r.git", "w0rd"),  # an @ inside the password
    ("curl 'https://api.example.com/v1?access_token=S3cret&page=2'", "S3cret"),
]


@pytest.mark.parametrize(("text", "secret"), SECRETS)
def test_redact_removes_secrets(text: str, secret: str) -> None:
    assert secret not in redact(text)


ORDINARY = [
    "ls -la src",
    "git commit -m 'fix token parsing'",
    "pytest -k password_reset",
    "mkdir -p build/out && cp -p a b",
    "git add -p",
    "ssh -p 2222 deploy@host",
    "mysql -p app",  # prompts: no password on the line
    "git clone ssh://git@github.com/org/repo.git",
    "curl -H 'Content-Type: application/json' -H 'X-Request-Id: 42' https://api.example.com",
    "the token: parsing was fixed",
    "curl -u alice https://x",
    "docker run -p 8080:80 nginx",
    "docker login registry.example.com",
    "zip -r out.zip dir",
    "openssl req -new -key k.pem -out r.csr",
    "htpasswd .htpasswd alice",
    "unzip -p a.zip file.txt",
    # a long path with digits is not a key: an approval card must show it
    "cat /tmp/pytest-of-root/pytest-296/test_approval_deny_allow_sessi0/ws/a.txt",
    "ls ~/build/2026-12-03/artifacts/linux_x86_64/release_candidate_7",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_redact_keeps_ordinary_commands(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), SECRETS)
def test_redact_is_stable(text: str, secret: str) -> None:
    """Redacting twice changes nothing: an approval card's resource may be redacted again in the log."""
    once = redact(text)
    assert redact(once) == once and secret not in once


def test_redact_keeps_what_the_secret_belongs_to() -> None:
    assert redact("curl -H 'Authorization: Bearer abcdefgh12345' https://x") == (
        "curl -H 'Authorization: Bearer [REDACTED]' https://x"
    )
    assert redact("curl -H 'X-Api-Key: k3y' https://x") == "curl -H 'X-Api-Key: [REDACTED]' https://x"
    assert redact("mysql -u root -pS3cret app") == "mysql -u root -p[REDACTED] app"
    assert redact("psql postgres://app:S3cret@db/app") == "psql postgres://app:[REDACTED]@db/app"


def test_environment_values_are_dropped() -> None:
    value = redact_value({"command": "run", "env": {"HOME": "/root", "X": "1"}, "token": "abc"})
    assert value == {"command": "run", "env": {"HOME": "[REDACTED]", "X": "[REDACTED]"}, "token": "[REDACTED]"}
    assert "hunter2" not in args_preview({"content": "PASSWORD=hunter2\n" * 100})


def test_write_preview_keeps_the_digest_and_size_never_the_body() -> None:
    body = "print('hello')\n" * 1000
    preview = json.loads(args_preview({"path": "src/app.py", "content": body}))
    assert preview == {
        "content": {"bytes": len(body.encode()), "sha256": hashlib.sha256(body.encode()).hexdigest()},
        "path": "src/app.py",
    }


def test_edit_preview_keeps_the_digest_size_and_count_never_the_text() -> None:
    edits = [{"old_text": "hello", "new_text": "goodbye"}, {"old_text": "a", "new_text": "b"}]
    summary = json.loads(args_preview({"path": "src/app.py", "edits": edits}))["edits"]
    assert summary == body_summary(edits) and summary["count"] == 2
    assert "goodbye" not in args_preview({"path": "src/app.py", "edits": edits})
    assert body_summary(edits) != body_summary([*edits[:1], {"old_text": "a", "new_text": "c"}])


def test_a_body_refused_before_validation_is_not_previewed() -> None:
    assert "hunter2" not in args_preview({"path": 5, "content": ["PASSWORD", "hunter2"]})
    assert json.loads(args_preview({"content": "\u00e9"}))["content"]["bytes"] == 2


def test_the_approval_request_is_redacted(world: World) -> None:
    gate = world.gate("ask")
    call = world.call("Bash", {"command": "curl -H 'X-Api-Key: k3yvalue' https://api.example.com"})
    decision = gate.evaluate(call, SessionState("s1"))
    assert decision.level == "confirm" and "k3yvalue" in decision.resource  # the gate keeps the real command
    request = request_for(call, decision)
    assert "k3yvalue" not in request.resource and "k3yvalue" not in request.reason
    assert request.resource == redact(decision.resource) and request.reason == redact(decision.reason)


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
