"""The allowlist's cost: connection set-up and download throughput, through the proxy and direct.

One client program (Python, standard library) runs twice against the same local server, the
test lab of ``tests/netlab.py`` (a network namespace of its own as root, loopback otherwise):

- **direct**: on the host, straight to the server;
- **proxied**: in a bubblewrap jail with ``network.mode = "allowlist"``, through the jail's
  forwarder, the unix socket and the host-side filtering proxy (what every allowlisted
  connection takes).

It measures, inside the client, the median time of one connection set-up plus a small request
and its answer (HTTP, ``CONNECTIONS`` sequential connections) and the throughput of downloading
the lab's 64 MiB file (``DOWNLOADS`` times, best and median). Ratios are proxied / direct.
Targets (the issue's): throughput at least 0.8x direct, set-up at most 2 ms added. A missed
target is printed and makes the exit status 1; a shared machine's noise is reported, not hidden.

Usage: ``python bench/bench_network.py [--connections N] [--downloads N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sandbox import exec as executor  # noqa: E402 - after the checkout is on the path
from sandbox import profile as profiles  # noqa: E402
from sandbox.backends import base  # noqa: E402
from sandbox.network import egress  # noqa: E402
from tests.netlab import NetLab  # noqa: E402

CLIENT = r"""
import json, socket, statistics, sys, time, urllib.request
url_small, url_big, connections, downloads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
opener = urllib.request.build_opener()  # honours http_proxy when it is set, and only then
setups = []
for _ in range(connections):
    started = time.perf_counter()
    with opener.open(url_small, timeout=10) as answer:
        answer.read()
    setups.append(time.perf_counter() - started)
rates = []
for _ in range(downloads):
    started = time.perf_counter()
    got = 0
    with opener.open(url_big, timeout=60) as answer:
        while chunk := answer.read(1 << 20):
            got += len(chunk)
    rates.append(got / (time.perf_counter() - started))
rate = statistics.median(rates)
print(json.dumps({"setup_s": statistics.median(setups), "rate_best": max(rates), "rate_median": rate}))
"""

TARGET_RATE = 0.8
TARGET_SETUP_MS = 2.0


def direct(lab: NetLab, args: argparse.Namespace) -> dict[str, float]:
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    argv = [sys.executable, "-c", CLIENT, *urls(lab, None), str(args.connections), str(args.downloads)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def urls(lab: NetLab, name: str | None = "allowed.test") -> list[str]:
    """By name through the proxy (which resolves it with the lab's DNS); by address direct."""
    return [lab.http_url(name, "/hello.txt"), lab.http_url(name, "/big.bin")]


async def proxied(lab: NetLab, args: argparse.Namespace, workspace: Path) -> dict[str, float]:
    allow = [f"allowed.test:{lab.http_port}", f"{lab.address}:{lab.http_port}"]
    profile = profiles.load("default").with_overrides(
        **{"network.mode": "allowlist", "network.allow": allow, "requires": ()}
    )
    async with await base.get("bwrap").open_jail(workspace, profile) as jail:
        argv = ["python3", "-c", CLIENT, *urls(lab), str(args.connections), str(args.downloads)]
        result = await executor.run(jail, argv, timeout=600)
    if result.exit_code != 0:
        raise SystemExit(f"the proxied client failed: {result.stderr[-2000:]}")
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--downloads", type=int, default=5)
    parser.add_argument("--forwarder", choices=("pass", "splice"), default=egress.FORWARDER_COPY)
    args = parser.parse_args()
    egress.FORWARDER_COPY = args.forwarder
    report = base.get("bwrap").probe()
    if not report.available:
        print(f"skipped: bubblewrap unavailable ({report.reason})")
        return 0
    with NetLab() as lab, tempfile.TemporaryDirectory() as tmp:
        os.environ["SANDBOX_NET_RESOLVER"] = f"{lab.dns[0]}:{lab.dns[1]}"
        for name in [n for n in os.environ if n.lower().endswith("_proxy")]:
            del os.environ[name]  # the proxy must not chain to this machine's
        where = "a network namespace" if not lab.loopback_only else "loopback"
        print(
            f"lab on {where} ({lab.address}); {args.connections} connections, {args.downloads} x 64 MiB; "
            f"the jail's forwarder: {args.forwarder}"
        )
        plain = direct(lab, args)
        through = anyio.run(proxied, lab, args, Path(tmp))
    added_ms = (through["setup_s"] - plain["setup_s"]) * 1000
    ratio = through["rate_median"] / plain["rate_median"]
    mb = 1 << 20
    print(f"{'':24}{'direct':>14}{'through proxy':>16}{'ratio':>9}")
    print(
        f"{'set-up + request (med)':24}{plain['setup_s'] * 1000:>11.2f} ms{through['setup_s'] * 1000:>13.2f} ms"
        f"{'+' + format(added_ms, '.2f') + ' ms':>11}"
    )
    for key, label in (("rate_median", "download (median)"), ("rate_best", "download (best)")):
        print(
            f"{label:24}{plain[key] / mb:>9.0f} MiB/s{through[key] / mb:>11.0f} MiB/s{through[key] / plain[key]:>8.2f}x"
        )
    missed = []
    if ratio < TARGET_RATE:
        missed.append(f"throughput {ratio:.2f}x < {TARGET_RATE}x")
    if added_ms > TARGET_SETUP_MS:
        missed.append(f"set-up +{added_ms:.2f} ms > {TARGET_SETUP_MS} ms")
    print("targets met" if not missed else "missed: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
