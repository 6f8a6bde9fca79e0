"""The test "internet" answers as the network tests expect, from the host side, and leaves nothing.

Each check runs against the namespace lab (root only: it creates a network namespace and a
veth pair) and the loopback lab (any user). The clients are the real tools the network tests
drive through the proxy -- curl, urllib, pip, git -- talking to the lab directly, with any
proxy the environment names switched off.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import pytest

from sandbox.backends.environment import CA_VARIABLES
from tests import netlab
from tests.netlab import NetLab

if TYPE_CHECKING:
    from collections.abc import Iterator

MODES = [pytest.param(True, marks=pytest.mark.root, id="netns"), pytest.param(False, id="loopback")]
TIMEOUT_S = 10.0


@pytest.fixture(scope="module", params=MODES)
def lab(request: pytest.FixtureRequest) -> Iterator[NetLab]:
    with NetLab(netns=request.param) as running:
        yield running


def direct_env() -> dict[str, str]:
    """The environment without proxy variables (these checks talk to the lab itself) and without
    CA-bundle variables (the machine's own outrank pip's ``--cert``)."""
    drop = {*CA_VARIABLES, "SSL_CERT_DIR"}
    return {key: value for key, value in os.environ.items() if not key.lower().endswith("_proxy") and key not in drop}


def fetch(url: str, context: ssl.SSLContext | None = None) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    with opener.open(url, timeout=TIMEOUT_S) as response:
        body: bytes = response.read()
    return body


def curl(lab: NetLab, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """curl with ``name`` resolved to the lab on each of its ports, never by the host's DNS."""
    resolve = [arg for port in lab.ports.values() for arg in ("--resolve", f"{name}:{port}:{lab.address}")]
    argv = ["curl", "-sS", "--max-time", str(TIMEOUT_S), "--noproxy", "*", *resolve, *args]
    return subprocess.run(argv, capture_output=True, text=True, env=direct_env(), check=False)


def test_http_serves_the_fixed_files_on_both_ports(lab: NetLab) -> None:
    assert fetch(lab.http_url(path="/hello.txt")) == netlab.HELLO
    assert fetch(lab.http_url(path="/hello.txt", port=lab.alt_port)) == netlab.HELLO


def test_whoami_reports_the_host_it_was_asked_for(lab: NetLab) -> None:
    result = curl(lab, "other.test", lab.http_url("other.test", "/whoami"))
    seen = json.loads(result.stdout)
    assert (seen["host"].partition(":")[0], seen["tls"]) == ("other.test", False), result.stderr


def test_the_big_file_arrives_whole(lab: NetLab) -> None:
    digest, size = hashlib.sha256(), 0
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(lab.http_url(path="/big.bin"), timeout=TIMEOUT_S) as response:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    assert (size, digest.hexdigest()) == (lab.big_size, lab.big_sha256)


@pytest.mark.parametrize("name", [*netlab.LAB_NAMES, "www.allowed.test"])
def test_https_presents_a_certificate_the_lab_ca_vouches_for(lab: NetLab, name: str) -> None:
    result = curl(lab, name, "--cacert", str(lab.ca_file), lab.https_url(name, "/whoami"))
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert (seen["sni"], seen["tls"]) == (name, True)


def test_https_is_refused_without_the_lab_ca(lab: NetLab) -> None:
    result = curl(lab, "allowed.test", lab.https_url("allowed.test", "/hello.txt"))
    assert result.returncode == 60, result.stderr  # curl: peer certificate cannot be authenticated


def test_https_by_address_for_python(lab: NetLab) -> None:
    context = ssl.create_default_context(cafile=str(lab.ca_file))
    assert fetch(lab.https_url(path="/hello.txt"), context) == netlab.HELLO


def query(lab: NetLab, name: str, rdtype: str = "A", *, tcp: bool = False) -> dns.message.Message:
    request = dns.message.make_query(name, rdtype)
    send = dns.query.tcp if tcp else dns.query.udp
    return send(request, lab.dns[0], port=lab.dns[1], timeout=TIMEOUT_S)


def addresses(response: dns.message.Message) -> list[str]:
    return [item.to_text() for rrset in response.answer for item in rrset]


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
def test_dns_answers_the_lab_names(lab: NetLab, tcp: bool) -> None:
    expected = dict.fromkeys(netlab.LAB_NAMES, lab.address)
    expected |= {"rebind.test": "127.0.0.1", "metadata.test": "169.254.169.254"}
    answers = {name: addresses(query(lab, name, tcp=tcp)) for name in expected}
    assert answers == {name: [address] for name, address in expected.items()}


def test_dns_says_nxdomain_for_other_names_and_nothing_for_aaaa(lab: NetLab) -> None:
    assert query(lab, "unknown.test").rcode() == dns.rcode.NXDOMAIN
    assert query(lab, "example.com").rcode() == dns.rcode.NXDOMAIN
    aaaa = query(lab, "allowed.test", "AAAA")
    assert (aaaa.rcode(), aaaa.answer) == (dns.rcode.NOERROR, [])


def test_pip_downloads_the_wheel_from_the_index(lab: NetLab, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--no-cache-dir"]
    argv += ["--disable-pip-version-check", "--index-url", lab.https_url(path="/simple/")]
    argv += ["--cert", str(lab.ca_file), "--dest", str(tmp_path), netlab.PACKAGE]
    result = subprocess.run(argv, capture_output=True, text=True, env=direct_env(), check=False, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [path.name for path in tmp_path.iterdir()] == [netlab.WHEEL]


def test_git_clones_the_repository_over_dumb_http(lab: NetLab, tmp_path: Path) -> None:
    env = direct_env() | {"GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    clone = tmp_path / "clone"
    git = ["git", "-c", "http.lowSpeedTime=10", "-c", "http.lowSpeedLimit=1"]
    subprocess.run([*git, "clone", "-q", lab.http_url(path="/repo.git"), str(clone)], env=env, check=True, timeout=60)
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], env=env, capture_output=True, text=True)
    assert head.stdout.strip() == lab.git_head
    assert (clone / "README.md").is_file()


def test_the_log_shows_requests_and_queries(lab: NetLab) -> None:
    fetch(lab.http_url(path="/hello.txt?logged"))
    query(lab, "logged.test")
    log = lab.log()
    assert any(entry["path"] == "/hello.txt?logged" for entry in log["http"])
    assert {"name": "logged.test", "type": "A", "proto": "udp"} in log["dns"]


def test_names_and_urls(lab: NetLab) -> None:
    suffix = "" if lab.https_port == 443 else f":{lab.https_port}"
    assert lab.index_url == f"https://allowed.test{suffix}/simple/"
    assert lab.git_url.startswith("http://allowed.test") and lab.git_url.endswith("/repo.git")
    assert lab.loopback_only is (lab.netns is None)


def leftovers(state: dict[str, Any]) -> list[str]:
    found = []
    if state["netns"] and state["netns"] in subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout:
        found.append(f"namespace {state['netns']}")
    if state["veth"] and subprocess.run(["ip", "link", "show", state["veth"]], capture_output=True).returncode == 0:
        found.append(f"link {state['veth']}")
    if Path(f"/proc/{state['pid']}").exists() and "Z" not in Path(f"/proc/{state['pid']}/stat").read_text().split()[2]:
        found.append(f"server process {state['pid']}")
    if Path(state["root"]).exists():
        found.append(f"directory {state['root']}")
    return found


@pytest.mark.parametrize("netns", MODES)
def test_close_leaves_nothing_behind(netns: bool) -> None:
    lab = NetLab(netns=netns)
    assert lab._process is not None
    state = {"netns": lab.netns, "veth": lab.host_veth, "pid": lab._process.pid, "root": str(lab.root)}
    lab.close()
    lab.close()
    assert leftovers(state) == []
    if lab.loopback_only:  # the namespace's address, once gone, would be sought beyond the host
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((lab.address, lab.http_port), timeout=TIMEOUT_S).close()


def lab_namespaces() -> set[str]:
    names = subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout.split()
    return {name for name in names if name.startswith(f"{netlab.NETNS_PREFIX}{os.getpid()}-")}


@pytest.mark.root
def test_a_failed_start_removes_what_it_created(monkeypatch: pytest.MonkeyPatch) -> None:
    before = lab_namespaces(), subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout

    def fail(*_: object) -> None:
        raise RuntimeError("injected: certificates could not be written")

    monkeypatch.setattr(netlab, "write_certificates", fail)
    with pytest.raises(RuntimeError, match="injected"):
        NetLab(netns=True)
    assert (lab_namespaces(), subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout) == before


@pytest.mark.root
def test_a_namespace_whose_owner_died_is_removed_by_the_next_lab() -> None:
    dead = f"{netlab.NETNS_PREFIX}{_dead_pid()}-stale"
    subprocess.run(["ip", "netns", "add", dead], check=True)
    try:
        with NetLab(netns=True):
            pass
        assert dead not in subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
    finally:
        subprocess.run(["ip", "netns", "del", dead], capture_output=True, check=False)


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.root
def test_the_lab_routes_only_what_it_is_told_to() -> None:
    with NetLab(netns=True) as lab:
        assert lab.netns is not None
        show = ["ip", "-n", lab.netns, "route", "show"]
        assert "default" not in subprocess.run(show, capture_output=True, text=True, check=True).stdout
        lab.route_via_host("10.214.7.0/24")
        routes = subprocess.run(show, capture_output=True, text=True, check=True).stdout
        assert f"10.214.7.0/24 via {lab.peer_address}" in routes


@pytest.mark.root
def test_two_labs_at_once_get_their_own_subnets() -> None:
    with NetLab(netns=True) as first, NetLab(netns=True) as second:
        assert first.address.rpartition(".")[0] != second.address.rpartition(".")[0]
        assert fetch(first.http_url(path="/hello.txt")) == fetch(second.http_url(path="/hello.txt")) == netlab.HELLO


@pytest.mark.skipif(os.geteuid() == 0, reason="checks the refusal an ordinary user gets; this run is as root")
def test_the_namespace_lab_says_it_needs_root() -> None:
    with pytest.raises(netlab.LabError, match="needs root"):
        NetLab(netns=True)
