"""The filtering DNS server's answers, one query at a time, without sockets (:meth:`FilteringDns.reply`).

Names resolve through a :class:`StaticResolver`; the wire format is dnspython's on both sides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdatatype
import pytest

from sandbox.network.dnsfilter import TTL, UNRESOLVED, FilteringDns
from sandbox.network.policy import EgressPolicy
from sandbox.network.proxy import EgressProxy
from sandbox.network.resolve import StaticResolver

if TYPE_CHECKING:
    from sandbox.network.denial import Denial
    from sandbox.network.policy import IPAddress

pytestmark = pytest.mark.anyio

NAMES = {
    "good.test": ["93.184.216.34", "2606:2800:220:1::1"],
    "a.good.test": ["93.184.216.35"],
    "v4only.test": ["93.184.216.36"],
    "rebind.test": ["127.0.0.1"],
    "metadata.test": ["169.254.169.254"],
    "mixed.test": ["10.0.0.7", "93.184.216.37"],
    "many.test": [f"93.184.{i}.{j}" for i in range(1, 5) for j in range(1, 26)],
    "empty.test": [],
}


def server(allow: list[str], deny: list[str] | None = None, *, ask: bool = False) -> FilteringDns:
    policy = EgressPolicy.from_patterns(allow, deny or [], ask=ask)
    return FilteringDns(policy, StaticResolver(NAMES), bind=("127.0.0.1", 0))


async def ask(dns_server: FilteringDns, name: str, rdtype: str = "A", *, edns: int = 0) -> dns.message.Message:
    """Ask over "UDP"; ``edns``: the payload size the query offers (0: no EDNS)."""
    query = dns.message.make_query(name, rdtype, use_edns=0 if edns else None, payload=edns or 1232)
    wire = await dns_server.reply(query.to_wire(), udp=True)
    assert wire is not None
    reply = dns.message.from_wire(wire)
    assert reply.id == query.id and reply.flags & dns.flags.QR
    return reply


def addresses(reply: dns.message.Message) -> list[str]:
    return [record.to_text() for rrset in reply.answer for record in rrset]


async def test_allowed_name_gets_its_addresses_of_the_asked_family() -> None:
    dns_server = server(["good.test"])
    v4, v6 = await ask(dns_server, "good.test"), await ask(dns_server, "good.test", "AAAA")
    assert (v4.rcode(), addresses(v4), addresses(v6)) == (dns.rcode.NOERROR, ["93.184.216.34"], ["2606:2800:220:1::1"])
    assert v4.answer[0].ttl == TTL
    assert dns_server.denials == []


async def test_a_name_allowed_on_80_or_443_alone_is_answered() -> None:
    for pattern in ("good.test:80", "good.test:443"):
        assert addresses(await ask(server([pattern]), "good.test")) == ["93.184.216.34"]


async def test_a_name_allowed_only_on_another_port_is_refused() -> None:
    dns_server = server(["good.test:8443"])
    assert (await ask(dns_server, "good.test")).rcode() == dns.rcode.REFUSED
    assert [d.reason for d in dns_server.denials] == ["not-allowed"]


async def test_refused_name_is_refused_with_one_denial_on_port_53() -> None:
    dns_server = server(["good.test"])
    reply = await ask(dns_server, "other.test")
    assert (reply.rcode(), reply.answer) == (dns.rcode.REFUSED, [])
    [denial] = dns_server.denials
    assert (denial.host, denial.port, denial.reason, denial.rule) == ("other.test", 53, "not-allowed", None)
    assert "other.test" in denial.line()


async def test_deny_rule_wins_and_is_named() -> None:
    dns_server = server(["*.good.test"], ["bad.good.test"])
    assert addresses(await ask(dns_server, "a.good.test")) == ["93.184.216.35"]
    assert (await ask(dns_server, "bad.good.test")).rcode() == dns.rcode.REFUSED
    assert [(d.reason, d.rule) for d in dns_server.denials] == [("denied", "bad.good.test")]


async def test_wildcard_does_not_admit_the_name_itself() -> None:
    dns_server = server(["*.good.test"])
    assert (await ask(dns_server, "good.test")).rcode() == dns.rcode.REFUSED


async def test_rebinding_addresses_are_left_out_with_a_denial() -> None:
    dns_server = server(["metadata.test", "rebind.test", "mixed.test"])
    for name in ("metadata.test", "rebind.test"):
        reply = await ask(dns_server, name)
        assert (reply.rcode(), reply.answer) == (dns.rcode.NOERROR, [])
    assert addresses(await ask(dns_server, "mixed.test")) == ["93.184.216.37"]
    assert [(d.host, d.port, d.reason) for d in dns_server.denials] == [
        ("metadata.test", 53, "private-address"),
        ("rebind.test", 53, "private-address"),
        ("mixed.test", 53, "private-address"),
    ]
    assert "169.254.169.254" in dns_server.denials[0].message


async def test_an_explicitly_allowed_private_address_is_answered() -> None:
    dns_server = server(["rebind.test", "127.0.0.1:443"])
    assert addresses(await ask(dns_server, "rebind.test")) == ["127.0.0.1"]
    assert dns_server.denials == []


async def test_other_record_types_of_an_allowed_name_are_empty() -> None:
    dns_server = server(["good.test"])
    for rdtype in ("MX", "TXT", "SRV", "ANY"):
        reply = await ask(dns_server, "good.test", rdtype)
        assert (reply.rcode(), reply.answer) == (dns.rcode.NOERROR, [])
    assert (await ask(dns_server, "other.test", "TXT")).rcode() == dns.rcode.REFUSED


async def test_unknown_name_is_answered_unresolved_when_the_policy_asks_and_no_one_is_asked_yet() -> None:
    dns_server = server([], ask=True)  # not resolved before the user allows it (issue 31, category 6)
    assert addresses(await ask(dns_server, "good.test")) == [UNRESOLVED]
    assert addresses(await ask(dns_server, "good.test", "AAAA")) == []
    assert addresses(await ask(dns_server, "rebind.test")) == [UNRESOLVED]  # the proxy checks it once allowed
    assert dns_server.denials == []


async def test_deny_rule_refuses_even_when_the_policy_asks() -> None:
    dns_server = server([], ["good.test"], ask=True)
    assert (await ask(dns_server, "good.test")).rcode() == dns.rcode.REFUSED
    assert [d.reason for d in dns_server.denials] == ["denied"]


async def test_no_address_is_nxdomain_and_no_address_of_the_family_is_empty() -> None:
    dns_server = server(["empty.test", "v4only.test", "nowhere.test"])
    assert (await ask(dns_server, "empty.test")).rcode() == dns.rcode.NXDOMAIN
    assert (await ask(dns_server, "nowhere.test")).rcode() == dns.rcode.NXDOMAIN
    reply = await ask(dns_server, "v4only.test", "AAAA")
    assert (reply.rcode(), reply.answer) == (dns.rcode.NOERROR, [])
    assert dns_server.denials == []


async def test_a_failing_resolver_is_servfail() -> None:
    class Broken:
        async def resolve(self, host: str) -> list[IPAddress]:
            raise OSError(f"no DNS for {host}")

    dns_server = FilteringDns(EgressPolicy.from_patterns(["good.test"]), Broken(), bind=("127.0.0.1", 0))
    assert (await ask(dns_server, "good.test")).rcode() == dns.rcode.SERVFAIL


async def test_reverse_lookups_are_nxdomain_without_a_denial() -> None:
    dns_server = server([])
    reply = await ask(dns_server, "1.0.0.127.in-addr.arpa", "PTR")
    assert reply.rcode() == dns.rcode.NXDOMAIN
    assert dns_server.denials == []


async def test_the_question_is_echoed_with_its_case() -> None:
    reply = await ask(server(["good.test"]), "GoOd.TeSt")
    assert reply.question[0].name.to_text() == "GoOd.TeSt."
    assert addresses(reply) == ["93.184.216.34"]


async def test_a_large_answer_over_udp_is_truncated_unless_edns_allows_it() -> None:
    dns_server = server(["many.test"])
    small = await ask(dns_server, "many.test")
    assert small.flags & dns.flags.TC
    large = await ask(dns_server, "many.test", edns=4096)
    assert not large.flags & dns.flags.TC and len(addresses(large)) == 100
    query = dns.message.make_query("many.test", "A")
    wire = await dns_server.reply(query.to_wire(), udp=False)
    assert wire is not None and len(addresses(dns.message.from_wire(wire))) == 100


async def test_garbage_and_answers_are_dropped() -> None:
    dns_server = server(["good.test"])
    query = dns.message.make_query("good.test", "A")
    answer = dns.message.make_response(query).to_wire()
    for packet in (b"", b"\x00", b"garbage that is not DNS", query.to_wire()[:-3], answer):
        assert await dns_server.reply(packet, udp=True) is None
    assert dns_server.denials == []


async def test_two_questions_are_formerr_and_other_opcodes_notimp() -> None:
    dns_server = server(["good.test"])
    query = dns.message.make_query("good.test", "A")
    query.question.append(dns.message.make_query("a.good.test", "A").question[0])
    notify = dns.message.make_query("good.test", "SOA")
    notify.set_opcode(dns.opcode.NOTIFY)
    for message, rcode in ((query, dns.rcode.FORMERR), (notify, dns.rcode.NOTIMP)):
        wire = await dns_server.reply(message.to_wire(), udp=True)
        assert wire is not None and dns.message.from_wire(wire).rcode() == rcode


async def test_beside_a_proxy_shares_its_policy_resolver_and_denials() -> None:
    seen: list[Denial] = []
    policy = EgressPolicy.from_patterns(["good.test"])
    proxy = EgressProxy(policy, tcp=("127.0.0.1", 0), resolver=StaticResolver(NAMES), on_denial=seen.append)
    dns_server = FilteringDns.beside(proxy, bind=("127.0.0.1", 0))
    assert (await ask(dns_server, "other.test")).rcode() == dns.rcode.REFUSED
    assert [d.host for d in proxy.denials] == ["other.test"] == [d.host for d in seen]
    assert dns_server.policy is policy and dns_server.resolver is proxy.resolver
