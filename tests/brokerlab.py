"""What an API, a git host and an S3 endpoint do, for the secret broker's tests: served by the lab.

:mod:`tests.netlab` mounts :class:`BrokerHandler` in front of its files, on every lab name, HTTP
and HTTPS alike; the secrets are made per lab (:meth:`Secrets.generate`) and handed to the lab's
server process in its configuration. Every response has a ``Content-Length`` (connections stay
open), and request bodies are read whole, framed by ``Content-Length`` or chunked encoding.

* ``/api`` and ``/api/...``, any method: 200 ``{"ok": true, "method", "path", "auth"}`` for the
  token as ``Authorization: Bearer``, ``X-Api-Key`` or the password of ``Authorization: Basic``
  (``auth`` says which: ``bearer``, ``header``, ``basic``); else 401 ``{"ok": false}``.
* ``/echo...``, any method: ``{"method", "path", "headers": [[name, value], ...], "body"}``, the
  request as it arrived (the body decoded as latin-1).
* ``/echo-auth``: the request's ``Authorization`` as a JSON string (``null`` without one), and
  again in the response header ``X-Echo-Auth``: a server that reflects the credential.
* ``/keep-auth`` keeps the request's ``Authorization``; ``/kept-auth`` shows the last one kept, to any
  request (a host that stores what it is sent and shows it later).
* ``/redirect?to=URL``: 302 to ``URL``.
* ``/s3/<bucket>/<key>``: PUT stores the body, GET (and HEAD) return it, each only when signed
  with AWS Signature Version 4 by the lab's key (:func:`verify_sigv4`); else 403
  ``SignatureDoesNotMatch``, with the reason as the error's message.
* ``/private.git`` and ``/other.git``: git's smart HTTP, by ``git http-backend``; anyone may fetch,
  a push needs ``Authorization: Basic`` whose password is the token, else 401.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import subprocess
import threading
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlsplit

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from email.message import Message
    from io import BufferedIOBase
    from pathlib import Path

REPOSITORIES = ("private.git", "other.git")
SIGV4 = "AWS4-HMAC-SHA256"
UNSIGNED = "UNSIGNED-PAYLOAD"
S3_REQUIRED = ("host", "x-amz-content-sha256", "x-amz-date")  # each must be signed, as S3 demands
MAX_LINE = 65536
CGI_TIMEOUT_S = 60.0
JSON = ("Content-Type", "application/json")
XML = ("Content-Type", "application/xml")
Headers = list[tuple[str, str]]


class Secrets(NamedTuple):
    """The lab's credentials: the API and git token, and an AWS access key."""

    token: str
    aws_key_id: str
    aws_secret: str

    @classmethod
    def generate(cls) -> Secrets:
        secret = base64.b64encode(os.urandom(30)).decode()  # 40 characters, '+' and '/' among them
        return cls(f"labtok-{secrets.token_hex(16)}", f"AKIDLAB{secrets.token_hex(6).upper()}", secret)


@dataclass
class Site:
    """The broker endpoints' state in the lab's server process."""

    secrets: Secrets
    git_root: str
    objects: dict[str, bytes] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    kept_auth: str | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Site:
        return cls(Secrets(**config["secrets"]), config["git_root"])


def site_config(lab_secrets: Secrets, git_root: Path) -> dict[str, Any]:
    """What :meth:`Site.from_config` rebuilds the site from, in the server process (JSON)."""
    return {"secrets": lab_secrets._asdict(), "git_root": str(git_root)}


# -- the handler ----------------------------------------------------------------------------------


class BrokerHandler(SimpleHTTPRequestHandler):
    """The broker endpoints in front of the files the base class serves."""

    protocol_version = "HTTP/1.1"
    site: ClassVar[Site]

    def do_GET(self) -> None:
        if not self.route():
            super().do_GET()

    def do_HEAD(self) -> None:
        if not self.route():
            super().do_HEAD()

    def do_POST(self) -> None:
        if not self.route():
            self.close_connection = True  # the body is left unread
            self.send_error(HTTPStatus.NOT_IMPLEMENTED, f"Unsupported method ({self.command!r})")

    do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_POST

    def route(self) -> bool:
        """Serve the request if it is for a broker endpoint; ``False`` leaves it to the base."""
        serve = self.endpoint(urlsplit(self.path).path)
        if serve is None:
            return False
        try:
            body = read_body(self.headers, self.rfile)
        except ValueError as exc:
            self.close_connection = True
            self.reply(HTTPStatus.BAD_REQUEST, f"{exc}\n".encode(), [("Content-Type", "text/plain")])
            return True
        serve(body)
        return True

    def endpoint(self, path: str) -> Callable[[bytes], None] | None:
        if path == "/api" or path.startswith("/api/"):
            return self.serve_api
        if path == "/echo-auth":
            return self.serve_echo_auth
        if path in ("/keep-auth", "/kept-auth"):
            return self.serve_kept_auth
        if path.startswith("/echo"):
            return self.serve_echo
        if path == "/redirect":
            return self.serve_redirect
        if path.startswith("/s3/"):
            return self.serve_s3
        if len(parts := path.split("/")) > 2 and parts[1] in REPOSITORIES:
            return self.serve_git
        return None

    def serve_api(self, _body: bytes) -> None:
        how = api_auth(self.headers, self.site.secrets.token)
        if how is None:
            self.reply_json(HTTPStatus.UNAUTHORIZED, {"ok": False}, [("WWW-Authenticate", "Bearer")])
        else:
            self.reply_json(HTTPStatus.OK, {"ok": True, "method": self.command, "path": self.path, "auth": how})

    def serve_echo(self, body: bytes) -> None:
        headers = [[name, value] for name, value in self.headers.items()]
        echo = {"method": self.command, "path": self.path, "headers": headers, "body": body.decode("latin-1")}
        self.reply_json(HTTPStatus.OK, echo)

    def serve_echo_auth(self, _body: bytes) -> None:
        value = self.headers.get("Authorization")
        self.reply_json(HTTPStatus.OK, value, [] if value is None else [("X-Echo-Auth", value)])

    def serve_kept_auth(self, _body: bytes) -> None:
        with self.site.lock:
            if self.path == "/keep-auth":
                self.site.kept_auth = self.headers.get("Authorization")
            kept = self.site.kept_auth
        self.reply_json(HTTPStatus.OK, kept)

    def serve_redirect(self, _body: bytes) -> None:
        target = parse_qs(urlsplit(self.path).query).get("to")
        if not target:
            self.reply(HTTPStatus.BAD_REQUEST, b"redirect needs ?to=URL\n", [("Content-Type", "text/plain")])
        else:
            self.reply(HTTPStatus.FOUND, b"", [("Location", target[0])])

    def serve_s3(self, body: bytes) -> None:
        lab = self.site.secrets
        why = verify_sigv4(self.command, self.path, self.headers, body, lab.aws_key_id, lab.aws_secret)
        if why is not None:
            self.reply(HTTPStatus.FORBIDDEN, s3_error("SignatureDoesNotMatch", why), [XML])
            return
        key = unquote(urlsplit(self.path).path.removeprefix("/s3/"))
        if self.command == "PUT":
            with self.site.lock:
                self.site.objects[key] = body
            self.reply(HTTPStatus.OK, b"", [("ETag", etag(body))])
            return
        if self.command not in ("GET", "HEAD"):
            self.reply(HTTPStatus.METHOD_NOT_ALLOWED, s3_error("MethodNotAllowed", self.command), [XML])
            return
        with self.site.lock:
            stored = self.site.objects.get(key)
        if stored is None:
            self.reply(HTTPStatus.NOT_FOUND, s3_error("NoSuchKey", key), [XML])
        else:
            self.reply(HTTPStatus.OK, stored, [("Content-Type", "application/octet-stream"), ("ETag", etag(stored))])

    def serve_git(self, body: bytes) -> None:
        target = urlsplit(self.path)
        push = target.path.endswith("/git-receive-pack") or "service=git-receive-pack" in target.query
        credentials = basic_credentials(self.headers.get("Authorization"))
        user = credentials[0] if credentials and same(credentials[1], self.site.secrets.token) else None
        if push and user is None:
            refusal = [("WWW-Authenticate", 'Basic realm="lab"'), ("Content-Type", "text/plain")]
            self.reply(HTTPStatus.UNAUTHORIZED, b"a push needs the lab's token\n", refusal)
            return
        env = self.cgi_env(unquote(target.path), target.query, len(body), user)
        try:
            result = subprocess.run(
                ["git", "http-backend"], input=body, env=env, capture_output=True, timeout=CGI_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            self.reply(HTTPStatus.GATEWAY_TIMEOUT, b"git http-backend timed out\n", [("Content-Type", "text/plain")])
            return
        status, headers, content = parse_cgi(result.stdout, result.stderr)
        self.reply(status, content, headers)

    def cgi_env(self, path: str, query: str, length: int, user: str | None) -> dict[str, str]:
        env = git_env(self.site.git_root) | {
            "GIT_PROJECT_ROOT": self.site.git_root,
            "GIT_HTTP_EXPORT_ALL": "1",
            "GATEWAY_INTERFACE": "CGI/1.1",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_LENGTH": str(length),
            "REMOTE_ADDR": str(self.client_address[0]),
        }
        # git gzips its fetch requests; http-backend inflates them itself when told the encoding.
        for variable, header in (("CONTENT_TYPE", "Content-Type"), ("HTTP_CONTENT_ENCODING", "Content-Encoding")):
            if value := self.headers.get(header):
                env[variable] = value
        if protocol := self.headers.get("Git-Protocol"):
            env["HTTP_GIT_PROTOCOL"] = protocol
        if user is not None:
            env["REMOTE_USER"] = user
        return env

    def reply(self, status: int, body: bytes, headers: Iterable[tuple[str, str]] = ()) -> None:
        """A whole response with its ``Content-Length``; no body for HEAD."""
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def reply_json(self, status: int, value: object, headers: Headers | None = None) -> None:
        self.reply(status, json.dumps(value).encode(), [JSON, *(headers or [])])


# -- requests -------------------------------------------------------------------------------------


def read_body(headers: Message, stream: BufferedIOBase) -> bytes:
    """The request's body, by ``Content-Length`` or chunked (which the base class leaves to us)."""
    if headers.get("Transfer-Encoding", "").strip().lower() == "chunked":
        return read_chunked(stream)
    length = int(headers.get("Content-Length") or 0)
    if length < 0:
        raise ValueError("negative Content-Length")
    body = stream.read(length)
    if len(body) != length:
        raise ValueError("the body ended early")
    return body


def read_chunked(stream: BufferedIOBase) -> bytes:
    chunks: list[bytes] = []
    while size := int(stream.readline(MAX_LINE).partition(b";")[0].strip(), 16):  # ValueError at EOF
        chunk = stream.read(size)
        if len(chunk) != size or stream.readline(MAX_LINE).strip():
            raise ValueError("a chunk ended early or had trailing bytes")
        chunks.append(chunk)
    while (trailer := stream.readline(MAX_LINE)).strip():
        pass
    if not trailer:
        raise ValueError("the chunked body ended early")
    return b"".join(chunks)


def same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def basic_credentials(value: str | None) -> tuple[str, str] | None:
    """``(user, password)`` of an ``Authorization: Basic`` value; ``None`` for any other."""
    scheme, _, encoded = (value or "").strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, colon, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except ValueError:  # binascii.Error and UnicodeDecodeError both are
        return None
    return (user, password) if colon else None


def api_auth(headers: Message, token: str) -> str | None:
    """How the request carries ``token`` (``bearer``, ``header``, ``basic``), or ``None``."""
    scheme, _, value = headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and same(value.strip(), token):
        return "bearer"
    if same(headers.get("X-Api-Key", "").strip(), token):
        return "header"
    credentials = basic_credentials(headers.get("Authorization"))
    return "basic" if credentials and same(credentials[1], token) else None


# -- S3: Signature Version 4 ----------------------------------------------------------------------


def verify_sigv4(method: str, target: str, headers: Message, body: bytes, key_id: str, secret: str) -> str | None:
    """``None`` when the request is signed with ``key_id`` and ``secret`` (header form), else why not."""
    algorithm, _, rest = headers.get("Authorization", "").strip().partition(" ")
    fields = {name: value for name, _, value in (part.strip().partition("=") for part in rest.split(","))}
    scope = fields.get("Credential", "").split("/")
    if algorithm != SIGV4 or len(scope) != 5 or not fields.get("SignedHeaders") or not fields.get("Signature"):
        return f"not an {SIGV4} Authorization header"
    if not same(scope[0], key_id):
        return "unknown access key id"
    if scope[3:] != ["s3", "aws4_request"]:
        return "the credential's scope is not s3/aws4_request"
    amz_date, payload = headers.get("X-Amz-Date", ""), headers.get("X-Amz-Content-Sha256", "")
    if not amz_date.startswith(scope[1]) or len(amz_date) != 16:
        return "X-Amz-Date is missing or not the credential's date"
    if payload != UNSIGNED and payload != hashlib.sha256(body).hexdigest():
        return "X-Amz-Content-Sha256 is missing or not the body's"
    signed = fields["SignedHeaders"].split(";")
    if unsigned := [name for name in S3_REQUIRED if name not in signed]:
        return f"not signed: {', '.join(unsigned)}"
    if missing := [name for name in signed if headers.get(name) is None]:
        return f"signed but absent: {', '.join(missing)}"
    canonical = canonical_request(method, target, headers, signed, payload)
    to_sign = "\n".join([SIGV4, amz_date, "/".join(scope[1:]), sha256_hex(canonical.encode())])
    key = signing_key(secret, *scope[1:4])
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return None if same(fields["Signature"], expected) else "the signature does not match"


def canonical_request(method: str, target: str, headers: Message, signed: list[str], payload: str) -> str:
    path, _, query = target.partition("?")
    uri = "/".join(aws_quote(unquote(segment)) for segment in path.split("/"))
    pairs = sorted((aws_quote(unquote(name)), aws_quote(unquote(value))) for name, _, value in params(query))
    canonical_query = "&".join(f"{name}={value}" for name, value in pairs if name)
    lines = [f"{name}:{','.join(' '.join(v.split()) for v in headers.get_all(name, []))}\n" for name in signed]
    return "\n".join([method, uri, canonical_query, "".join(lines), ";".join(signed), payload])


def params(query: str) -> list[tuple[str, str, str]]:
    return [item.partition("=") for item in query.split("&")]


def aws_quote(text: str) -> str:
    """Percent-encoding as SigV4 does it: everything but ``A-Za-z0-9-_.~``."""
    return quote(text, safe="-_.~")


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def s3_error(code: str, message: str) -> bytes:
    return f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()


def etag(body: bytes) -> str:
    return f'"{hashlib.md5(body, usedforsecurity=False).hexdigest()}"'


# -- git ------------------------------------------------------------------------------------------


def git_env(home: str) -> dict[str, str]:
    """git with no configuration but the repository's: none of the machine's or the user's."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "netlab",
        "GIT_AUTHOR_EMAIL": "netlab@allowed.test",
        "GIT_COMMITTER_NAME": "netlab",
        "GIT_COMMITTER_EMAIL": "netlab@allowed.test",
    }


def write_git_host(root: Path) -> str:
    """The bare repositories of :data:`REPOSITORIES` under ``root``, each one commit on ``main`` (the
    same) and open to pushes over smart HTTP; returns the commit's id."""
    work = root / "work"
    work.mkdir(parents=True)

    def git(*args: str, cwd: Path = work) -> str:
        env = git_env(str(root))
        return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout

    git("init", "-q", "-b", "main")
    (work / "README.md").write_text("# served by the lab's git host\n")
    git("add", "README.md")
    git("commit", "-q", "-m", "first")
    for name in REPOSITORIES:
        git("clone", "-q", "--bare", str(work), str(root / name))
        git("config", "http.receivepack", "true", cwd=root / name)
    return git("rev-parse", "HEAD").strip()


def parse_cgi(output: bytes, errors: bytes) -> tuple[int, Headers, bytes]:
    """``(status, headers, body)`` of a CGI script's output; 502 with its stderr when it wrote none."""
    ends = [(at, len(sep)) for sep in (b"\r\n\r\n", b"\n\n") if (at := output.find(sep)) >= 0]
    if not ends:
        return HTTPStatus.BAD_GATEWAY, [("Content-Type", "text/plain")], errors or b"no CGI headers\n"
    at, length = min(ends)
    status: int = HTTPStatus.OK
    headers: Headers = []
    for line in output[:at].decode("latin-1").splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() == "status":
            status = int(value.split()[0])
        elif name.strip().lower() != "content-length":
            headers.append((name.strip(), value.strip()))
    return status, headers, output[at + length :]
