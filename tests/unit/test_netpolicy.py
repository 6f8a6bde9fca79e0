"""The egress policy's patterns, verdicts and address checks; the ClientHello parser; the resolvers' fakes."""

from __future__ import annotations

import ipaddress
import ssl

import anyio
import pytest

from sandbox.errors import InvalidArgument
from sandbox.network.egress import for_profile
from sandbox.network.policy import (
    EgressPolicy,
    IPAddress,
    allowlist,
    parse_rule,
    special_kind,
    trusted_rule,
)
from sandbox.network.resolve import CachedResolver, DnsResolver, StaticResolver, SystemResolver, resolver_from_env
from sandbox.network.tls import IncompleteHello, NotClientHello, client_hello_sni
from sandbox.network.upstream import upstream_from_env
from sandbox.profile import Profile


def policy(*allow: str, deny: tuple[str, ...] = (), ask: bool = False) -> EgressPolicy:
    return EgressPolicy.from_patterns(allow, deny, ask=ask)


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


# -- patterns ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pattern", "kind", "ports"),
    [
        ("example.com", "name", {80, 443}),
        ("Example.COM.", "name", {80, 443}),
        ("*.example.com", "subdomains", {80, 443}),
        ("example.com:8443", "name", {8443}),
        ("*.example.com:22", "subdomains", {22}),
        ("192.0.2.7", "address", {80, 443}),
        ("192.0.2.7:5432", "address", {5432}),
        ("192.0.2.0/24", "address", {80, 443}),
        ("192.0.2.0/24:8080", "address", {8080}),
        ("2001:db8::1", "address", {80, 443}),
        ("[2001:db8::1]", "address", {80, 443}),
        ("[2001:db8::1]:8443", "address", {8443}),
        ("2001:db8::/32", "address", {80, 443}),
        ("[2001:db8::]/32:8443", "address", {8443}),
        ("bücher.example", "name", {80, 443}),
    ],
)
def test_valid_patterns(pattern: str, kind: str, ports: set[int]) -> None:
    rule = parse_rule(pattern)
    assert (rule.kind, set(rule.ports), rule.text) == (kind, ports, pattern)


def test_names_are_normalised() -> None:
    assert parse_rule("Example.COM.").name == "example.com"
    assert parse_rule("bücher.example").name == "xn--bcher-kva.example"


@pytest.mark.parametrize(
    "pattern",
    [
        "",
        "*",
        "*.",
        "ex ample.com",
        "example.com:0",
        "example.com:65536",
        "example.com:http",
        "example.com:",
        "a.*.example.com",
        "example.*",
        "*.192.0.2.7",
        "192.0.2.1/24",  # host bits set: not a network
        "192.0.2.0/33",
        "[2001:db8::1",
        "[2001:db8::1]x",
        "-bad.example",
        "a" * 64 + ".example",
        "http://example.com",
    ],
)
def test_invalid_patterns_name_the_pattern(pattern: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        EgressPolicy.from_patterns([pattern])
    assert repr(pattern) in caught.value.message
    assert caught.value.data == {"pattern": pattern}


def test_invalid_deny_pattern_is_refused_too() -> None:
    with pytest.raises(InvalidArgument, match="bad pattern"):
        EgressPolicy.from_patterns([], ["bad pattern"])


def test_policy_is_immutable_and_reports_its_patterns() -> None:
    p = policy("a.example", "*.b.example:8443", deny=("c.example",))
    with pytest.raises(AttributeError):
        p.ask = True  # type: ignore[misc]
    assert (p.allow_patterns, p.deny_patterns) == (["a.example", "*.b.example:8443"], ["c.example"])


# -- decide on names ----------------------------------------------------------------------------
def test_exact_name_is_case_insensitive_and_ignores_the_trailing_dot() -> None:
    p = policy("example.com")
    for host in ("example.com", "EXAMPLE.com", "example.com."):
        verdict = p.decide(host, 443)
        assert (verdict.allowed, verdict.rule, verdict.reason) == (True, "example.com", "allowed")


def test_exact_name_does_not_cover_subdomains_or_lookalikes() -> None:
    p = policy("example.com")
    for host in ("www.example.com", "badexample.com", "example.com.evil.net", "example.co"):
        assert p.decide(host, 443).allowed is None


def test_wildcard_covers_subdomains_only() -> None:
    p = policy("*.example.com")
    assert p.decide("a.example.com", 443).allowed is True
    assert p.decide("a.b.example.com", 80).allowed is True
    assert p.decide("example.com", 443).allowed is None
    assert p.decide("badexample.com", 443).allowed is None


def test_no_port_means_80_and_443() -> None:
    p = policy("example.com")
    assert p.decide("example.com", 80).allowed is True
    assert p.decide("example.com", 443).allowed is True
    assert p.decide("example.com", 8080).allowed is None


def test_port_rule_allows_only_that_port() -> None:
    p = policy("example.com:8443", "*.example.com:22")
    assert p.decide("example.com", 8443).allowed is True
    assert p.decide("example.com", 443).allowed is None
    assert p.decide("git.example.com", 22).allowed is True
    assert p.decide("git.example.com", 443).allowed is None


def test_deny_wins_over_allow() -> None:
    p = policy("*.example.com", deny=("evil.example.com",))
    verdict = p.decide("evil.example.com", 443)
    assert (verdict.allowed, verdict.rule, verdict.reason) == (False, "evil.example.com", "denied")
    assert "evil.example.com" in verdict.message
    assert p.decide("good.example.com", 443).allowed is True


def test_unknown_destination_is_not_allowed_with_a_sentence() -> None:
    verdict = policy("example.com").decide("other.net", 443)
    assert (verdict.allowed, verdict.rule, verdict.reason) == (None, None, "not-allowed")
    assert "other.net:443" in verdict.message


def test_invalid_requested_host_is_a_bad_request() -> None:
    verdict = policy("example.com").decide("exa mple.com", 443)
    assert (verdict.allowed, verdict.reason) == (False, "bad-request")


# -- decide on IP literals ----------------------------------------------------------------------
def test_ip_literal_needs_an_address_rule() -> None:
    p = policy("192.0.2.7", "198.51.100.0/24:8080", "[2001:db8::1]:8443")
    assert p.decide("192.0.2.7", 443).rule == "192.0.2.7"
    assert p.decide("192.0.2.7", 8080).allowed is None
    assert p.decide("198.51.100.9", 8080).rule == "198.51.100.0/24:8080"
    assert p.decide("198.51.101.9", 8080).allowed is None
    assert p.decide("[2001:db8::1]", 8443).allowed is True
    assert p.decide("2001:db8::1", 8443).allowed is True
    assert p.decide("2001:db8::2", 8443).allowed is None


def test_name_rules_never_match_an_ip_literal() -> None:
    assert policy("*.example.com", "example.com").decide("93.184.216.34", 443).allowed is None


def test_ipv4_mapped_ipv6_literal_is_judged_as_ipv4() -> None:
    p = policy("192.0.2.7", deny=("127.0.0.0/8",))
    assert p.decide("::ffff:192.0.2.7", 443).allowed is True
    assert p.decide("[::ffff:127.0.0.1]", 443).allowed is False


def test_deny_cidr_wins_over_allowed_literal() -> None:
    verdict = policy("192.0.2.7", deny=("192.0.2.0/24",)).decide("192.0.2.7", 443)
    assert (verdict.allowed, verdict.rule) == (False, "192.0.2.0/24")


# -- addresses a name resolved to (the rebinding defence) ----------------------------------------------
@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd12:3456::1", "private"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("169.254.169.254", "cloud-metadata"),
        ("fd00:ec2::254", "cloud-metadata"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "private"),
        ("100.64.0.1", "non-global"),
        ("::ffff:127.0.0.1", "loopback"),
    ],
)
def test_special_addresses_are_classified(address: str, kind: str) -> None:
    assert special_kind(ip(address)) == kind


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "8.8.8.8"])
def test_public_addresses_are_not_special(address: str) -> None:
    assert special_kind(ip(address)) is None


def test_name_resolving_to_a_public_address_is_allowed_under_the_name_rule() -> None:
    verdict = policy("example.com").check_address(ip("93.184.216.34"), 443, name_rule="example.com")
    assert (verdict.allowed, verdict.rule) == (True, "example.com")


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.5", "169.254.169.254", "fd00:ec2::254", "::1", "0.0.0.0"])
def test_name_resolving_to_a_special_address_is_refused(address: str) -> None:
    verdict = policy("example.com").check_address(ip(address), 443, name_rule="example.com")
    assert (verdict.allowed, verdict.reason, verdict.rule) == (False, "private-address", "example.com")
    assert address in verdict.message


def test_special_address_allowed_explicitly_passes() -> None:
    p = policy("intranet.example", "10.0.0.5", "127.0.0.0/8:8080")
    assert p.check_address(ip("10.0.0.5"), 443, name_rule="intranet.example").rule == "10.0.0.5"
    assert p.check_address(ip("127.3.2.1"), 8080, name_rule=None).rule == "127.0.0.0/8:8080"


def test_explicit_address_rule_covers_only_its_ports() -> None:
    verdict = policy("10.0.0.5").check_address(ip("10.0.0.5"), 8080, name_rule="intranet.example:8080")
    assert (verdict.allowed, verdict.reason) == (False, "private-address")


def test_deny_cidr_applies_to_resolved_public_addresses() -> None:
    verdict = policy("example.com", deny=("93.184.216.0/24",)).check_address(ip("93.184.216.34"), 443, name_rule="x")
    assert (verdict.allowed, verdict.reason, verdict.rule) == (False, "denied", "93.184.216.0/24")


# -- the ClientHello parser ---------------------------------------------------------------------------
def client_hello(server_name: str | None) -> bytes:
    """A real ClientHello from the ssl module, never sent anywhere."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_sni_is_read_from_a_real_client_hello() -> None:
    assert client_hello_sni(client_hello("api.example.com")) == "api.example.com"


def test_client_hello_without_sni() -> None:
    hello = client_hello(None)
    assert client_hello_sni(hello) is None


def test_incomplete_client_hello_asks_for_more() -> None:
    hello = client_hello("api.example.com")
    for cut in (1, 4, 5, 40, len(hello) - 1):
        with pytest.raises(IncompleteHello):
            client_hello_sni(hello[:cut])


def test_client_hello_split_over_two_records() -> None:
    hello = client_hello("split.example.com")
    body = hello[5:]
    first, second = body[:50], body[50:]
    records = b"".join(b"\x16\x03\x01" + len(part).to_bytes(2, "big") + part for part in (first, second))
    assert client_hello_sni(records) == "split.example.com"


@pytest.mark.parametrize("data", [b"GET / HTTP/1.1\r\n", b"SSH-2.0-OpenSSH\r\n", b"\x16\x01xyz", b"\x00"])
def test_non_tls_bytes_are_not_a_client_hello(data: bytes) -> None:
    with pytest.raises(NotClientHello):
        client_hello_sni(data)


def test_malformed_client_hello_is_an_error() -> None:
    garbage = b"\x16\x03\x01\x00\x08\x01\x00\x00\x04\x03\x03\x00\x00"
    with pytest.raises(ValueError, match="truncated"):
        client_hello_sni(garbage)


def test_handshake_message_other_than_client_hello_is_an_error() -> None:
    record = b"\x16\x03\x01\x00\x04\x02\x00\x00\x00"
    with pytest.raises(ValueError, match="not a ClientHello"):
        client_hello_sni(record)


# -- environment ----------------------------------------------------------------------------------
def test_resolver_from_env() -> None:
    assert isinstance(resolver_from_env({}), SystemResolver)
    dns = resolver_from_env({"SANDBOX_NET_RESOLVER": "127.0.0.1:5353"})
    assert isinstance(dns, DnsResolver)
    assert (dns.server, dns.port) == ("127.0.0.1", 5353)
    v6 = resolver_from_env({"SANDBOX_NET_RESOLVER": "[::1]:53"})
    assert isinstance(v6, DnsResolver)
    assert (v6.server, v6.port) == ("::1", 53)
    with pytest.raises(InvalidArgument, match="SANDBOX_NET_RESOLVER"):
        resolver_from_env({"SANDBOX_NET_RESOLVER": "dns.example:53"})


def test_upstream_from_env_prefers_https_proxy_and_takes_only_http() -> None:
    env = {"HTTP_PROXY": "http://h:3128", "HTTPS_PROXY": "http://s:3128", "ALL_PROXY": "http://a:1"}
    assert upstream_from_env(env) == "http://s:3128"
    assert upstream_from_env({"ALL_PROXY": "http://a:1"}) == "http://a:1"
    assert upstream_from_env({}) is None
    with pytest.raises(InvalidArgument, match="only http://"):
        upstream_from_env({"HTTPS_PROXY": "socks5://s:1080"})


@pytest.mark.anyio
async def test_static_resolver() -> None:
    resolver = StaticResolver({"A.example.": ["192.0.2.1", "2001:db8::1"]})
    assert await resolver.resolve("a.example") == [ip("192.0.2.1"), ip("2001:db8::1")]
    assert await resolver.resolve("b.example") == []


class _Counting:
    def __init__(self, answers: list[list[str]]) -> None:
        self.answers, self.asked = answers, 0

    async def resolve(self, host: str) -> list[IPAddress]:  # noqa: ARG002 - every name alike
        self.asked += 1
        return [ipaddress.ip_address(a) for a in self.answers[min(self.asked, len(self.answers)) - 1]]


def test_a_cached_resolver_keeps_answers_for_its_ttl_and_never_an_empty_one() -> None:
    async def scenario() -> None:
        inner = _Counting([[], ["192.0.2.7"], ["192.0.2.8"]])
        cached = CachedResolver(inner, ttl=3600)
        assert await cached.resolve("a.example") == []  # no address: asked again next time
        assert await cached.resolve("A.example.") == [ipaddress.ip_address("192.0.2.7")]
        assert await cached.resolve("a.example") == [ipaddress.ip_address("192.0.2.7")]
        assert inner.asked == 2
        expired = CachedResolver(inner, ttl=0)
        await expired.resolve("a.example")
        await expired.resolve("a.example")
        assert inner.asked == 4

    anyio.run(scenario)


# -- seed 004's trusted.domains, shared with the allowlist ------------------------------------


def _profile(allow: tuple[str, ...] = (), deny: tuple[str, ...] = (), trusted: tuple[str, ...] = ()) -> Profile:
    return Profile.model_validate(
        {
            "network": {"mode": "allowlist", "allow": list(allow), "deny": list(deny)},
            "policy": {"trusted": {"domains": list(trusted)}},
        }
    )


def test_the_allowlist_merges_the_trusted_domains_once() -> None:
    assert allowlist(("pypi.org", "*.corp.test"), ("*.corp.test", "wiki.corp.test")) == (
        "pypi.org",
        "*.corp.test",
        "wiki.corp.test",
    )
    plain = _profile(allow=("pypi.org",))
    assert for_profile(plain) is plain.network  # nothing to merge: the profile's own section
    merged = for_profile(_profile(allow=("pypi.org",), trusted=("wiki.corp.test", "pypi.org")))
    assert merged.allow == ("pypi.org", "wiki.corp.test") and merged.mode == "allowlist"


def test_a_trusted_domain_is_allowed_by_the_proxy_and_exempt_for_fetches() -> None:
    from sandbox.policy.exemptions import public_fetch

    profile = _profile(allow=("pypi.org",), deny=("secret.corp.test",), trusted=("*.corp.test", "10.0.0.0/8:8080"))
    network = for_profile(profile)
    egress = EgressPolicy.from_patterns(network.allow, network.deny, ask=network.ask)
    trusted = profile.policy.trusted.domains
    cases = [
        ("wiki.corp.test", 443, True),
        ("a.b.corp.test", 80, True),
        ("corp.test", 443, False),  # *.x: subdomains only, on both sides
        ("wiki.corp.test", 8443, False),  # no port: 80 and 443 only
        ("10.1.2.3", 8080, True),
        ("10.1.2.3", 443, False),
        ("evilcorp.test", 443, False),
    ]
    for host, port, allowed in cases:
        assert egress.decide(host, port).allowed is (True if allowed else None), (host, port)
        url = f"http://{host}:{port}/"
        found = public_fetch("fetch_content", {"url": url}, trusted, read_only_web_fetch=False)
        assert (found is not None) is allowed, url
    # The profile's deny still wins in the proxy, trusted or not.
    assert egress.decide("secret.corp.test", 443).allowed is False
    # A private address a trusted name resolves to needs an address rule, as for any allowed name.
    assert egress.check_address(ip("10.9.9.9"), 443, name_rule="*.corp.test").allowed is False


def test_an_untrusted_profile_allows_nothing_more() -> None:
    network = for_profile(_profile(allow=("pypi.org",)))
    egress = EgressPolicy.from_patterns(network.allow, network.deny)
    assert egress.decide("wiki.corp.test", 443).allowed is None


def test_trusted_rule_reads_egress_patterns() -> None:
    assert trusted_rule("wiki.corp.test", 443, ["*.corp.test"]) == "*.corp.test"
    assert trusted_rule("WIKI.corp.test.", 443, ["wiki.corp.test"]) == "wiki.corp.test"
    assert trusted_rule("[2001:db8::1]", 443, ["2001:db8::/32"]) == "2001:db8::/32"
    assert trusted_rule("wiki.corp.test", 443, ["not a pattern", "10.0.0.0/8"]) is None  # invalid admits nothing
    assert trusted_rule("bad host!", 443, ["*.corp.test"]) is None
