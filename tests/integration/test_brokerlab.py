"""The broker's endpoints in the test "internet" (:mod:`tests.brokerlab`) answer as the broker's tests expect.

The clients are the real ones, talking to a loopback lab directly, with no proxy: curl, git, and
``http.client`` for what curl does not show (a connection kept across a chunked body, a gzipped
git request). S3 requests are signed by a small signer written here, apart from the lab's
verifier, and by curl's own ``--aws-sigv4``.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import hmac
import http.client
import json
import os
import secrets
import ssl
import subprocess
import time
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import quote

import pytest

from sandbox.backends.environment import CA_VARIABLES
from tests.netlab import NetLab

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

TIMEOUT_S = 20.0
HOST = "allowed.test"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class Response(NamedTuple):
    status: int
    headers: dict[str, str]  # names lower-cased
    body: bytes


@pytest.fixture(scope="module")
def lab() -> Iterator[NetLab]:
    with NetLab(netns=False) as running:
        yield running


def direct_env(**extra: str) -> dict[str, str]:
    """The environment without proxy variables and CA bundles (the lab's CA is passed explicitly)."""
    drop = {*CA_VARIABLES, "SSL_CERT_DIR"}
    kept = {key: value for key, value in os.environ.items() if not key.lower().endswith("_proxy") and key not in drop}
    return kept | extra


def curl(lab: NetLab, path: str, *args: str) -> Response:
    """curl to ``https://allowed.test:PORT/PATH``, the name resolved to the lab, never by the host's DNS."""
    resolve = f"{HOST}:{lab.https_port}:{lab.address}"
    argv = ["curl", "-sS", "-i", "--max-time", str(TIMEOUT_S), "--noproxy", "*", "--cacert", str(lab.ca_file)]
    argv += ["--resolve", resolve, *args, lab.https_url(HOST, path)]
    result = subprocess.run(argv, capture_output=True, env=direct_env(), check=False)
    assert result.returncode == 0, result.stderr
    return parse_response(result.stdout)


def parse_response(raw: bytes) -> Response:
    head, _, body = raw.partition(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 1"):  # 100 Continue
        head, _, body = body.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return Response(int(status_line.split()[1]), headers, body)


def connection(lab: NetLab) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=str(lab.ca_file))  # the leaf names the lab's address too
    return http.client.HTTPSConnection(lab.address, lab.https_port, context=context, timeout=TIMEOUT_S)


def request(lab: NetLab, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Response:
    conn = connection(lab)
    try:
        conn.request(method, path, body, {"Host": f"{HOST}:{lab.https_port}", **(headers or {})})
        response = conn.getresponse()
        return Response(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        conn.close()


def journal_entries(lab: NetLab, path: str) -> list[dict[str, object]]:
    return [entry for entry in lab.log()["http"] if entry["path"] == path]


# -- the API, the echoes, the redirect ------------------------------------------------------------


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize("how", ["bearer", "header", "basic"])
def test_the_api_accepts_the_token_however_it_is_carried(lab: NetLab, how: str) -> None:
    header = {
        "bearer": f"Authorization: Bearer {lab.token}",
        "header": f"X-Api-Key: {lab.token}",
        "basic": f"Authorization: {basic('anyone', lab.token)}",
    }[how]
    response = curl(lab, "/api/v1/items?page=2", "-X", "PATCH", "-H", header, "--data", "{}")
    assert response.status == 200, response
    assert json.loads(response.body) == {"ok": True, "method": "PATCH", "path": "/api/v1/items?page=2", "auth": how}


@pytest.mark.parametrize(
    "header", [None, "Authorization: Bearer labtok-wrong", "X-Api-Key: ", "Authorization: Basic bm90IGJhc2U2NA=="]
)
def test_the_api_refuses_a_request_without_the_token(lab: NetLab, header: str | None) -> None:
    response = curl(lab, "/api/v1/items", *(["-H", header] if header else []))
    assert (response.status, response.headers["www-authenticate"]) == (401, "Bearer"), response
    assert json.loads(response.body) == {"ok": False}


def test_echo_shows_the_request_as_it_arrived(lab: NetLab) -> None:
    placeholder = "Bearer {{SANDBOX_SECRET_API}}"
    args = ["-X", "PUT", "-H", f"Authorization: {placeholder}", "-H", "X-Note: two  spaces", "--data-binary", "é\x01"]
    response = curl(lab, "/echo/some/where?q=1", *args)
    echo = json.loads(response.body)
    assert (echo["method"], echo["path"], echo["body"]) == (
        "PUT",
        "/echo/some/where?q=1",
        "é\x01".encode().decode("latin-1"),
    )
    assert ["Authorization", placeholder] in echo["headers"], echo
    assert ["X-Note", "two  spaces"] in echo["headers"], echo


def test_echo_auth_reflects_the_credential_in_the_body_and_a_header(lab: NetLab) -> None:
    response = curl(lab, "/echo-auth", "-H", f"Authorization: Bearer {lab.token}")
    assert json.loads(response.body) == f"Bearer {lab.token}"
    assert response.headers["x-echo-auth"] == f"Bearer {lab.token}"
    assert json.loads(curl(lab, "/echo-auth").body) is None


def test_redirect_points_where_it_is_asked_to(lab: NetLab) -> None:
    response = curl(lab, "/redirect?to=" + quote("https://other.test/echo?a=1", safe=""))
    assert (response.status, response.headers["location"], response.body) == (302, "https://other.test/echo?a=1", b"")


def test_a_chunked_body_arrives_whole_and_the_connection_serves_the_next_request(lab: NetLab) -> None:
    conn = connection(lab)
    try:
        host = {"Host": f"{HOST}:{lab.https_port}"}
        conn.request("POST", "/echo", iter([b"first ", b"", b"second"]), host, encode_chunked=True)
        first = json.loads(conn.getresponse().read())
        sock = conn.sock
        conn.request("GET", f"/api/x?{secrets.token_hex(4)}", headers=host | {"X-Api-Key": lab.token})
        second = conn.getresponse()
        assert (second.status, conn.sock) == (200, sock), "the second request needed a new connection"
        second.read()
    finally:
        conn.close()
    assert first["body"] == "first second"
    assert ["Transfer-Encoding", "chunked"] in first["headers"]


def test_the_journal_records_each_requests_authorization(lab: NetLab) -> None:
    path = f"/api/journal-{secrets.token_hex(4)}"
    curl(lab, path, "-H", "Authorization: Bearer {{PLACEHOLDER}}")
    curl(lab, path)
    assert [(e["code"], e["authorization"]) for e in journal_entries(lab, path)] == [
        (401, "Bearer {{PLACEHOLDER}}"),
        (401, None),
    ]


# -- git ------------------------------------------------------------------------------------------


def git(lab: NetLab, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """git with no configuration of this machine, the lab's CA, ``allowed.test`` resolved to the lab."""
    env = direct_env(
        HOME=str(cwd),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_SSL_CAINFO=str(lab.ca_file),
        GIT_TERMINAL_PROMPT="0",
        GIT_AUTHOR_NAME="test",
        GIT_AUTHOR_EMAIL="test@example.invalid",
        GIT_COMMITTER_NAME="test",
        GIT_COMMITTER_EMAIL="test@example.invalid",
    )
    resolve = f"http.curloptResolve={HOST}:{lab.https_port}:{lab.address}"
    argv = ["git", "-c", resolve, *args]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def with_credentials(url: str, user: str, password: str) -> str:
    return url.replace("https://", f"https://{user}:{password}@", 1)


def clone_and_commit(lab: NetLab, tmp_path: Path, content: bytes = b"from the test\n") -> tuple[Path, str]:
    result = git(lab, tmp_path, "clone", "-q", lab.private_git_url, "clone")
    assert result.returncode == 0, result.stderr
    work = tmp_path / "clone"
    (work / "pushed.txt").write_bytes(content)
    assert git(lab, work, "add", "pushed.txt").returncode == 0
    assert git(lab, work, "commit", "-q", "-m", "pushed").returncode == 0
    return work, git(lab, work, "rev-parse", "HEAD").stdout.strip()


def remote_branch(lab: NetLab, cwd: Path, branch: str) -> str:
    result = git(lab, cwd, "ls-remote", lab.private_git_url, f"refs/heads/{branch}")
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\t")[0]


@pytest.mark.parametrize("url", ["private_git_url", "other_git_url"])
def test_anyone_may_clone_the_repositories(lab: NetLab, tmp_path: Path, url: str) -> None:
    result = git(lab, tmp_path, "clone", "-q", getattr(lab, url), "clone")
    assert result.returncode == 0, result.stderr
    head = git(lab, tmp_path / "clone", "rev-parse", "HEAD").stdout.strip()
    assert head == lab.private_git_head
    assert (tmp_path / "clone" / "README.md").is_file()


@pytest.mark.parametrize("size", [100, 3 * 1024 * 1024], ids=["small", "chunked"])  # git chunks over 1 MiB
def test_a_push_with_the_token_as_the_password_updates_the_repository(lab: NetLab, tmp_path: Path, size: int) -> None:
    work, commit = clone_and_commit(lab, tmp_path, os.urandom(size))
    branch = f"pushed-{secrets.token_hex(4)}"
    result = git(lab, work, "push", "-q", with_credentials(lab.private_git_url, "x", lab.token), f"HEAD:{branch}")
    assert result.returncode == 0, result.stderr
    assert remote_branch(lab, work, branch) == commit


@pytest.mark.parametrize("password", [None, "labtok-wrong"])
def test_a_push_without_the_token_is_refused(lab: NetLab, tmp_path: Path, password: str | None) -> None:
    work, _ = clone_and_commit(lab, tmp_path)
    url = lab.private_git_url if password is None else with_credentials(lab.private_git_url, "x", password)
    branch = f"refused-{secrets.token_hex(4)}"
    result = git(lab, work, "push", "-q", url, f"HEAD:{branch}")
    assert result.returncode != 0, result.stderr
    assert remote_branch(lab, work, branch) == ""
    refusals = journal_entries(lab, "/private.git/info/refs?service=git-receive-pack")
    assert refusals and refusals[-1]["code"] == 401


def test_a_gzipped_git_request_is_served(lab: NetLab) -> None:
    ls_refs = b"0014command=ls-refs\n0000"
    headers = {
        "Content-Type": "application/x-git-upload-pack-request",
        "Content-Encoding": "gzip",
        "Git-Protocol": "version=2",
    }
    response = request(lab, "POST", "/private.git/git-upload-pack", gzip.compress(ls_refs), headers)
    assert response.status == 200, response
    assert f"{lab.private_git_head} refs/heads/main".encode() in response.body


# -- S3 -------------------------------------------------------------------------------------------


def sigv4_headers(
    lab: NetLab,
    method: str,
    target: str,
    body: bytes,
    *,
    key_id: str | None = None,
    secret: str | None = None,
    payload: str | None = None,
) -> dict[str, str]:
    """Headers signing the request as an S3 client does; ``target`` is already percent-encoded."""
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    scope = f"{amz_date[:8]}/eu-west-3/s3/aws4_request"
    payload = payload or hashlib.sha256(body).hexdigest()
    signed = {"host": f"{HOST}:{lab.https_port}", "x-amz-content-sha256": payload, "x-amz-date": amz_date}
    path, _, query = target.partition("?")
    names = ";".join(sorted(signed))
    lines = "".join(f"{name}:{signed[name]}\n" for name in sorted(signed))
    canonical = f"{method}\n{path}\n{'&'.join(sorted(query.split('&'))) if query else ''}\n{lines}\n{names}\n{payload}"
    to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = ("AWS4" + (secret or lab.aws_secret)).encode()
    for part in scope.split("/"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    credential = f"{key_id or lab.aws_key_id}/{scope}"
    authorization = f"AWS4-HMAC-SHA256 Credential={credential}, SignedHeaders={names}, Signature={signature}"
    return {"Authorization": authorization, "X-Amz-Date": amz_date, "X-Amz-Content-Sha256": payload}


def object_path() -> str:
    return "/s3/bucket/" + quote(f"dir/a file+{secrets.token_hex(4)}é.txt", safe="/-_.~")


@pytest.mark.parametrize("payload", [None, "UNSIGNED-PAYLOAD"])
def test_a_signed_put_is_stored_and_a_signed_get_returns_it(lab: NetLab, payload: str | None) -> None:
    path, body = object_path(), os.urandom(2000)
    put = request(lab, "PUT", path, body, sigv4_headers(lab, "PUT", path, body, payload=payload))
    assert put.status == 200, put
    target = f"{path}?x-id=GetObject&partNumber=1"
    got = request(lab, "GET", target, headers=sigv4_headers(lab, "GET", target, b""))
    assert (got.status, got.body) == (200, body)


def test_a_missing_object_is_not_found(lab: NetLab) -> None:
    path = object_path()
    assert request(lab, "GET", path, headers=sigv4_headers(lab, "GET", path, b"")).status == 404


@pytest.mark.parametrize("fault", ["secret", "key id", "body", "date", "no signature"])
def test_a_put_not_signed_with_the_labs_key_is_refused(lab: NetLab, fault: str) -> None:
    path, body = object_path(), b"the real body"
    headers = sigv4_headers(
        lab,
        "PUT",
        path,
        body,
        secret=lab.aws_secret[::-1] if fault == "secret" else None,
        key_id="AKIDLAB000000000000" if fault == "key id" else None,
    )
    if fault == "date":
        del headers["X-Amz-Date"]
    if fault == "no signature":
        headers = {"X-Amz-Content-Sha256": EMPTY_SHA256}
    sent = b"another body" if fault == "body" else body
    response = request(lab, "PUT", path, sent, headers)
    assert response.status == 403, response
    assert b"<Code>SignatureDoesNotMatch</Code>" in response.body
    assert request(lab, "GET", path, headers=sigv4_headers(lab, "GET", path, b"")).status == 404


def test_curls_own_sigv4_signer_is_accepted(lab: NetLab) -> None:
    path, body = object_path(), b"signed by curl"
    sign = ["--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"{lab.aws_key_id}:{lab.aws_secret}"]
    # curl signs X-Amz-Content-Sha256 when given it, and S3 insists on the header.
    content = f"X-Amz-Content-Sha256: {hashlib.sha256(body).hexdigest()}"
    put = curl(lab, path, *sign, "-X", "PUT", "--data-binary", body.decode(), "-H", content)
    assert put.status == 200, put
    # The query in canonical order: curl 7.88 signs it as written, S3 (and the lab) sorted.
    got = curl(lab, f"{path}?A=2&a=1", *sign, "-H", f"X-Amz-Content-Sha256: {EMPTY_SHA256}")
    assert (got.status, got.body) == (200, body)
