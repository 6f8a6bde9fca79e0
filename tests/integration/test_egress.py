"""``network.mode = "allowlist"`` by attack and by use, on bubblewrap and Docker.

The "internet" is :class:`tests.netlab.NetLab`: as root a network namespace of the test's own
behind a veth pair (HTTP, HTTPS with a throw-away CA, DNS, a package index, a git repository),
as an ordinary user the same servers on a loopback address. The proxy resolves names with the
lab's DNS (``SANDBOX_NET_RESOLVER``); nothing here reaches anything else.

The lab's addresses are private (``10.213.x.x``) or loopback, so each policy allows the lab's
address explicitly besides the names: a name resolving to a private address is otherwise refused
(the DNS-rebinding defence), which is what ``rebind.test`` and ``metadata.test`` check.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio
import pytest

from sandbox import exec as executor
from sandbox import profile as profiles
from sandbox.audit import AuditLog
from sandbox.backends.environment import CA_VARIABLES
from sandbox.errors import BackendUnavailable
from sandbox.policy.approvals import CallbackApprover
from sandbox.session import Sandbox
from tests import netlab, rpc_client
from tests.conftest import backend_or_skip, landlock_or_skip, make_profile, own_like_a_checkout
from tests.netlab import HELLO, NetLab

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator, Mapping
    from pathlib import Path

    from sandbox.backends import base

pytestmark = pytest.mark.anyio

BACKENDS = [
    pytest.param("bwrap", marks=pytest.mark.bwrap),
    pytest.param("docker", marks=pytest.mark.docker),
    pytest.param("landlock", marks=pytest.mark.landlock),
    pytest.param("microvm", marks=[pytest.mark.microvm, pytest.mark.slow]),
]


@pytest.fixture(scope="module")
def lab() -> Iterator[NetLab]:
    with NetLab() as running:  # a namespace of its own as root, loopback otherwise
        yield running


@pytest.fixture(autouse=True)
def lab_dns(lab: NetLab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy resolves with the lab's DNS and chains to no upstream proxy of this machine."""
    netlab.resolve_in(lab, monkeypatch)


@pytest.fixture(params=BACKENDS)
def net_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> base.Backend:
    if request.param == "landlock":
        return landlock_or_skip(monkeypatch)
    return backend_or_skip(request.param)


def lab_address(lab: NetLab) -> list[str]:
    """The lab's own address on each of its ports: what the rebinding defence needs named."""
    return [f"{lab.address}:{port}" for port in sorted(set(lab.ports.values()))]


def on_ports(lab: NetLab, name: str) -> list[str]:
    return [f"{name}:{port}" for port in sorted({lab.http_port, lab.https_port})]


Opener: TypeAlias = "Callable[..., Any]"


@pytest.fixture
def ca_env(workspace: Path, lab: NetLab) -> dict[str, str]:
    """The lab's CA, copied where the jail sees it (the workspace), named by every client's variable."""
    ca = workspace / "lab-ca.crt"  # not *.pem: the jail masks those (sandbox/backends/seal.py)
    shutil.copyfile(lab.ca_file, ca)
    ca.chmod(0o644)
    return dict.fromkeys(CA_VARIABLES, str(ca))


@pytest.fixture
async def allowlist_jail(net_backend: base.Backend, workspace: Path) -> AsyncIterator[Opener]:
    opened: list[base.Jail] = []
    own_like_a_checkout(workspace, net_backend.name)

    async def factory(allow: list[str], deny: list[str] | None = None, **more: Any) -> base.Jail:
        profile = make_profile(
            "default",
            **{"network.mode": "allowlist", "network.allow": allow, "network.deny": deny or [], **more},
        )
        jail = await net_backend.open_jail(workspace, profile)
        opened.append(jail)
        return jail

    yield factory
    for jail in opened:
        await jail.aclose()


async def sh(
    jail: base.Jail, script: str, env: Mapping[str, str], timeout: float = 60, **more: Any
) -> executor.ExecResult:
    return await executor.run(jail, ["bash", "-c", script], env=env, timeout=timeout, **more)


def denied(result: executor.ExecResult) -> list[tuple[str, int, str]]:
    assert result.network is not None
    return [(d["host"], d["port"], d["reason"]) for d in result.network["denials"]]


async def fetched_then_refused(
    jail: base.Jail, allowed: str, refused: str, env: Mapping[str, str]
) -> executor.ExecResult:
    """curl ``allowed`` then ``refused`` in one call; the first must arrive and the second be refused."""
    result = await sh(jail, f"curl -sSf {allowed} && echo fetched; curl -sSf {refused} || echo refused", env)
    assert "fetched" in result.stdout and "refused" in result.stdout, result
    return result


def allowing(lab: NetLab, name: str) -> list[str]:
    """``name`` on the lab's HTTP and HTTPS ports, and the lab's own address (see lab_address)."""
    return [*on_ports(lab, name), *lab_address(lab)]


@pytest.fixture
async def allowed_jail(allowlist_jail: Opener, lab: NetLab) -> base.Jail:
    """A jail whose allowlist names ``allowed.test``: what most of these tests need."""
    jail: base.Jail = await allowlist_jail(allowing(lab, "allowed.test"))
    return jail


# -- what an allowlist lets through --------------------------------------------------------------


async def test_allowed_hosts_work_for_curl_urllib_pip_and_git(
    allowed_jail: base.Jail, lab: NetLab, ca_env: dict[str, str]
) -> None:
    result = await sh(
        allowed_jail,
        f"curl -sSf {lab.http_url('allowed.test', '/hello.txt')} && "
        f"curl -sSf {lab.https_url('allowed.test', '/hello.txt')} && "
        f"python3 -c 'import sys, urllib.request as u; print(u.urlopen(sys.argv[1]).read().decode())' "
        f"{lab.https_url('allowed.test', '/hello.txt')} && "
        f'T="${{TMPDIR:-/tmp}}"; python3 -m pip download --quiet --no-deps --dest "$T/dl" --index-url {lab.index_url} '
        f'labpkg && ls "$T/dl" && git clone --quiet {lab.git_url} "$T/repo" && git -C "$T/repo" rev-parse HEAD',
        ca_env,
    )
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines.count(HELLO.decode().strip()) == 3, result.stdout
    assert any(line.startswith("labpkg-") and line.endswith(".whl") for line in lines), result.stdout
    assert lines[-1] == lab.git_head
    assert denied(result) == []


async def test_a_long_download_arrives_whole(allowed_jail: base.Jail, lab: NetLab, ca_env: dict[str, str]) -> None:
    result = await sh(
        allowed_jail, f"curl -sSf {lab.https_url('allowed.test', '/big.bin')} | sha256sum", ca_env, timeout=120
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split()[0] == lab.big_sha256


# -- what it refuses, and how it says so ---------------------------------------------------------


async def test_a_host_not_on_the_list_is_refused_with_a_denial(
    allowed_jail: base.Jail, lab: NetLab, ca_env: dict[str, str]
) -> None:
    result = await sh(
        allowed_jail,
        f"curl -sSf {lab.http_url('other.test', '/hello.txt')}; echo curl=$?; "
        f"curl -sSf {lab.https_url('other.test', '/hello.txt')}; echo curl=$?",
        ca_env,
    )
    statuses = result.stdout.split()
    assert len(statuses) == 2 and "curl=0" not in statuses, result  # 22 (HTTP 403), or 56 for a refused CONNECT
    assert denied(result) == [
        ("other.test", lab.http_port, "not-allowed"),
        ("other.test", lab.https_port, "not-allowed"),
    ]
    assert result.network is not None
    denial = result.network["denials"][0]
    assert denial["rule"] is None and "other.test" in denial["line"]
    assert result.stderr.count("403") == 2  # curl's own error output is left intact


async def test_a_wildcard_covers_subdomains_only(allowlist_jail: Opener, lab: NetLab, ca_env: dict[str, str]) -> None:
    jail = await allowlist_jail(allowing(lab, "*.allowed.test"))
    sub, apex = lab.http_url("sub.allowed.test", "/hello.txt"), lab.http_url("allowed.test", "/hello.txt")
    result = await fetched_then_refused(jail, sub, apex, ca_env)
    assert denied(result) == [("allowed.test", lab.http_port, "not-allowed")]


async def test_deny_wins_over_allow(allowlist_jail: Opener, lab: NetLab, ca_env: dict[str, str]) -> None:
    jail = await allowlist_jail(allowing(lab, "*.allowed.test"), deny=on_ports(lab, "sub.allowed.test"))
    result = await sh(jail, f"curl -sSf {lab.http_url('sub.allowed.test', '/hello.txt')} || echo refused", ca_env)
    assert "refused" in result.stdout
    assert [r for _, _, r in denied(result)] == ["denied"]


async def test_ip_literals_and_ports_are_exact(allowlist_jail: Opener, lab: NetLab, ca_env: dict[str, str]) -> None:
    jail = await allowlist_jail([f"{lab.address}:{lab.http_port}"])
    ip, other_port = lab.http_url(None, "/hello.txt"), lab.http_url(None, "/hello.txt", port=lab.alt_port)
    result = await fetched_then_refused(jail, ip, other_port, ca_env)
    assert [(h, p) for h, p, _ in denied(result)] == [(lab.address, lab.alt_port)]


async def test_names_that_rebind_to_loopback_or_metadata_are_refused(
    allowlist_jail: Opener, lab: NetLab, ca_env: dict[str, str]
) -> None:
    jail = await allowlist_jail(["rebind.test", "metadata.test", *lab_address(lab)])
    result = await sh(
        jail, "curl -sSf http://rebind.test/ || echo r1; curl -sSf http://metadata.test/latest/ || echo r2", ca_env
    )
    assert "r1" in result.stdout and "r2" in result.stdout, result
    reasons = {host: reason for host, _, reason in denied(result)}
    assert reasons == {"rebind.test": "private-address", "metadata.test": "private-address"}, reasons


# -- no other way out ----------------------------------------------------------------------------


async def test_raw_sockets_dev_tcp_and_dns_find_no_route(
    allowed_jail: base.Jail, lab: NetLab, ca_env: dict[str, str]
) -> None:
    probe = (
        "import socket, sys\n"
        f"addr = ({lab.address!r}, {lab.http_port})\n"
        "out = []\n"
        "try:\n"
        "    socket.create_connection(addr, timeout=3); out.append('tcp-open')\n"
        "except OSError as e: out.append('tcp-' + type(e).__name__)\n"
        "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "try:\n"
        f"    u.sendto(b'x', ({lab.dns[0]!r}, {lab.dns[1]})); u.settimeout(2); u.recv(10); out.append('udp-open')\n"
        "except OSError as e: out.append('udp-' + type(e).__name__)\n"
        "try:\n"
        "    socket.getaddrinfo('allowed.test', 80); out.append('dns-open')\n"
        "except OSError as e: out.append('dns-' + type(e).__name__)\n"
        "print(' '.join(out))\n"
    )
    script = f'python3 -c "$PROBE"; (exec 3<>/dev/tcp/{lab.address}/{lab.http_port}) 2>/dev/null && echo devtcp-open'
    result = await sh(allowed_jail, f"{script} || echo devtcp-refused", {**ca_env, "PROBE": probe})
    assert "open" not in result.stdout.replace("devtcp-refused", ""), result
    assert "devtcp-refused" in result.stdout


# -- the proxy's death ---------------------------------------------------------------------------


async def test_the_proxy_dying_mid_call_fails_the_call_and_opens_nothing(
    allowed_jail: base.Jail, lab: NetLab, ca_env: dict[str, str]
) -> None:
    egress = allowed_jail.egress
    assert egress is not None
    reading = (
        "import sys, urllib.request as u\n"
        f"r = u.urlopen({lab.http_url('allowed.test', '/big.bin')!r})\n"
        "got = len(r.read(1 << 16)); print('started', flush=True)\n"
        # The rest waits until the proxy is surely stopped: 64 MiB over loopback outruns a stop
        # (CI once saw the whole download arrive first), and the buffers hold far less than that.
        "import time; time.sleep(3)\n"
        "try:\n"
        "    while chunk := r.read(1 << 16): got += len(chunk)\n"
        "except Exception as e: print('broken', type(e).__name__, flush=True); sys.exit(3)\n"
        "print('got', got); sys.exit(0 if got == int(sys.argv[1]) else 4)\n"
    )
    started = anyio.Event()

    async def on_stdout(chunk: bytes) -> None:
        if b"started" in chunk:
            await anyio.to_thread.run_sync(egress.stop)  # the proxy dies with the download under way
            started.set()

    result = await executor.run(
        allowed_jail,
        ["bash", "-c", 'python3 -c "$READ" "$SIZE"'],
        env={**ca_env, "READ": reading, "SIZE": str(lab.big_size)},
        on_stdout=on_stdout,
        timeout=60,
    )
    assert started.is_set(), result
    assert result.exit_code != 0, result
    with pytest.raises(BackendUnavailable, match="egress proxy has stopped"):
        await sh(allowed_jail, f"curl -sS {lab.http_url('allowed.test', '/hello.txt')}", ca_env)


# -- through sandbox serve: denials as they happen, the audit, asking for new hosts --------------


@pytest.mark.bwrap
async def test_serve_streams_each_denial_and_the_audit_keeps_it(lab: NetLab, workspace: Path) -> None:
    backend_or_skip("bwrap")
    async with rpc_client.serve() as client:
        opened = await client.call(
            "session.open",
            {
                "workspace": str(workspace),
                "backend": "bwrap",
                "mode": "auto",
                "allow_hosts": allowing(lab, "allowed.test"),
            },
        )
        sid = opened["result"]["session_id"]
        command = f"curl -sSf {lab.http_url('other.test', '/hello.txt')}"
        reply = await client.call(
            "tool.call", {"session_id": sid, "tool": "Bash", "args": {"command": command}, "tool_call_id": "c1"}
        )
        result = reply["result"]
        assert not result["ok"]
        line = f"sandbox: connection to other.test:{lab.http_port} refused (not-allowed)"
        assert line in result["content"], result["content"]  # one readable line for the model
        assert "curl: (22)" in result["content"]  # and the tool's own error, intact
        denied_events = [e["params"] for e in client.events if e["method"] == "network.denied"]
        assert [(e["host"], e["port"], e["reason"], e["tool_call_id"]) for e in denied_events] == [
            ("other.test", lab.http_port, "not-allowed", "c1")
        ]
        await client.call("session.close", {"session_id": sid})
    rows = AuditLog().denials(sid)
    assert [(r["host"], r["port"], r["reason"], r["tool_call_id"]) for r in rows] == [
        ("other.test", lab.http_port, "not-allowed", "c1")
    ]


def ask_profile(tmp_path: Path, timeout_s: int = 120) -> Path:
    path = tmp_path / "ask.toml"
    path.write_text(
        f'requires = []\n[network]\nmode = "allowlist"\nask = true\n[policy]\napproval_timeout_s = {timeout_s}\n'
    )
    return path


@pytest.mark.parametrize(
    ("answer", "reason"),
    [({"decision": "allow-once"}, None), ({"decision": "deny"}, "ask-denied")],
    ids=["allowed", "denied"],
)
async def test_an_unknown_host_is_put_to_the_client(
    net_backend: base.Backend, lab: NetLab, workspace: Path, tmp_path: Path, answer: dict[str, str], reason: str | None
) -> None:
    own_like_a_checkout(workspace, net_backend.name)
    async with rpc_client.serve() as client:
        client.answer = answer
        profile = ask_profile(tmp_path)
        opened = await client.call(
            "session.open",
            {
                "workspace": str(workspace),
                "backend": net_backend.name,
                "mode": "auto",
                "profile": str(profile),
                "allow_hosts": lab_address(lab),
            },
        )
        sid = opened["result"]["session_id"]
        command = f"curl -sSf {lab.http_url('allowed.test', '/hello.txt')}"
        reply = await client.call(
            "tool.call", {"session_id": sid, "tool": "Bash", "args": {"command": command}, "tool_call_id": "c2"}
        )
        result = reply["result"]
        await client.call("session.close", {"session_id": sid})
    [asked] = client.approvals
    assert (asked["tool"], asked["operation"], asked["resource"], asked["tool_call_id"]) == (
        "Network",
        "connect",
        f"allowed.test:{lab.http_port}",
        "c2",
    )
    if reason is None:
        assert result["ok"] and HELLO.decode().strip() in result["content"], result
    else:
        assert not result["ok"] and f"({reason})" in result["content"], result


@pytest.mark.bwrap
async def test_an_unanswered_question_times_out_and_no_ui_never_hangs(
    lab: NetLab, workspace: Path, tmp_path: Path
) -> None:
    backend_or_skip("bwrap")
    profile = profiles.load(str(ask_profile(tmp_path, timeout_s=1))).with_overrides(
        **{"network.allow": lab_address(lab)}
    )
    command = f"curl -sSf {lab.http_url('allowed.test', '/hello.txt')}"

    async def never(_request: Any) -> str:
        await anyio.sleep(3600)
        return "allow-once"

    async with Sandbox.open(workspace, profile=profile, approver=CallbackApprover(never), mode="auto") as box:
        slow = await box.call("Bash", {"command": command})
    assert not slow.ok and "(ask-timeout)" in slow.content, slow.content
    async with Sandbox.open(workspace, profile=profile, mode="auto") as box:  # unattended: nobody to ask
        alone = await box.call("Bash", {"command": command})
    assert not alone.ok and "(ask-unavailable)" in alone.content, alone.content


# -- transparent: programs that ignore the proxy variables (root: a veth pair per call) ----------

NO_PROXY_ENV = dict.fromkeys(("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"), "")


@pytest.fixture
async def transparent_jail(net_backend: base.Backend, workspace: Path, lab: NetLab) -> AsyncIterator[base.Jail]:
    if lab.loopback_only:
        pytest.skip("the transparent mode's tests need the namespace lab: root creates it (pyroute2)")
    backend = net_backend
    own_like_a_checkout(workspace, backend.name)
    missing = backend.probe().missing(
        (), make_profile("default", **{"network.mode": "allowlist", "network.transparent": True})
    )
    if missing:
        pytest.skip(f"no transparent network here: {missing}")
    profile = make_profile(
        "default",
        **{
            "network.mode": "allowlist",
            "network.transparent": True,
            "network.allow": [*on_ports(lab, "allowed.test"), *on_ports(lab, "*.allowed.test"), *lab_address(lab)],
        },
    )
    async with await backend.open_jail(workspace, profile) as jail:
        yield jail


@pytest.mark.root
async def test_transparent_filters_programs_that_ignore_the_proxy_variables(
    transparent_jail: base.Jail, lab: NetLab, ca_env: dict[str, str]
) -> None:
    script = (
        f"curl -sSf --noproxy '*' {lab.http_url('allowed.test', '/hello.txt')} && "
        f"curl -sSf --noproxy '*' {lab.https_url('allowed.test', '/hello.txt')} && "
        "python3 -c 'import socket; print(socket.gethostbyname(\"sub.allowed.test\"))' && "
        "{ python3 -c 'import socket; socket.gethostbyname(\"other.test\")' 2>/dev/null || echo other-unresolved; } && "
        f"{{ curl -sS --noproxy '*' -m 5 -H 'Host: other.test' {lab.http_url(None, '/hello.txt')} || true; }} && "
        f"{{ curl -sS --noproxy '*' -m 5 {lab.http_url(None, '/hello.txt', port=lab.alt_port)} 2>/dev/null "
        "|| echo alt-port-refused; }"
    )
    result = await sh(transparent_jail, script, {**ca_env, **NO_PROXY_ENV})
    lines = result.stdout.splitlines()
    assert lines[:2] == [HELLO.decode().strip()] * 2, result
    assert lines[2] == lab.address, result
    assert "other-unresolved" in lines and "alt-port-refused" in lines, result
    refused = {(host, port, reason) for host, port, reason in denied(result)}
    assert ("other.test", 53, "not-allowed") in refused, refused
    assert ("other.test", lab.http_port, "not-allowed") in refused, refused  # by its Host header


@pytest.mark.root
async def test_transparent_drops_other_udp_and_tcp(transparent_jail: base.Jail, lab: NetLab) -> None:
    probe = (
        "import socket\n"
        "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)\n"
        "try:\n"
        f"    u.sendto(b'x', ({lab.address!r}, 9999)); u.recv(10); print('udp-open')\n"
        "except OSError as e: print('udp-' + type(e).__name__)\n"
        "t = socket.socket(); t.settimeout(3)\n"
        f"print('tcp-' + str(t.connect_ex(({lab.address!r}, 22))))\n"
    )
    result = await sh(transparent_jail, 'python3 -c "$PROBE"', {"PROBE": probe, **NO_PROXY_ENV})
    assert result.exit_code == 0 and "open" not in result.stdout, result
    assert "tcp-0" not in result.stdout, result


@pytest.mark.bwrap
def test_sandbox_run_prints_and_audits_each_denial(lab: NetLab, workspace: Path) -> None:
    """The CLI's contract: --allow-host implies allowlist, the JSON names the network and its
    denials, the text mode adds one line per refused host, and the audit keeps them."""
    backend_or_skip("bwrap")
    allow = [arg for pattern in allowing(lab, "allowed.test") for arg in ("--allow-host", pattern)]
    run = [rpc_client.SANDBOX, "run", "--backend", "bwrap", "--workspace", str(workspace), *allow]
    command = ["--", "curl", "-sSf", lab.http_url("other.test", "/hello.txt")]
    as_json = subprocess.run([*run, "--json", *command], capture_output=True, text=True, check=False, timeout=60)
    out = json.loads(as_json.stdout)
    assert out["network"]["mode"] == "allowlist" and f"allowed.test:{lab.http_port}" in out["network"]["allow"]
    assert [(d["host"], d["reason"]) for d in out["network"]["denials"]] == [("other.test", "not-allowed")]
    text = subprocess.run([*run, *command], capture_output=True, text=True, check=False, timeout=60)
    assert text.returncode == 22
    assert f"sandbox: connection to other.test:{lab.http_port} refused (not-allowed)" in text.stderr, text.stderr
    audit = subprocess.run(
        [rpc_client.SANDBOX, "audit", "network", "--json"], capture_output=True, text=True, check=True, timeout=60
    )
    rows = json.loads(audit.stdout)["denials"]
    assert [(r["host"], r["reason"]) for r in rows] == [("other.test", "not-allowed")] * 2
    assert all(r["session_id"].startswith("run-") for r in rows)
