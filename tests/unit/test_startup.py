"""Start-up is a product figure: what the CLI imports, and `serve` answering `initialize` early.

Times are measured in `make bench` (bench/bench_startup.py); here we check the causes: which
heavy modules a command loads, and that the early `initialize` reply is the server's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandbox import protocol
from sandbox.tools.params import REGISTRY

SANDBOX = str(Path(sys.executable).with_name("sandbox"))
HEAVY = (
    "pydantic",
    "bashlex",
    "docker",
    "psutil",
    "sqlite3",
    "asyncio",
    "anyio",
    "sandbox.policy",
    "sandbox.tools",
    "sandbox.server",
    "sandbox.session",
    "sandbox.compare",
    "sandbox.audit",
    "sandbox.profile",
    "sandbox.exec",
    "sandbox.image",
)


def loaded_after(code: str) -> list[str]:
    """The heavy modules a fresh interpreter has loaded after running ``code``."""
    script = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script], stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True
    )
    modules = json.loads(out.stdout.splitlines()[-1])
    return sorted({h for m in modules for h in HEAVY if m == h or m.startswith(h + ".")})


def test_building_the_parser_imports_nothing_heavy() -> None:
    assert loaded_after("from sandbox import cli; cli.build_parser()") == []


def test_the_package_face_imports_nothing_until_a_name_is_used() -> None:
    assert loaded_after("import sandbox\nsandbox.__version__") == []
    assert "sandbox.session" in loaded_after("from sandbox import Sandbox")


def test_the_package_face_names_the_real_objects() -> None:
    import sandbox
    from sandbox.policy.approvals import CallbackApprover
    from sandbox.session import Sandbox

    assert sandbox.Sandbox is Sandbox and sandbox.CallbackApprover is CallbackApprover
    assert set(sandbox.__all__) <= set(dir(sandbox))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        sandbox.Nope  # noqa: B018


def test_version_imports_nothing_heavy() -> None:
    code = "from sandbox import cli\ntry:\n    cli.main(['--version'])\nexcept SystemExit:\n    pass"
    assert loaded_after(code) == []


def test_run_imports_only_what_a_run_needs(tmp_path: Path) -> None:
    """A profile's first run here: pydantic (to validate it) and anyio (the executor), psutil where
    no cgroup lists the call's processes. Its next runs (the quick path): nothing heavy at all."""
    code = (
        f"from sandbox import cli\ntry:\n    cli.main(['run', '--workspace', {str(tmp_path)!r}, '--', 'true'])\n"
        "except SystemExit:\n    pass"
    )
    first = set(loaded_after(code))
    assert first <= {"pydantic", "asyncio", "anyio", "psutil", "sandbox.profile", "sandbox.exec"}
    assert loaded_after(code) == []


def test_names_spelled_for_the_parser_are_the_real_ones() -> None:
    from sandbox import image
    from sandbox.cli import image as cli_image

    assert list(protocol.TOOL_NAMES) == sorted(REGISTRY)
    assert (tuple(image.VARIANTS), image.MODES) == (cli_image.VARIANTS, cli_image.MODES)


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"client":"pi"}}\n',
        b'{"jsonrpc":"2.0","id":"a","method":"initialize"}\n',
        b'{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"client":null}}',
    ],
)
def test_early_reply_to_a_well_formed_initialize(line: bytes) -> None:
    reply = protocol.early_reply(line)
    assert reply is not None and reply.endswith(b"\n")
    body = json.loads(reply)
    assert body["id"] == json.loads(line)["id"]
    assert body["result"] == protocol.initialize_result()


@pytest.mark.parametrize(
    "line",
    [
        b"not json\n",
        b"[1, 2]\n",
        b'{"jsonrpc":"2.0","id":1,"method":"session.open","params":{}}\n',
        b'{"jsonrpc":"1.0","id":1,"method":"initialize"}\n',
        b'{"jsonrpc":"2.0","method":"initialize"}\n',
        b'{"jsonrpc":"2.0","id":true,"method":"initialize"}\n',
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"client":3}}\n',
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"extra":1}}\n',
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":[1]}\n',
    ],
)
def test_anything_else_is_left_to_the_full_server(line: bytes) -> None:
    assert protocol.early_reply(line) is None


def _serve(stdin: bytes) -> list[dict[str, Any]]:
    done = subprocess.run([SANDBOX, "serve"], input=stdin, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_requests_sent_with_initialize_reach_the_full_server() -> None:
    """Input read along with the first line is handed over, not lost."""
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"client": "t"}},
        {"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {"bogus": 1}},
        {"jsonrpc": "2.0", "id": 3, "method": "shutdown"},
    ]
    replies = _serve(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
    by_id = {r["id"]: r for r in replies}
    assert by_id[1]["result"] == protocol.initialize_result()
    assert by_id[2]["error"]["code"] == -32602  # invalid params: the full server's answer


def test_a_bad_first_line_gets_the_full_servers_error() -> None:
    replies = _serve(
        b'{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"x":1}}\n'
        b'{"jsonrpc":"2.0","id":8,"method":"shutdown"}\n'
    )
    assert replies[0]["id"] == 7 and replies[0]["error"]["code"] == -32602


def _fake_bwrap(tmp_path: Path) -> str:
    path = tmp_path / "bwrap"
    path.write_text("#!/bin/sh\necho 'bubblewrap 0.0-test'\n")
    path.chmod(0o755)
    return str(path)


def test_a_passed_smoke_test_is_kept_until_the_binary_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox.backends import bwrap

    runs: list[str] = []
    monkeypatch.setattr(bwrap, "_smoke", lambda: runs.append("smoke"))
    fake = _fake_bwrap(tmp_path)
    assert bwrap._smoke_verdict(fake) == (None, "bubblewrap 0.0-test")
    assert bwrap._smoke_verdict(fake) == (None, "bubblewrap 0.0-test")
    assert runs == ["smoke"]  # the second process start reads the verdict
    Path(fake).write_text("#!/bin/sh\necho 'bubblewrap 0.1-test'\n")  # an upgrade: size and mtime change
    assert bwrap._smoke_verdict(fake) == (None, "bubblewrap 0.1-test")
    assert runs == ["smoke", "smoke"]


def test_a_failed_smoke_test_is_never_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox.backends import bwrap

    monkeypatch.setattr(bwrap, "_smoke", lambda: "bwrap cannot create a jail here: no user namespaces")
    fake = _fake_bwrap(tmp_path)
    assert bwrap._smoke_verdict(fake)[0] == "bwrap cannot create a jail here: no user namespaces"
    monkeypatch.setattr(bwrap, "_smoke", lambda: None)
    assert bwrap._smoke_verdict(fake)[0] is None  # fixed host: seen at once
