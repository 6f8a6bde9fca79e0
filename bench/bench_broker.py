"""The secret broker's cost: a terminated host against SNI pass-through and a direct connection.

A TLS server in a child process (loopback, ``127.0.0.88``, a throw-away CA) serves a large body
from memory and a 100-byte one over HTTP/1.1 keep-alive. curl fetches them three ways, the modes
interleaved round by round so that a shared machine's noise falls on all of them alike:

- **direct**: straight to the server;
- **pass-through**: through the egress proxy (in this process, on a TCP port) with the host
  allowed and no broker: its TLS is relayed unopened;
- **terminated**: through the proxy with a request rule and a bearer secret for the host, so the
  proxy is curl's TLS server (the session CA, trusted with ``--cacert``), judges each request,
  puts the secret in place of its placeholder and is the real server's TLS client.

Measured: the download's throughput (``%{speed_download}``; no placeholder sent, so nothing to
mask), the proxy's CPU time per GiB, and the time per request of ``--requests`` small GETs on one
kept-alive connection, each carrying ``Authorization: Bearer <placeholder>`` (``%{time_total}`` of
each reused transfer; the first, which connects, is left out). The server says whether the real
token reached it, and the run stops unless it did through the broker. Ratios and the added time
are against direct.
Targets (the issue's): terminated throughput at least 0.6x direct, at most 3 ms added per request.
A missed target is printed and makes the exit status 1.

Usage: ``python bench/bench_broker.py [-n ROUNDS] [--size MIB] [--requests N]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import secrets
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import NoReturn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sandbox.backends.environment import CA_VARIABLES  # noqa: E402 - after the checkout is on the path
from sandbox.network.broker import TRUST_ENV, Broker  # noqa: E402
from sandbox.network.policy import EgressPolicy  # noqa: E402
from sandbox.network.proxy import EgressProxy, ProxyThread  # noqa: E402
from sandbox.profile_tables import RequestRule, Secret  # noqa: E402
from tests.netlab import write_certificates  # noqa: E402

ADDRESS = "127.0.0.88"
TOKEN_ENV = "BENCH_BROKER_TOKEN"
BLOCK = 1 << 20
SMALL = 100
MODES = ("direct", "pass-through", "terminated", "terminated+secret")
"""``terminated``: a host a request rule names (its TLS opened, each request judged); ``+secret``: a
host a secret names too, whose every response is searched for the value (the masking)."""
TARGET_RATE = 0.6
TARGET_ADDED_MS = 3.0
Runs = dict[str, dict[str, list[float]]]  # what ("rate", "cpu", "latency") -> mode -> one value a round


# -- the server (a child process: its TLS must not share this process's GIL with the proxy's) --
def serve(cert: str, key: str, blocks: int) -> NoReturn:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["http/1.1"])
    listener = socket.create_server((ADDRESS, 0))
    print(listener.getsockname()[1], flush=True)
    token = os.environ[TOKEN_ENV].encode()
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=answer, args=(context, conn, blocks, token), daemon=True).start()


def answer(context: ssl.SSLContext, raw: socket.socket, blocks: int, token: bytes) -> None:
    """Answer one connection's requests: ``/big`` (``blocks`` MiB) or 100 bytes saying whether the token came."""
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    block, buffer = memoryview(b"\0" * BLOCK), b""
    try:
        with context.wrap_socket(raw, server_side=True) as tls:
            while True:
                while b"\r\n\r\n" not in buffer:
                    if not (chunk := tls.recv(65536)):
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                if lines[0].split(b" ")[1] == b"/big":
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (blocks * BLOCK))
                    for _ in range(blocks):
                        tls.sendall(block)
                    continue
                auth = [
                    v.strip()
                    for n, _, v in (line.partition(b":") for line in lines[1:])
                    if n.lower() == b"authorization"
                ]
                body = (b"ok" if auth == [b"Bearer " + token] else b"no").ljust(SMALL, b".")
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (SMALL, body))
    except OSError:  # the client went away (ssl.SSLError is an OSError)
        return


# -- the client ----------------------------------------------------------------------------------
def curl(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and k not in CA_VARIABLES}
    argv = ["curl", "-q", "-sS", "--http1.1", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=600).stdout


def download(mode: list[str], url: str) -> tuple[float, float]:
    """Bytes per second, and the CPU seconds this process (the proxy's threads) spent meanwhile."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    rate = float(curl(*mode, "-o", "/dev/null", "-w", "%{speed_download}", url + "/big"))
    after = resource.getrusage(resource.RUSAGE_SELF)
    return rate, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def per_request_s(mode: list[str], url: str, requests: int, auth: list[str]) -> float:
    """The median time of a request on a reused connection, each with the secret's placeholder."""
    each = ["-o", "/dev/null", url + "/small"] * requests
    lines = curl(*mode, *auth, "-w", "%{num_connects} %{time_total}\n", *each).split()
    connects, totals = [int(c) for c in lines[0::2]], [float(t) for t in lines[1::2]]
    if sum(connects) != 1:
        raise SystemExit(f"curl opened {sum(connects)} connections for {requests} requests, not one")
    return statistics.median(totals[1:])


def start_proxy(host: str, broker: Broker | None) -> tuple[ProxyThread, str]:
    policy = EgressPolicy.from_patterns([host], [])
    thread = EgressProxy(policy, tcp=("127.0.0.1", 0), broker=broker).serve_in_thread()
    address = thread.tcp_address
    assert address is not None
    return thread, f"http://{address[0]}:{address[1]}"


def make_broker(host: str, *, secret: bool) -> Broker:
    secrets = {"TOKEN": Secret.model_validate({"from": f"env:{TOKEN_ENV}", "hosts": [host], "as": "bearer"})}
    broker = Broker.build(secrets if secret else {}, [RequestRule(hosts=(host,), allow=("GET /*",))])
    assert broker is not None
    return broker


def measure(args: argparse.Namespace, tmp: Path) -> Runs:
    ca, cert, key = write_certificates(tmp / "tls", ADDRESS)
    os.environ[TOKEN_ENV] = secrets.token_hex(16)
    os.environ[TRUST_ENV] = str(ca)  # read when the broker is built, for its upstream context
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(cert), str(key), str(args.size)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        host = f"{ADDRESS}:{server.stdout.readline().strip()}"
        broker, ruled = make_broker(host, secret=True), make_broker(host, secret=False)
        (tmp / "trust").mkdir()
        (tmp / "trust-rules").mkdir()
        bundle = broker.ca.trust_files(tmp / "trust")["bundle"]
        ruled_bundle = ruled.ca.trust_files(tmp / "trust-rules")["bundle"]
        plain, plain_url = start_proxy(host, None)
        termed, termed_url = start_proxy(host, broker)
        ruling, ruling_url = start_proxy(host, ruled)
        try:
            modes = {
                "direct": ["--cacert", str(ca)],
                "pass-through": ["--cacert", str(ca), "--proxy", plain_url],
                "terminated": ["--cacert", str(ruled_bundle), "--proxy", ruling_url],
                "terminated+secret": ["--cacert", str(bundle), "--proxy", termed_url],
            }
            auth = ["-H", f"Authorization: Bearer {broker.secrets[0].placeholder}"]
            print(
                f"server on {host} (TLS, a child process), the proxy in this process, {os.cpu_count()} cores; "
                f"{args.n} rounds of {args.size} MiB and of {args.requests} requests on one connection"
            )
            return rounds(args, modes, f"https://{host}", auth)
        finally:
            plain.close()
            termed.close()
            ruling.close()
    finally:
        server.kill()
        server.wait()


def rounds(args: argparse.Namespace, modes: dict[str, list[str]], url: str, auth: list[str]) -> Runs:
    """Every measurement ``args.n`` times, the modes interleaved so that noise falls on all alike."""
    said = curl(*modes["terminated+secret"], *auth, url + "/small")
    if not said.startswith("ok"):
        raise SystemExit(f"the broker did not put the secret in: the server said {said[:2]!r}")
    runs: Runs = {kind: {m: [] for m in MODES} for kind in ("rate", "cpu", "latency")}
    for _ in range(args.n):
        for name, mode in modes.items():
            rate, cpu = download(mode, url)
            runs["rate"][name].append(rate)
            runs["cpu"][name].append(cpu / (args.size / 1024))
            runs["latency"][name].append(per_request_s(mode, url, args.requests, auth))
    return runs


def report(runs: Runs) -> list[str]:
    """Print the table, a mode a row; the targets missed (each terminated mode against direct)."""
    mb = 1 << 20
    rate = {m: statistics.median(runs["rate"][m]) for m in MODES}
    best = {m: max(runs["rate"][m]) for m in MODES}
    latency = {m: statistics.median(runs["latency"][m]) * 1000 for m in MODES}
    print(f"{'':20}{'MiB/s median':>14}{'best':>8}{'x direct':>10}{'proxy CPU/GiB':>15}{'ms/request':>12}{'added':>10}")
    for m in MODES:
        cpu = "-" if m == "direct" else f"{statistics.median(runs['cpu'][m]):.2f} s"
        added = "" if m == "direct" else f"+{latency[m] - latency['direct']:.3f}"
        print(
            f"{m:20}{rate[m] / mb:>14.0f}{best[m] / mb:>8.0f}{rate[m] / rate['direct']:>9.2f}x{cpu:>15}"
            f"{latency[m]:>12.3f}{added:>10}"
        )
    missed = []
    for m in ("terminated", "terminated+secret"):
        ratio, added_ms = rate[m] / rate["direct"], latency[m] - latency["direct"]
        print(f"targets, {m}: >= {TARGET_RATE}x direct ({ratio:.2f}x), <= {TARGET_ADDED_MS} ms added (+{added_ms:.3f})")
        missed += [f"{m} throughput {ratio:.2f}x < {TARGET_RATE}x"] if ratio < TARGET_RATE else []
        missed += [f"{m} +{added_ms:.3f} ms > {TARGET_ADDED_MS} ms"] if added_ms > TARGET_ADDED_MS else []
    return missed


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="rounds of each measurement (default 5)")
    parser.add_argument("--size", type=int, default=256, help="the download in MiB (default 256)")
    parser.add_argument("--requests", type=int, default=200, help="requests on one connection (default 200)")
    args = parser.parse_args()
    if shutil.which("curl") is None:
        print("skipped: curl not found")
        return 0
    for name in [n for n in os.environ if n.lower().endswith("_proxy")]:
        del os.environ[name]  # the proxy must not chain to this machine's
    with tempfile.TemporaryDirectory() as tmp:
        missed = report(measure(args, Path(tmp)))
    print("targets met" if not missed else "missed: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
