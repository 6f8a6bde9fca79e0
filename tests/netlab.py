"""A hermetic "internet" for the network tests: web, TLS, DNS, a package index and a git remote.

:class:`NetLab` builds everything at run time in a private directory and serves it from one child
process, so no test reaches anything but loopback and the namespace the lab itself creates:

* **As root** (``lab.loopback_only is False``): a network namespace (``sbxlab-<pid>-<hex>``)
  joined to the host by a veth pair created with pyroute2 in a free ``10.213.X.0/24``; the host
  side is ``.1`` (``lab.peer_address``), the lab ``.2`` (``lab.address``). The servers listen
  there on their usual ports: HTTP 80, HTTPS 443, HTTP 8080 (a non-standard port), DNS 53.
* **As an ordinary user** (``lab.loopback_only is True``): the same servers on a random
  ``127.213.X.Y`` on loopback, each on a free port; the DNS maps the lab's names to that address.
  A filtering proxy refuses loopback destinations unless allowed, so such tests allow the
  address explicitly.

What is served (every name gets the same content, HTTP and HTTPS alike):

* ``/hello.txt`` (:data:`HELLO`), ``/big.bin`` (64 MiB, ``lab.big_sha256``), ``/whoami`` (JSON:
  the request's Host, the TLS SNI, the client's address), ``/_lab/log`` (JSON: every request and
  DNS query the lab saw, which lets a test show that a denied connection never arrived).
* ``/simple/`` -- a PEP 503 index holding one pure-Python wheel, ``labpkg`` 0.1.0, built here.
* ``/repo.git`` -- a git repository over dumb HTTP, one commit (``lab.git_head``).
* What an API, a git host and an S3 endpoint do, for the secret broker's tests: :mod:`tests.brokerlab`
  (``/api``, ``/echo``, ``/echo-auth``, ``/redirect``, ``/s3/``, ``/private.git``, ``/other.git``),
  with the lab's own secrets: ``lab.token``, ``lab.aws_key_id``, ``lab.aws_secret``. The journal
  records each request's ``Authorization`` (``authorization``).
* HTTPS with a leaf certificate for every lab name (and ``*.allowed.test`` and the lab's
  address), issued by a throw-away CA whose certificate is ``lab.ca_file``.
* DNS over UDP and TCP: ``allowed.test``, ``sub.allowed.test``, ``other.test`` -> the lab's
  address; ``rebind.test`` -> 127.0.0.1; ``metadata.test`` -> 169.254.169.254; AAAA and other
  types for these names answer with no records; any other name is NXDOMAIN.

:meth:`NetLab.close` (also on leaving ``with``) stops the servers and removes the namespace,
the veth pair and the directory, whatever state the start reached. A namespace left by a test
process that was killed is removed by the next lab started on the host.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import fcntl
import functools
import hashlib
import ipaddress
import json
import os
import random
import secrets
import select
import shutil
import socket
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import zipfile
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sandbox.backends.environment import CA_VARIABLES  # a machine's own settings would outrank --cacert
from tests import brokerlab

if TYPE_CHECKING:
    from collections.abc import Iterator

LAB_NAMES = ("allowed.test", "sub.allowed.test", "other.test")
FIXED_NAMES = {"rebind.test": "127.0.0.1", "metadata.test": "169.254.169.254"}
CERT_NAMES = (*LAB_NAMES, *FIXED_NAMES, "*.allowed.test")
PACKAGE, VERSION = "labpkg", "0.1.0"
WHEEL = f"{PACKAGE}-{VERSION}-py3-none-any.whl"
HELLO = b"hello from the lab\n"
BIG_BLOCK, BIG_BLOCKS = 1024 * 1024, 64
NETNS_PORTS = {"http": 80, "https": 443, "alt": 8080, "dns": 53}
SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")
NETNS_PREFIX = "sbxlab-"
NETNS_DIR = Path("/var/run/netns")
LOCK_FILE = Path("/run/lock/sandbox-netlab.lock")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
# The server process runs with -P (tests/ itself stays off sys.path) and the repository's root
# put on it, so that it imports this module as tests.netlab, with brokerlab beside it.
CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from tests.netlab import child_main; child_main(sys.argv[2:])"


class LabError(Exception):
    """The lab could not start; ``output`` is what its server process wrote to stderr."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(f"{message}\n{output}".rstrip())
        self.output = output


class NetLab:
    """The running lab. ``NetLab()`` starts it; use it as a context manager or call :meth:`close`.

    ``netns=None`` picks the namespace when running as root and loopback otherwise; ``True``
    insists on the namespace (root needed), ``False`` asks for loopback even as root.
    """

    address: str
    peer_address: str | None
    netns: str | None
    host_veth: str | None
    ports: dict[str, int]

    def __init__(self, *, netns: bool | None = None) -> None:
        self.loopback_only = not (os.geteuid() == 0 if netns is None else netns)
        if not self.loopback_only and os.geteuid() != 0:
            raise LabError("the namespace lab needs root (it creates a network namespace and a veth pair)")
        self.netns = self.host_veth = self.peer_address = None
        self._process: subprocess.Popen[bytes] | None = None
        self._closer = contextlib.ExitStack()
        with contextlib.ExitStack() as on_fail:
            on_fail.callback(self.close)
            self.root = Path(tempfile.mkdtemp(prefix="sandbox-netlab-"))
            self._closer.callback(shutil.rmtree, self.root, ignore_errors=True)
            self._network()
            self.ca_file, cert, key = write_certificates(self.root / "tls", self.address)
            site = build_site(self.root / "www")
            self.big_sha256, self.git_head = site["big_sha256"], site["git_head"]
            self.secrets = brokerlab.Secrets.generate()
            self.token, self.aws_key_id, self.aws_secret = self.secrets
            self.private_git_head = brokerlab.write_git_host(self.root / "git")
            self._serve(cert, key)
            on_fail.pop_all()

    def __enter__(self) -> NetLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def dns(self) -> tuple[str, int]:
        return self.address, self.ports["dns"]

    @property
    def http_port(self) -> int:
        return self.ports["http"]

    @property
    def https_port(self) -> int:
        return self.ports["https"]

    @property
    def alt_port(self) -> int:
        """A second HTTP server on a non-standard port (8080 in the namespace)."""
        return self.ports["alt"]

    @property
    def big_size(self) -> int:
        return BIG_BLOCK * BIG_BLOCKS

    @property
    def records(self) -> dict[str, str]:
        """The A records the lab's DNS serves."""
        return {**dict.fromkeys(LAB_NAMES, self.address), **FIXED_NAMES}

    def http_url(self, name: str | None = None, path: str = "/", *, port: int | None = None) -> str:
        """``http://NAME[:PORT]PATH``; no name means the lab's address (for the host's own checks)."""
        return self._url("http", name, path, port or self.http_port, 80)

    def https_url(self, name: str | None = None, path: str = "/") -> str:
        return self._url("https", name, path, self.https_port, 443)

    @property
    def index_url(self) -> str:
        """The package index by name, over HTTPS (pip needs ``--cert lab.ca_file``)."""
        return self.https_url("allowed.test", "/simple/")

    @property
    def git_url(self) -> str:
        return self.http_url("allowed.test", "/repo.git")

    @property
    def private_git_url(self) -> str:
        """Smart HTTP over HTTPS; a push needs ``lab.token`` as the Basic password."""
        return self.https_url("allowed.test", "/private.git")

    @property
    def other_git_url(self) -> str:
        """The same as :attr:`private_git_url` in another repository (the same first commit)."""
        return self.https_url("allowed.test", "/other.git")

    def route_via_host(self, network: str) -> None:
        """Let the lab answer sources in ``network`` (another test namespace the host routes to).

        The lab has no default route, so it cannot reach past the host; a test whose clients sit
        in a namespace of their own adds their subnet here, so that a connection that fails does
        so because the sandbox stopped it, not because the lab could not reply.
        """
        if self.netns is None:
            raise LabError("a loopback lab has no routes to add")
        with pyroute2().NetNS(self.netns) as ns:
            ns.route("add", dst=network, gateway=self.peer_address)

    def ca_env(self) -> dict[str, str]:
        """Environment variables that make curl, pip, git, requests, Python and node trust the lab's CA."""
        return dict.fromkeys(CA_VARIABLES, str(self.ca_file))

    def log(self) -> dict[str, list[dict[str, Any]]]:
        """Every HTTP(S) request (``"http"``) and DNS query (``"dns"``) the lab has seen."""
        return self._control("log")

    def close(self) -> None:
        """Stop the servers, remove the namespace, the veth pair and the directory. Idempotent."""
        process, self._process = self._process, None
        if process is not None:
            stop(process)
        self._closer.close()

    def _url(self, scheme: str, name: str | None, path: str, port: int, default: int) -> str:
        host = name or self.address
        return f"{scheme}://{host}{'' if port == default else f':{port}'}{path}"

    def _network(self) -> None:
        if self.loopback_only:
            self.address = f"127.213.{random.randrange(256)}.{random.randrange(2, 255)}"
            self.ports = dict.fromkeys(NETNS_PORTS, 0)
            return
        self.netns, self.host_veth, self.peer_address, self.address = create_namespace(self._closer)
        self.ports = dict(NETNS_PORTS)

    def _serve(self, cert: Path, key: Path) -> None:
        config = {
            "netns": self.netns,
            "address": self.address,
            "ports": self.ports,
            "www": str(self.root / "www"),
            "cert": str(cert),
            "key": str(key),
            "records": self.records,
            "broker": brokerlab.site_config(self.secrets, self.root / "git"),
        }
        with (self.root / "server.log").open("wb") as errors:
            self._process = subprocess.Popen(
                [sys.executable, "-P", "-c", CHILD, str(REPOSITORY_ROOT), json.dumps(config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
            )
        self.ports = self._ready()

    def _ready(self) -> dict[str, int]:
        assert self._process is not None and self._process.stdout is not None
        readable, _, _ = select.select([self._process.stdout], [], [], START_TIMEOUT_S)
        line = self._process.stdout.readline() if readable else b""
        if not line:
            output = (self.root / "server.log").read_text(errors="replace")
            raise LabError("the lab's servers did not start", output)
        ports: dict[str, int] = json.loads(line)
        return ports

    def _control(self, what: str) -> dict[str, list[dict[str, Any]]]:
        with socket.create_connection((self.address, self.http_port), timeout=STOP_TIMEOUT_S) as sock:
            sock.sendall(f"GET /_lab/{what} HTTP/1.0\r\nHost: lab\r\n\r\n".encode())
            response = b"".join(iter(functools.partial(sock.recv, 65536), b""))
        result: dict[str, list[dict[str, Any]]] = json.loads(response.partition(b"\r\n\r\n")[2])
        return result


def stop(process: subprocess.Popen[bytes]) -> None:
    """End of stdin asks the server to exit; a kill follows if it has not within the grace."""
    with contextlib.suppress(OSError):
        assert process.stdin is not None
        process.stdin.close()
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()


# -- the namespace (root) -------------------------------------------------------------------------


def pyroute2() -> Any:
    """pyroute2, imported on first use: only the namespace lab needs it (and it has no types)."""
    import pyroute2  # type: ignore[import-untyped]

    return pyroute2


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    """Serialise subnet choice and creation between labs started at once on this host."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def create_namespace(closer: contextlib.ExitStack) -> tuple[str, str, str, str]:
    """``(netns, host veth, host address, lab address)``; each undo is pushed onto ``closer``."""
    netns = pyroute2().netns
    token = secrets.token_hex(3)
    name, host_if, lab_if = f"{NETNS_PREFIX}{os.getpid()}-{token}", f"sbxl{token}h", f"sbxl{token}n"
    with host_lock(), pyroute2().IPRoute() as ipr:
        remove_stale_namespaces()
        subnet = free_subnet(ipr)
        host_ip, lab_ip = str(subnet[1]), str(subnet[2])
        netns.create(name)
        closer.callback(remove_namespace, name)
        ipr.link("add", ifname=host_if, kind="veth", peer={"ifname": lab_if, "net_ns_fd": name})
        closer.callback(remove_link, host_if)
        index = ipr.link_lookup(ifname=host_if)[0]
        ipr.addr("add", index=index, address=host_ip, prefixlen=subnet.prefixlen)
        ipr.link("set", index=index, state="up")
    configure_inside(name, lab_if, lab_ip, subnet.prefixlen)
    return name, host_if, host_ip, lab_ip


def configure_inside(name: str, ifname: str, address: str, prefixlen: int) -> None:
    """Addresses and links up; no default route, so nothing in the lab can reach past the host."""
    with pyroute2().NetNS(name) as ns:
        for link, addr in (("lo", None), (ifname, address)):
            index = ns.link_lookup(ifname=link)[0]
            if addr:
                ns.addr("add", index=index, address=addr, prefixlen=prefixlen)
            ns.link("set", index=index, state="up")


def free_subnet(ipr: Any) -> ipaddress.IPv4Network:
    """A random /24 of 10.213.0.0/16 that no address or route on the host touches."""
    addresses = [f"{a.get('IFA_ADDRESS')}/{a['prefixlen']}" for a in ipr.get_addr(family=socket.AF_INET)]
    routes = [f"{r.get('RTA_DST')}/{r['dst_len']}" for r in ipr.get_routes(family=socket.AF_INET) if r.get("RTA_DST")]
    used = [ipaddress.IPv4Network(net, strict=False) for net in addresses + routes]
    candidates = list(SUBNETS.subnets(new_prefix=24))
    random.shuffle(candidates)
    for subnet in candidates:
        if not any(subnet.overlaps(net) for net in used if net.prefixlen > 0):
            return subnet
    raise LabError("no free /24 left in 10.213.0.0/16")


def remove_stale_namespaces() -> None:
    """Namespaces of lab owners that died without closing (a killed test run)."""
    for entry in NETNS_DIR.glob(f"{NETNS_PREFIX}*") if NETNS_DIR.is_dir() else ():
        owner = entry.name.removeprefix(NETNS_PREFIX).partition("-")[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            remove_namespace(entry.name)


def remove_namespace(name: str) -> None:
    with contextlib.suppress(OSError):
        pyroute2().netns.remove(name)


def remove_link(ifname: str) -> None:
    """The host end; deleting it deletes the namespace's end too."""
    lib = pyroute2()
    with lib.IPRoute() as ipr, contextlib.suppress(lib.NetlinkError, IndexError):
        ipr.link("del", index=ipr.link_lookup(ifname=ifname)[0])


# -- the content ----------------------------------------------------------------------------------


def write_certificates(directory: Path, address: str) -> tuple[Path, Path, Path]:
    """``(CA certificate, leaf chain, leaf key)`` for every lab name and ``address``."""
    directory.mkdir()
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("sandbox netlab CA", ca_key, ca_key, None, ca=True)
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in CERT_NAMES]
    sans.append(x509.IPAddress(ipaddress.ip_address(address)))
    leaf = certificate("allowed.test", leaf_key, ca_key, ca, ca=False, sans=sans)
    paths = directory / "ca.pem", directory / "leaf.pem", directory / "leaf.key"
    pem = serialization.Encoding.PEM
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(leaf.public_bytes(pem) + ca.public_bytes(pem))
    paths[2].write_bytes(leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


def certificate(
    common_name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer_key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    *,
    ca: bool,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    )
    if ca:
        usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
        builder = builder.add_extension(usage, critical=True)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans or []), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def build_site(www: Path) -> dict[str, str]:
    www.mkdir()
    (www / "hello.txt").write_bytes(HELLO)
    return {"big_sha256": write_big(www / "big.bin"), "git_head": write_repository(www)} | write_index(www)


def write_big(path: Path) -> str:
    """64 MiB of one random MiB repeated: random enough to defeat compression, cheap to make."""
    block, digest = os.urandom(BIG_BLOCK), hashlib.sha256()
    with path.open("wb") as out:
        for _ in range(BIG_BLOCKS):
            out.write(block)
            digest.update(block)
    return digest.hexdigest()


def write_index(www: Path) -> dict[str, str]:
    """A PEP 503 index with one hand-written wheel: the format is a zip with a RECORD."""
    (www / "packages").mkdir()
    wheel = www / "packages" / WHEEL
    write_wheel(wheel)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (www / "simple" / PACKAGE).mkdir(parents=True)
    page = "<!DOCTYPE html><html><body>{}</body></html>\n"
    (www / "simple" / "index.html").write_text(page.format(f'<a href="{PACKAGE}/">{PACKAGE}</a>'))
    link = f'<a href="/packages/{WHEEL}#sha256={sha}">{WHEEL}</a>'
    (www / "simple" / PACKAGE / "index.html").write_text(page.format(link))
    return {"wheel_sha256": sha}


def write_wheel(path: Path) -> None:
    info = f"{PACKAGE}-{VERSION}.dist-info"
    files = {
        f"{PACKAGE}/__init__.py": b'VALUE = "from the lab"\n',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: netlab\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{name},sha256={record_hash(data)},{len(data)}" for name, data in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,", ""]).encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)


def record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_repository(www: Path) -> str:
    """A bare repository with one commit, prepared for dumb HTTP; returns the commit's id."""
    work = www.parent / "repo-work"
    env = brokerlab.git_env(str(www.parent))

    def git(*args: str, cwd: Path = work) -> str:
        return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout

    work.mkdir()
    git("init", "-q", "-b", "main")
    (work / "README.md").write_text("# served by the lab\n")
    git("add", "README.md")
    git("commit", "-q", "-m", "first")
    git("clone", "-q", "--bare", str(work), str(www / "repo.git"), cwd=www)
    git("update-server-info", cwd=www / "repo.git")
    return git("rev-parse", "HEAD").strip()


# -- the servers (the child process) --------------------------------------------------------------


class Journal:
    """What the lab saw, shared by every server thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, list[dict[str, Any]]] = {"http": [], "dns": []}

    def add(self, kind: str, **entry: Any) -> None:
        with self.lock:
            self.entries[kind].append(entry)

    def dump(self) -> bytes:
        with self.lock:
            return json.dumps(self.entries).encode()


class LabHandler(brokerlab.BrokerHandler):
    journal: ClassVar[Journal]

    def do_GET(self) -> None:
        if self.path == "/whoami":
            self.send_json(json.dumps(self.whoami()).encode())
        elif self.path == "/_lab/log":
            self.send_json(self.journal.dump())
        else:
            super().do_GET()

    def whoami(self) -> dict[str, Any]:
        return {
            "host": self.headers.get("Host"),
            "sni": getattr(self.connection, "lab_sni", None),
            "tls": isinstance(self.connection, ssl.SSLSocket),
            "client": self.client_address[0],
            "port": self.connection.getsockname()[1],
        }

    def send_json(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def copyfile(self, source: BinaryIO, outputfile: BinaryIO) -> None:  # type: ignore[override]
        # sendfile(2) keeps the big download's server side out of the way of what a test measures.
        outputfile.flush()
        self.connection.sendfile(source)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:  # noqa: ARG002 -- the base's
        if not self.path.startswith("/_lab/"):
            authorization = self.headers.get("Authorization")
            entry = {"method": self.command, "path": self.path, "code": int(code), "authorization": authorization}
            self.journal.add("http", **self.whoami(), **entry)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class LabHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer's own asks socket.getfqdn(), a reverse lookup through the host's resolver:
        # a query leaving the lab, and a hang where no resolver answers.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up mid-answer is the tests' business, not a traceback


class LabHTTPSServer(LabHTTPServer):
    """TLS per connection in the connection's own thread, so a silent client blocks no one."""

    context: ssl.SSLContext

    def finish_request(self, request: Any, client_address: Any) -> None:
        tls = self.context.wrap_socket(request, server_side=True)
        super().finish_request(tls, client_address)


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, _: setattr(sock, "lab_sni", name)
    return context


def answer(query: bytes, records: dict[str, str], journal: Journal, proto: str) -> bytes:
    request = dns.message.from_wire(query)
    response = dns.message.make_response(request)
    question = request.question[0]
    name = question.name.to_text(omit_final_dot=True).lower()
    journal.add("dns", name=name, type=dns.rdatatype.to_text(question.rdtype), proto=proto)
    if name not in records:
        response.set_rcode(dns.rcode.NXDOMAIN)
    elif question.rdtype == dns.rdatatype.A:
        response.answer.append(dns.rrset.from_text(question.name, 60, "IN", "A", records[name]))
    return response.to_wire()


def serve_dns_udp(sock: socket.socket, records: dict[str, str], journal: Journal) -> None:
    while True:
        query, peer = sock.recvfrom(65535)
        with contextlib.suppress(Exception):  # a malformed query gets no answer, as from a real server
            sock.sendto(answer(query, records, journal, "udp"), peer)


class DNSTCPHandler(socketserver.BaseRequestHandler):
    records: ClassVar[dict[str, str]]
    journal: ClassVar[Journal]

    def handle(self) -> None:
        stream = self.request.makefile("rb")
        while length := stream.read(2):
            reply = answer(stream.read(int.from_bytes(length, "big")), self.records, self.journal, "tcp")
            self.request.sendall(len(reply).to_bytes(2, "big") + reply)


class DNSTCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def dns_sockets(address: str, port: int) -> tuple[socket.socket, DNSTCPServer]:
    """UDP and TCP on the same port; with port 0, retried until a free UDP port is free in TCP too."""
    for _ in range(20):
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind((address, port))
        try:
            return udp, DNSTCPServer((address, udp.getsockname()[1]), DNSTCPHandler)
        except OSError:
            udp.close()
            if port:
                raise
    raise LabError("no port free for both UDP and TCP")


def run_servers(config: dict[str, Any]) -> None:
    journal = Journal()
    www, address, ports = config["www"], config["address"], config["ports"]
    site = brokerlab.Site.from_config(config["broker"])
    handler = type("Handler", (LabHandler,), {"journal": journal, "site": site})
    factory = functools.partial(handler, directory=www)
    http = LabHTTPServer((address, ports["http"]), factory)
    alt = LabHTTPServer((address, ports["alt"]), factory)
    https = LabHTTPSServer((address, ports["https"]), factory)
    https.context = tls_context(config["cert"], config["key"])
    DNSTCPHandler.records, DNSTCPHandler.journal = config["records"], journal
    udp, tcp = dns_sockets(address, ports["dns"])
    for server in (http, alt, https, tcp):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Thread(target=serve_dns_udp, args=(udp, config["records"], journal), daemon=True).start()
    bound = {"http": http, "alt": alt, "https": https, "dns": tcp}
    print(json.dumps({key: server.server_address[1] for key, server in bound.items()}), flush=True)  # noqa: T201


def child_main(argv: list[str]) -> None:
    config = json.loads(argv[0])
    if config["netns"]:
        # Before any thread exists: setns(2) moves only the calling thread.
        pyroute2().netns.setns(config["netns"], flags=0)
    run_servers(config)
    sys.stdin.buffer.read()  # end of stdin: the lab closed, or its owner died
    os._exit(0)


def broker_env(lab: NetLab, monkeypatch: Any) -> None:
    """What the secret broker's tests need besides :func:`resolve_in`: the proxy trusts the lab's CA
    (``SANDBOX_NET_TRUST``), and the lab's real values are in this process's environment, where a
    profile's ``from = "env:…"`` reads them (``LAB_TOKEN``, ``LAB_AWS_SECRET``)."""
    resolve_in(lab, monkeypatch)
    monkeypatch.setenv("SANDBOX_NET_TRUST", str(lab.ca_file))
    monkeypatch.setenv("LAB_TOKEN", lab.token)
    monkeypatch.setenv("LAB_AWS_SECRET", lab.aws_secret)


def resolve_in(lab: NetLab, monkeypatch: Any, *, drop: tuple[str, ...] = ()) -> None:
    """The proxy resolves with ``lab``'s DNS and chains to no proxy of this machine; the variables
    in ``drop`` (a test's CA variables) are unset too. ``monkeypatch``: pytest's, undone after the test."""
    monkeypatch.setenv("SANDBOX_NET_RESOLVER", f"{lab.dns[0]}:{lab.dns[1]}")
    for name in list(os.environ):
        if name.lower().endswith("_proxy") or name in drop:
            monkeypatch.delenv(name)
