"""The transparent mode's plumbing (``network.transparent = true``, root only): a call's network
namespace gets one way out, and it leads to the filtering proxy.

Before a call's command runs (bwrap holds it on its block fd), :func:`attach` gives the call's
network namespace a veth pair made with pyroute2: the jail's end (``eth0``, an address of its own
in ``198.19.0.0/16``) routes everything to the host's end, whose address is :data:`HOST_IP` (the
same /32 on every pair: the proxy's transparent listeners bind it once, with ``IP_FREEBIND``).
nftables rules inside the jail's namespace (never the host's) send TCP 80 and 443 to the proxy's
transparent HTTP and TLS listeners, which take the destination from the Host header or the TLS
SNI, and DNS (UDP and TCP 53) to the filtering DNS server, which answers only names the policy
allows; everything else leaving the namespace is dropped (other ports, other UDP, ICMP).

The pair dies with the namespace; :func:`detach` removes the host's end early when a start fails.
``198.18.0.0/15`` is the benchmarking range (RFC 2544): no real network uses it.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import itertools
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass

from sandbox.errors import BackendUnavailable

HOST_IP = "198.18.0.1"
JAIL_NET = ipaddress.IPv4Network("198.19.0.0/16")
_PREFIX = "sbxt"
_counter = itertools.count(1)
_lock = threading.Lock()


@dataclass(frozen=True)
class Ports:
    """Where the host listens for a transparent jail: HTTP, TLS and DNS on :data:`HOST_IP`."""

    http: int
    tls: int
    dns: int


def available() -> str | None:
    """``None`` when this host can make transparent jails, else why not."""
    if os.geteuid() != 0:
        return "needs root: a veth pair and nftables rules in the call's network namespace"
    for tool, package in (("nft", "nftables"), ("ip", "iproute2"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} (Debian package {package}) is not installed"
    if importlib.util.find_spec("pyroute2") is None:
        return "pyroute2 is not installed (pip install pyroute2)"
    return None


def attach(pid: int, ports: Ports) -> str:
    """Give the network namespace of ``pid`` its one way out; returns the host end's name."""
    from pyroute2 import IPRoute  # type: ignore[import-untyped]

    with _lock:
        number = (os.getpid() * 1000 + next(_counter)) % (JAIL_NET.num_addresses - 2) + 1
    host_end, jail_end = f"{_PREFIX}{number:x}", f"{_PREFIX}{number:x}j"
    jail_ip = str(JAIL_NET[number])
    try:
        with IPRoute() as ipr:
            ipr.link("add", ifname=host_end, kind="veth", peer=jail_end)
            host_index = ipr.link_lookup(ifname=host_end)[0]
            jail_index = ipr.link_lookup(ifname=jail_end)[0]
            ipr.link("set", index=jail_index, net_ns_pid=pid)
            ipr.addr("add", index=host_index, address=HOST_IP, prefixlen=32)
            ipr.link("set", index=host_index, state="up")
            ipr.route("add", dst=f"{jail_ip}/32", oif=host_index)
        _inside(pid, jail_end, jail_ip, ports)
    except BaseException:
        detach(host_end)
        raise
    return host_end


def detach(host_end: str) -> None:
    """Remove the host's end (and so the pair) if it still exists."""
    from pyroute2 import IPRoute

    try:
        with IPRoute() as ipr:
            found = ipr.link_lookup(ifname=host_end)
            if found:
                ipr.link("del", index=found[0])
    except Exception:
        return


def ruleset(ports: Ports) -> str:
    """The nftables rules of a transparent jail's namespace."""
    to = HOST_IP
    return f"""
table inet sandbox {{
    chain nat_out {{
        type nat hook output priority -100; policy accept;
        udp dport 53 dnat ip to {to}:{ports.dns}
        tcp dport 53 dnat ip to {to}:{ports.dns}
        ip daddr 127.0.0.0/8 return
        tcp dport 80 dnat ip to {to}:{ports.http}
        tcp dport 443 dnat ip to {to}:{ports.tls}
    }}
    chain filter_out {{
        type filter hook output priority 0; policy drop;
        oifname "lo" accept
        ip daddr {to} tcp dport {{ {ports.http}, {ports.tls}, {ports.dns} }} accept
        ip daddr {to} udp dport {ports.dns} accept
        meta l4proto tcp reject with tcp reset
        reject
    }}
}}
"""


def _inside(pid: int, jail_end: str, jail_ip: str, ports: Ports) -> None:
    """The namespace's side, in one ``nsenter``: its end named ``eth0`` and up, the address, the
    routes (the host's /32, and everything else on the link: after DNAT all of it goes there)
    and the rules. One process instead of a pyroute2 helper per namespace: tens of milliseconds."""
    script = (
        f"ip link set {jail_end} name eth0 up && ip addr add {jail_ip}/32 dev eth0 && "
        f"ip route add {HOST_IP}/32 dev eth0 && ip route add default dev eth0 scope link && nft -f -"
    )
    done = subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", "sh", "-c", script],
        input=ruleset(ports),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise BackendUnavailable(f"cannot give the transparent jail its way out: {done.stderr.strip()}")
