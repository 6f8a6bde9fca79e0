"""The egress policy: which destinations a jailed tool may reach, judged by name and by address.

A pattern is one of::

    example.com            that name exactly (case-insensitive, a trailing dot ignored)
    *.example.com          its subdomains, at any depth, never ``example.com`` itself
    example.com:8443       a name on one port (likewise ``*.example.com:8443``)
    192.0.2.7              an IPv4 address; ``[2001:db8::1]`` or ``2001:db8::1`` an IPv6 one
    192.0.2.0/24           a network; ``[2001:db8::]/32:8443`` with a port

A pattern without a port means ports 80 and 443. Deny wins over allow. A name pattern never
matches an IP literal: a tool that connects to an address directly needs an address rule.

Names are judged first (:meth:`EgressPolicy.decide`); the addresses a name resolves to are judged
again (:meth:`EgressPolicy.check_address`), because a public name can resolve to loopback, a
private network or the cloud metadata service (DNS rebinding). Such an address is refused unless
an address rule allows it explicitly, on that port.

The ``allowlist`` mode's allow patterns are the profile's ``network.allow`` and its
``policy.trusted.domains`` (seed 004: a trusted domain is one the classifier does not judge a fetch
of, and one the jail may reach), merged here and only here (:func:`allowlist`,
:func:`sandbox.network.egress.for_profile`); the classifier's fetch exemption matches a URL with :func:`trusted_rule`,
so both sides read the same patterns the same way.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox.errors import InvalidArgument

if TYPE_CHECKING:
    from sandbox.vocabulary import EgressRuleKind, VerdictReason

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


DEFAULT_PORTS: frozenset[int] = frozenset({80, 443})

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_SPECIAL_KINDS: tuple[tuple[str, str], ...] = (
    ("is_unspecified", "unspecified"),
    ("is_loopback", "loopback"),
    ("is_link_local", "link-local"),
    ("is_multicast", "multicast"),
    ("is_private", "private"),
    ("is_reserved", "reserved"),
)
_METADATA = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})


@dataclass(frozen=True)
class Verdict:
    """The policy's word on a destination: ``allowed`` is ``None`` when no rule knows it."""

    allowed: bool | None
    rule: str | None
    reason: VerdictReason
    message: str


@dataclass(frozen=True)
class Rule:
    """One parsed pattern; ``text`` is the pattern as written, reported in verdicts."""

    text: str
    kind: EgressRuleKind
    ports: frozenset[int]
    name: str = ""
    network: IPNetwork | None = None

    def matches_name(self, host: str, port: int) -> bool:
        if port not in self.ports:
            return False
        if self.kind == "name":
            return host == self.name
        return self.kind == "subdomains" and host.endswith("." + self.name)

    def matches_address(self, ip: IPAddress, port: int) -> bool:
        return self.network is not None and port in self.ports and ip in self.network


_RuleTest = Callable[[Rule], bool]


@dataclass(frozen=True)
class EgressPolicy:
    """Immutable allow and deny rules; build it with :meth:`from_patterns`."""

    allow: tuple[Rule, ...] = ()
    deny: tuple[Rule, ...] = ()
    ask: bool = False

    @classmethod
    def from_patterns(cls, allow: Iterable[str] = (), deny: Iterable[str] = (), *, ask: bool = False) -> EgressPolicy:
        """Parse the patterns; an invalid one raises :class:`InvalidArgument` naming it."""
        return cls(tuple(parse_rule(p) for p in allow), tuple(parse_rule(p) for p in deny), ask)

    @property
    def allow_patterns(self) -> list[str]:
        return [rule.text for rule in self.allow]

    @property
    def deny_patterns(self) -> list[str]:
        return [rule.text for rule in self.deny]

    def decide(self, host: str, port: int) -> Verdict:
        """Judge a destination as requested: a name by the name rules, an IP literal by the address rules."""
        ip = literal_address(host)
        if ip is not None:
            return self._decide_address(ip, port)
        try:
            name = normalize_host(host)
        except InvalidArgument:
            return Verdict(False, None, "bad-request", f"{host!r} is not a valid host name")
        where = f"{name}:{port}"
        rule = _first(self.deny, lambda r: r.matches_name(name, port))
        if rule is not None:
            return Verdict(False, rule.text, "denied", f"{where} is denied by rule {rule.text!r}")
        rule = _first(self.allow, lambda r: r.matches_name(name, port))
        if rule is not None:
            return Verdict(True, rule.text, "allowed", f"{where} is allowed by rule {rule.text!r}")
        return Verdict(None, None, "not-allowed", f"{where} is not on the allowlist")

    def check_address(self, ip: IPAddress, port: int, *, name_rule: str | None) -> Verdict:
        """Judge an address a name resolved to (``name_rule`` admitted the name).

        Deny rules apply; a loopback, private, link-local, metadata, unspecified, multicast or
        reserved address needs an allow rule covering it on ``port``; any other is allowed.
        """
        ip = _unmapped(ip)
        where = _address_text(ip, port)
        rule = _first(self.deny, lambda r: r.matches_address(ip, port))
        if rule is not None:
            return Verdict(False, rule.text, "denied", f"{where} is denied by rule {rule.text!r}")
        kind = special_kind(ip)
        if kind is None:
            return Verdict(True, name_rule, "allowed", f"{where} is a public address")
        rule = _first(self.allow, lambda r: r.matches_address(ip, port))
        if rule is not None:
            return Verdict(True, rule.text, "allowed", f"{kind} address {where} is allowed by rule {rule.text!r}")
        message = f"{ip} is a {kind} address; allow {where} explicitly to reach it"
        return Verdict(False, name_rule, "private-address", message)

    def _decide_address(self, ip: IPAddress, port: int) -> Verdict:
        ip = _unmapped(ip)
        where = _address_text(ip, port)
        rule = _first(self.deny, lambda r: r.matches_address(ip, port))
        if rule is not None:
            return Verdict(False, rule.text, "denied", f"{where} is denied by rule {rule.text!r}")
        rule = _first(self.allow, lambda r: r.matches_address(ip, port))
        if rule is not None:
            return Verdict(True, rule.text, "allowed", f"{where} is allowed by rule {rule.text!r}")
        return Verdict(None, None, "not-allowed", f"{where} is not on the allowlist (an address needs an address rule)")


def allowlist(allow: Iterable[str], trusted_domains: Iterable[str]) -> tuple[str, ...]:
    """The allow patterns of the ``allowlist`` mode: ``allow`` then the trusted domains, each once."""
    return tuple(dict.fromkeys((*allow, *trusted_domains)))


def trusted_rule(host: str, port: int, patterns: Iterable[str]) -> str | None:
    """The first of ``patterns`` (egress patterns: the profile's trusted domains) admitting
    ``host:port`` as :meth:`EgressPolicy.decide` would, or ``None``. An invalid pattern admits nothing."""
    ip = literal_address(host)
    try:
        name = None if ip is not None else normalize_host(host)
    except InvalidArgument:
        return None
    for pattern in patterns:
        try:
            rule = parse_rule(pattern)
        except InvalidArgument:
            continue
        if rule.matches_address(ip, port) if ip is not None else rule.matches_name(name or "", port):
            return rule.text
    return None


def parse_rule(pattern: str) -> Rule:
    """One pattern, see the module docstring; :class:`InvalidArgument` names a bad one."""
    text = pattern.strip()
    try:
        host, ports = _split_port(text)
        network = _network(host)
        if network is not None:
            return Rule(text, "address", ports, network=network)
        if host.startswith("*."):
            if literal_address(host[2:]) is not None:
                raise ValueError("'*.' needs a name, not an address")
            return Rule(text, "subdomains", ports, name=normalize_host(host[2:]))
        return Rule(text, "name", ports, name=normalize_host(host))
    except (ValueError, InvalidArgument) as exc:
        why = exc.message if isinstance(exc, InvalidArgument) else str(exc)
        raise InvalidArgument(f"invalid network pattern {pattern!r}: {why}", pattern=pattern) from None


def normalize_host(host: str) -> str:
    """Lower case, no trailing dot, IDNA-encoded; :class:`InvalidArgument` for anything not a DNS name."""
    name = host.strip().rstrip(".").lower()
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError:
            raise InvalidArgument(f"{host!r} is not a valid host name", host=host) from None
    if len(name) > 253 or not all(_LABEL.match(label) for label in name.split(".")):
        raise InvalidArgument(f"{host!r} is not a valid host name", host=host)
    return name


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` spells (``[v6]`` brackets allowed), else ``None``."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return _unmapped(ipaddress.ip_address(text))
    except ValueError:
        return None


def special_kind(ip: IPAddress) -> str | None:
    """What makes ``ip`` unfit for a public name to resolve to (``"loopback"``, ...), or ``None``."""
    ip = _unmapped(ip)
    if ip in _METADATA:
        return "cloud-metadata"
    for attribute, kind in _SPECIAL_KINDS:
        if getattr(ip, attribute):
            return kind
    return None if ip.is_global else "non-global"


def _split_port(text: str) -> tuple[str, frozenset[int]]:
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError("unclosed '['")
        host, rest = text[1:end], text[end + 1 :]
        if rest.startswith("/"):
            prefix, _, port = rest[1:].partition(":")
            return f"{host}/{prefix}", _port(port) if port else DEFAULT_PORTS
        if rest and not rest.startswith(":"):
            raise ValueError("expected ':port' after ']'")
        return host, _port(rest[1:]) if rest else DEFAULT_PORTS
    if text.count(":") > 1:  # a bare IPv6 address or network: no port without brackets
        return text, DEFAULT_PORTS
    host, colon, port = text.partition(":")
    return host, _port(port) if colon else DEFAULT_PORTS


def _port(text: str) -> frozenset[int]:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"port {text!r} is not a number from 1 to 65535")
    return frozenset({int(text)})


def _network(host: str) -> IPNetwork | None:
    if "/" in host:
        return ipaddress.ip_network(host, strict=True)
    ip = literal_address(host)
    return None if ip is None else ipaddress.ip_network(ip)


def _unmapped(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _address_text(ip: IPAddress, port: int) -> str:
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _first(rules: tuple[Rule, ...], test: _RuleTest) -> Rule | None:
    return next((rule for rule in rules if test(rule)), None)
