"""A running session's network changed live through ``sandbox serve`` (issue 36), on bubblewrap and Docker.

``session.configure {network, secrets}`` widens or narrows an allowlist session between calls, a
Bash call's ``network_allow`` narrows (never widens) for that call, an ``allow-session`` answer
to a network question is kept for the session, and every change is in the audit
(``network_changes``). The lab is :class:`tests.netlab.NetLab`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from sandbox.audit import AuditLog
from sandbox.datadir import data_dir
from tests import netlab, rpc_client
from tests.conftest import backend_or_skip, own_like_a_checkout
from tests.netlab import HELLO, NetLab
from tests.rpc_client import SANDBOX

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.anyio

BACKENDS = [pytest.param("bwrap", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture(scope="module")
def lab() -> Iterator[NetLab]:
    with NetLab() as running:
        yield running


@pytest.fixture(autouse=True)
def lab_env(lab: NetLab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy resolves with the lab's DNS, trusts the lab's CA, and reads the real values here."""
    netlab.broker_env(lab, monkeypatch)


@pytest.fixture(params=BACKENDS)
def on_backend(request: pytest.FixtureRequest, workspace: Path) -> str:
    backend_or_skip(request.param)
    if request.param == "docker":
        own_like_a_checkout(workspace)
    return str(request.param)


def on_http(lab: NetLab, name: str) -> str:
    return f"{name}:{lab.http_port}"


def base_allow(lab: NetLab) -> list[str]:
    return [on_http(lab, "allowed.test"), *(f"{lab.address}:{port}" for port in sorted(set(lab.ports.values())))]


async def bash(client: rpc_client.Client, sid: str, command: str, call_id: str, **more: Any) -> dict[str, Any]:
    args = {"command": command, **more}
    reply = await client.call("tool.call", {"session_id": sid, "tool": "Bash", "args": args, "tool_call_id": call_id})
    result: dict[str, Any] = reply["result"]
    return result


async def test_an_allowlist_session_widens_and_narrows_between_calls_and_each_change_is_audited(
    lab: NetLab, workspace: Path, on_backend: str
) -> None:
    fetch = f"curl -sSf {lab.http_url('other.test', '/hello.txt')}"
    async with rpc_client.serve() as client:
        opened = await client.call(
            "session.open",
            {"workspace": str(workspace), "backend": on_backend, "mode": "auto", "allow_hosts": base_allow(lab)},
        )
        sid = opened["result"]["session_id"]
        before = await bash(client, sid, fetch, "c1")
        wider = [*base_allow(lab), on_http(lab, "other.test")]
        changed = await client.call("session.configure", {"session_id": sid, "network": {"allow": wider}})
        assert on_http(lab, "other.test") in changed["result"]["network"]["allow"], changed
        after = await bash(client, sid, fetch, "c2")
        await client.call("session.configure", {"session_id": sid, "network": {"allow": base_allow(lab)}})
        again = await bash(client, sid, fetch, "c3")
        refused = await client.call("session.configure", {"session_id": sid, "network": {"mode": "host"}})
        await client.call("session.close", {"session_id": sid})
    assert not before["ok"] and "refused (not-allowed)" in before["content"], before
    assert after["ok"] and HELLO.decode().strip() in after["content"], after
    assert not again["ok"] and "refused (not-allowed)" in again["content"], again
    assert (
        refused["error"]["data"]["code"] == "INVALID_ARGUMENT"
        and "network.mode cannot change" in refused["error"]["message"]
    )
    changes = AuditLog().network_changes(sid)
    assert [(c["source"], on_http(lab, "other.test") in c["change"]["allow"]) for c in changes] == [
        ("configure", True),
        ("configure", False),
    ]


async def test_a_bash_call_may_narrow_the_allowlist_never_widen_it(
    lab: NetLab, workspace: Path, on_backend: str
) -> None:
    both = [*base_allow(lab), on_http(lab, "other.test")]
    async with rpc_client.serve() as client:
        opened = await client.call(
            "session.open", {"workspace": str(workspace), "backend": on_backend, "mode": "auto", "allow_hosts": both}
        )
        sid = opened["result"]["session_id"]
        other = f"curl -sSf {lab.http_url('other.test', '/hello.txt')}"
        narrowed = await bash(client, sid, other, "n1", network_allow=[on_http(lab, "allowed.test")])
        widened = await bash(
            client, sid, f"curl -sSf {lab.http_url('sub.allowed.test', '/hello.txt')}", "n2", network_allow=["*.test"]
        )
        plain = await bash(client, sid, other, "n3")
        await client.call("session.close", {"session_id": sid})
    assert not narrowed["ok"] and "outside the allowlist this call narrowed" in narrowed["content"], narrowed
    assert not widened["ok"] and "refused (not-allowed)" in widened["content"], widened
    assert plain["ok"], plain


async def test_a_secret_added_to_a_running_session_reaches_its_next_command(
    lab: NetLab, workspace: Path, on_backend: str
) -> None:
    host = f"allowed.test:{lab.https_port}"
    secrets = {"LAB_TOKEN": {"from": "env:LAB_TOKEN", "hosts": [host], "as": "bearer"}}
    command = f'curl -sS -H "Authorization: Bearer $LAB_TOKEN" https://{host}/api/live'
    async with rpc_client.serve() as client:
        opened = await client.call(
            "session.open",
            {"workspace": str(workspace), "backend": on_backend, "mode": "auto", "allow_hosts": base_allow(lab)},
        )
        sid = opened["result"]["session_id"]
        await client.call("session.configure", {"session_id": sid, "secrets": secrets})
        result = await bash(client, sid, f"echo $LAB_TOKEN; {command}", "s1")
        await client.call("session.close", {"session_id": sid})
    placeholder, body = result["content"].splitlines()[:2]
    assert placeholder.startswith("SBX_PLACEHOLDER_") and lab.token not in result["content"], result
    assert json.loads(body)["ok"] is True, result
    [change] = AuditLog().network_changes(sid)
    assert change["change"]["secrets"] == {"LAB_TOKEN": {"hosts": [host], "as": "bearer"}}
    # Nothing the executor keeps (the audit, its WAL, changesets, caches) holds the value.
    kept = [path for path in data_dir().rglob("*") if path.is_file() and lab.token.encode() in path.read_bytes()]
    assert kept == []


async def test_an_allow_for_the_session_answer_is_kept_and_audited(
    lab: NetLab, workspace: Path, tmp_path: Path, on_backend: str
) -> None:
    profile = tmp_path / "ask.toml"
    profile.write_text('requires = []\n[network]\nmode = "allowlist"\nask = true\n')
    command = f"curl -sSf {lab.http_url('allowed.test', '/hello.txt')}"
    async with rpc_client.serve() as client:
        client.answer = {"decision": "allow-session"}
        opened = await client.call(
            "session.open",
            {
                "workspace": str(workspace),
                "backend": on_backend,
                "mode": "auto",
                "profile": str(profile),
                "allow_hosts": [f"{lab.address}:{port}" for port in sorted(set(lab.ports.values()))],
            },
        )
        sid = opened["result"]["session_id"]
        first = await bash(client, sid, command, "a1")
        second = await bash(client, sid, command, "a2")
        await client.call("session.close", {"session_id": sid})
    assert first["ok"] and second["ok"], (first, second)
    assert len(client.approvals) == 1  # the second connection needed no question
    [change] = AuditLog().network_changes(sid)
    assert (change["source"], change["change"]) == (
        "ask",
        {"allow": [on_http(lab, "allowed.test")], "tool_call_id": "a1"},
    )


async def test_the_users_network_list_reaches_a_running_session_from_its_next_command(
    lab: NetLab, workspace: Path, on_backend: str
) -> None:
    fetch = f"curl -sSf {lab.http_url('other.test', '/hello.txt')}"
    target = on_http(lab, "other.test")
    async with rpc_client.serve() as client:
        opened = await client.call(
            "session.open",
            {"workspace": str(workspace), "backend": on_backend, "mode": "auto", "allow_hosts": base_allow(lab)},
        )
        sid = opened["result"]["session_id"]
        before = await bash(client, sid, fetch, "u1")
        await anyio.run_process([SANDBOX, "policy", "network", "allow", target])
        after = await bash(client, sid, fetch, "u2")
        await anyio.run_process([SANDBOX, "policy", "network", "deny", target])
        denied = await bash(client, sid, fetch, "u3")  # deny wins over allow, as in a profile
        await anyio.run_process([SANDBOX, "policy", "network", "remove", target])
        await client.call("session.close", {"session_id": sid})
    assert not before["ok"] and "refused (not-allowed)" in before["content"], before
    assert after["ok"] and HELLO.decode().strip() in after["content"], after
    assert not denied["ok"] and "refused (denied)" in denied["content"], denied
    changes = [c for c in AuditLog().network_changes(sid) if c["source"] == "user-list"]
    assert [(target in c["change"]["allow"], target in c["change"]["deny"]) for c in changes] == [
        (True, False),
        (True, True),
    ]


async def test_a_users_list_the_session_cannot_take_fails_each_command_until_it_can(
    lab: NetLab, workspace: Path, on_backend: str, data_dir: Path
) -> None:
    """Fail closed: a list it cannot read is never passed over, so a deny added with it is not lost."""
    fetch = f"curl -sSf {lab.http_url('allowed.test', '/hello.txt')}"
    listed = data_dir / "policy" / "network.json"
    async with rpc_client.serve() as client:
        opened = await client.call(
            "session.open",
            {"workspace": str(workspace), "backend": on_backend, "mode": "auto", "allow_hosts": base_allow(lab)},
        )
        sid = opened["result"]["session_id"]
        listed.parent.mkdir(parents=True, exist_ok=True)
        listed.write_text(json.dumps({"allow": ["not a host"], "deny": [on_http(lab, "allowed.test")]}))
        first = await bash(client, sid, fetch, "f1")
        second = await bash(client, sid, fetch, "f2")
        listed.write_text(json.dumps({"deny": [on_http(lab, "allowed.test")]}))
        third = await bash(client, sid, fetch, "f3")
        await client.call("session.close", {"session_id": sid})
    for refused in (first, second):
        assert not refused["ok"] and refused["error_code"] == "INVALID_ARGUMENT", refused
        assert "not a host" in refused["content"] and HELLO.decode().strip() not in refused["content"]
    assert not third["ok"] and "refused (denied)" in third["content"], third
