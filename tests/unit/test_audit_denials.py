"""The audit's network denials: a request the broker refused keeps its method and path, and a log
written before they existed (schema 5) gains the columns when it is opened."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from sandbox.audit import AuditLog
from sandbox.network.denial import Denial

if TYPE_CHECKING:
    from pathlib import Path

OLD_DENIALS = (
    "CREATE TABLE network_denials (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, "
    "tool_call_id TEXT NOT NULL, host TEXT NOT NULL, port INTEGER NOT NULL, reason TEXT NOT NULL, rule TEXT, "
    "message TEXT NOT NULL, ts REAL NOT NULL)"
)


def test_an_older_log_gains_method_and_path_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "audit.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute(OLD_DENIALS)
        db.execute(
            "INSERT INTO network_denials (session_id, tool_call_id, host, port, reason, rule, message, ts)"
            " VALUES ('s', 'c', 'old.test', 443, 'not-allowed', NULL, 'old', 1.0)"
        )
    log = AuditLog(path)
    refused = Denial("api.test", 443, "request-refused", "GET /ok", "no request rule allows it")
    log.record_denial("s", "c2", vars(refused.for_request("DELETE", "/repos/x?token=abc")))
    rows = log.denials("s")
    assert [(r["host"], r["method"], r["path"]) for r in rows] == [
        ("old.test", None, None),
        ("api.test", "DELETE", "/repos/x"),  # the query is never kept: it may hold a credential
    ]


def test_a_request_denial_reads_as_one_line_naming_method_path_and_host() -> None:
    denial = Denial("api.test", 443, "request-refused", None, "no request rule allows it").for_request("POST", "/a")
    assert (
        denial.line() == "sandbox: request POST /a to api.test:443 refused (request-refused): no request rule allows it"
    )
    plain = Denial("x.test", 443, "not-allowed", None, "x.test:443 is not on the allowlist")
    assert plain.line().startswith("sandbox: connection to x.test:443 refused (not-allowed)")
