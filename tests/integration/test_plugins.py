"""Plugin tools in a real jail (bubblewrap and Docker): JSON in and out, the plugin's directory
read-only, failures that lose nothing, a timeout that kills the tree, the audit, and ``sandbox serve
--plugin``."""

from __future__ import annotations

import json
import os
import textwrap
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from sandbox.session import Sandbox
from tests.conftest import backend_or_skip, own_like_a_checkout, survivors
from tests.rpc_client import SANDBOX, Client

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from sandbox.backends import base
    from sandbox.vocabulary import BackendName

pytestmark = pytest.mark.anyio

TOOL = textwrap.dedent(
    """\
    import json, os, subprocess, sys, time
    args = json.load(sys.stdin)
    what = os.environ["SANDBOX_PLUGIN_TOOL"]
    here = os.environ["SANDBOX_PLUGIN_DIR"]
    if what == "echo":
        print(json.dumps({"content": "you said " + args["text"], "details": {
            "cwd": os.getcwd(), "dir": here, "scratch": os.environ.get("SANDBOX_SCRATCH_DIR"),
            "home": os.environ.get("HOME"), "leaked": os.environ.get("HOST_SECRET"), "args": args}}))
    elif what == "scribble":
        try:
            open(os.path.join(here, "planted"), "w").write("x")
        except OSError as exc:
            print(json.dumps({"content": f"cannot write: {exc}", "isError": True}))
        else:
            print(json.dumps({"content": "wrote my own directory"}))
    elif what == "plain":
        print(json.dumps([1, {"two": 2}]))
    elif what == "garbled":
        print("this is not JSON")
        print("a warning", file=sys.stderr)
    elif what == "crash":
        print(json.dumps({"content": "half done"}))
        print("Traceback: boom", file=sys.stderr)
        sys.exit(3)
    elif what == "hang":
        subprocess.Popen(["setsid", "sh", "-c", f"sleep {args['marker']}"], start_new_session=True)
        print("started", file=sys.stderr, flush=True)
        time.sleep(600)
    """
)
TOOLS = ("echo", "scribble", "plain", "garbled", "crash", "hang")


def make_plugin(root: Path, plugin_id: str = "kit") -> Path:
    directory = root / plugin_id
    directory.mkdir(parents=True)
    (directory / "tool.py").write_text(TOOL)
    params = {"type": "object", "properties": {"text": {"type": "string"}, "marker": {"type": "string"}}}
    tools = [
        {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {**params, "required": ["text"]} if name == "echo" else params,
            "risk": "low",
            "command": ["python3", "${PLUGIN_DIR}/tool.py"],
            **({"timeout": 2} if name == "hang" else {}),
        }
        for name in TOOLS
    ]
    manifest = directory / "plugin.json"
    manifest.write_text(json.dumps({"id": plugin_id, "tools": tools}))
    return manifest


@pytest.fixture
async def session(
    backend: base.Backend, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Sandbox]:
    monkeypatch.setenv("HOST_SECRET", "hunter2")
    manifest = make_plugin(tmp_path / "plugins")
    if backend.name == "docker":
        own_like_a_checkout(manifest.parent)  # writable by the jail's user: only the read-only bind stops it
    name: BackendName = "docker" if backend.name == "docker" else "bwrap"
    opened = Sandbox.open(workspace, backend=name, mode="ask", plugins=[manifest], granted_plugins=["kit"])
    async with opened as s:
        yield s


async def test_json_in_json_out_inside_the_jail(session: Sandbox, workspace: Path) -> None:
    result = await session.call("plugin_kit_echo", {"text": "hi", "marker": "m"}, tool_call_id="p1")
    assert (result.ok, result.content) == (True, "you said hi"), result
    seen = result.details["result_details"]
    assert seen["cwd"] == str(workspace) and seen["dir"] == "/run/sandbox/plugins/kit"
    assert seen["scratch"] == str(session.scratch) and seen["home"] == "/tmp/home"
    assert seen["leaked"] is None  # the same scrubbed environment as Bash
    assert seen["args"] == {"text": "hi", "marker": "m"}
    plain = await session.call("plugin_kit_plain", {})
    assert (plain.ok, plain.details["result"]) == (True, [1, {"two": 2}])
    rows = {r["tool_call_id"]: r for r in session.audit.rows()}
    assert (rows["p1"]["tool"], rows["p1"]["rule_id"], rows["p1"]["ok"]) == ("plugin_kit_echo", "plugin.low", True)
    assert json.loads(rows["p1"]["args_preview"]) == {"marker": "m", "text": "hi"}


async def test_the_plugin_directory_is_read_only_in_the_jail(session: Sandbox, tmp_path: Path) -> None:
    result = await session.call("plugin_kit_scribble", {})
    assert (result.ok, result.error_code) == (False, "TOOL_FAILED") and "Read-only file system" in result.content
    assert not (tmp_path / "plugins" / "kit" / "planted").exists()
    session.state.mode = "auto"
    # The write is hidden from the policy (which would ask about a `touch` outside the workspace):
    # what is tested here is the jail's read-only bind, not the gate.
    write = "open('/run/sandbox/plugins/kit/tool.py', 'w')"
    bash = await session.call(
        "Bash", {"command": f'cat /run/sandbox/plugins/kit/plugin.json >/dev/null && python3 -c "{write}"'}
    )
    assert not bash.ok and "Read-only file system" in bash.content


async def test_bad_output_and_a_failed_command_lose_nothing(session: Sandbox) -> None:
    garbled = await session.call("plugin_kit_garbled", {})
    assert (garbled.ok, garbled.error_code) == (False, "TOOL_FAILED") and "did not answer JSON" in garbled.content
    assert garbled.details["stdout"] == "this is not JSON\n" and garbled.details["stderr"] == "a warning\n"
    crash = await session.call("plugin_kit_crash", {})
    assert (crash.ok, crash.error_code, crash.details["exit_code"]) == (False, "TOOL_FAILED", 3)
    assert "half done" in crash.details["stdout"] and "Traceback: boom" in crash.content
    invalid = await session.call("plugin_kit_echo", {"text": 5})
    assert invalid.error_code == "INVALID_ARGUMENT" and invalid.details["problems"][0]["field"] == "text"


async def test_a_timeout_kills_the_plugins_whole_tree(session: Sandbox, marker: str) -> None:
    with anyio.fail_after(30):
        result = await session.call("plugin_kit_hang", {"marker": marker})
    assert (result.ok, result.error_code) == (False, "TIMEOUT") and "started" in result.details["stderr"]
    assert survivors(marker) == []


# -- sandbox serve --plugin ------------------------------------------------------------------------------


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Client, Path]]:
    backend_or_skip("bwrap")
    granted = make_plugin(tmp_path / "plugins", "kit")
    argv = [SANDBOX, "serve", "--plugin", str(granted), "--grant-plugin", "kit"]
    proc = await anyio.open_process(argv, env=dict(os.environ))
    try:
        yield Client(proc), tmp_path
    finally:
        with anyio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            await proc.aclose()


@pytest.mark.bwrap
async def test_serve_with_a_granted_plugin_lists_and_runs_its_tools(
    served: tuple[Client, Path], workspace: Path
) -> None:
    client, root = served
    init = await client.call("initialize", {"client": "test"})
    assert "plugin_kit_echo" in init["result"]["tools"] and init["result"]["plugins"][0]["registered"]
    other = make_plugin(root / "more", "other")
    opened = await client.call("session.open", {"workspace": str(workspace), "mode": "auto", "plugins": [str(other)]})
    sid = opened["result"]["session_id"]
    states = {p["id"]: p["registered"] for p in opened["result"]["plugins"]}
    assert states == {"kit": True, "other": False}
    call: dict[str, Any] = {"session_id": sid, "tool": "plugin_kit_echo", "args": {"text": "yo"}}
    ran = await client.call("tool.call", call)
    assert ran["result"]["ok"] and ran["result"]["content"] == "you said yo"
    client.answer = {"decision": "allow-once"}
    registered = await client.call("plugin.register", {"session_id": sid, "plugin_id": "other"})
    assert registered["result"]["registered"] and client.approvals[-1]["operation"] == "register"
    second = await client.call("tool.call", {**call, "tool": "plugin_other_plain", "args": {}})
    assert second["result"]["ok"], second
    audit = await client.call("audit.query", {"session_id": sid})
    tools = [r["tool"] for r in audit["result"]["records"]]
    assert tools == ["plugin.kit", "plugin_kit_echo", "plugin.other", "plugin_other_plain"]
