"""The secret broker: what the egress proxy does with the hosts whose TLS it terminates.

A host is terminated when a secret (``[secrets.NAME] hosts``) or a request rule
(``[[network.requests]] hosts``) names it; every other host keeps SNI pass-through, its TLS
unopened. For a terminated host the proxy is the jail's TLS server (a leaf of the session's CA,
:mod:`~sandbox.network.ca`) and the real server's TLS client, verifying it against the host's
trust store (and ``SANDBOX_NET_TRUST``, a PEM file of more CAs: a company's, a test's). Each
HTTP/1.1 request is then judged here (:meth:`Broker.prepare`) before a byte of it goes on:

- its Host must name the connection's host, and it may not upgrade the protocol;
- the host's request rules (:mod:`~sandbox.network.reqrules`) must allow its method and path;
- a placeholder of the session (:mod:`~sandbox.network.secrets`) may stand only where a secret
  of this host declares it (``Authorization: Bearer``, the password of ``Basic``, a named header,
  any header for ``env-placeholder``), and is replaced there by the value; a placeholder in the
  URL, in another header, in the body, or on its way to a host its secret does not name, is
  refused (``secret-misplaced``);
- a request signed with AWS SigV4 by an ``aws-sigv4`` secret's key id is signed again with the
  value (:mod:`~sandbox.network.sigv4`).

Responses are never given a value: every response of a host a secret names is searched for the
value and its Basic forms, masked (same length, ``*``) in head and body, so a host that echoes a
request, or keeps it and shows it later, shows the jail nothing; requests to such a host ask for
an identity encoding, so the search sees the bytes.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sandbox.network.denial import Refused, where
from sandbox.network.http import HttpRequest, comparable
from sandbox.network.policy import EgressPolicy
from sandbox.network.reqrules import RequestRules
from sandbox.network.secrets import PLACEHOLDER_PREFIX, Brokered
from sandbox.network.sigv4 import is_sigv4, payload_hash, resign

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sandbox.network.ca import SessionCA
    from sandbox.profile_tables import RequestRule, Secret
    from sandbox.vocabulary import DenialReason

TRUST_ENV = "SANDBOX_NET_TRUST"
"""A PEM file of CAs the proxy trusts for terminated hosts besides the system's (a test's, a company's)."""
MAX_SIGNED_BODY = 16 * 2**20
"""A SigV4 request without ``X-Amz-Content-Sha256`` is held whole to hash its body, up to this."""
_PREFIX = PLACEHOLDER_PREFIX.encode()


@dataclass(frozen=True)
class HostRules:
    """One ``[[network.requests]]`` table: its hosts and its rules."""

    hosts: EgressPolicy
    rules: RequestRules
    text: tuple[str, ...]


@dataclass
class Prepared:
    """A request judged and rewritten: its head for the server, what to mask in its response."""

    request: HttpRequest
    head: bytes
    masks: list[bytes] = field(default_factory=list)
    push: str | None = None  # a git push whose ref commands the rules check
    hash_body: bool = False  # a SigV4 request to sign again once its body is hashed
    signer: Brokered | None = None


class Broker:
    """The terminated hosts of one proxy, their secrets, rules, CA and upstream trust."""

    def __init__(self, secrets: Sequence[Brokered], rules: Sequence[HostRules], ca: SessionCA) -> None:
        self.secrets, self.rules, self.ca = list(secrets), list(rules), ca
        self.patterns = _patterns(secrets, rules)
        self.hosts = EgressPolicy.from_patterns(self.patterns, ())
        self.upstream_context = upstream_context()
        self._by_placeholder = {s.placeholder.encode(): s for s in self.secrets}
        self._users: set[str] = {s.spec.username for s in self.secrets if s.kind == "basic"}  # seen in Basic

    @classmethod
    def build(
        cls,
        secrets: Mapping[str, Secret],
        requests: Sequence[RequestRule],
        environ: Mapping[str, str] | None = None,
        *,
        keep: Broker | None = None,
    ) -> Broker | None:
        """The broker for a profile's secrets and request rules; ``None`` when it has neither.

        ``keep``: the session's broker until now (a live change): a secret it holds unchanged keeps
        its placeholder (a shell of the jail may hold it) and its value; the CA stays when the
        terminated hosts do."""
        from sandbox.network.ca import SessionCA
        from sandbox.network.secrets import check_unique

        if not secrets and not requests:
            return None
        kept = {secret.name: secret for secret in keep.secrets} if keep is not None else {}
        brokered = [
            kept[name] if name in kept and kept[name].spec == spec else Brokered.read(name, spec, environ)
            for name, spec in secrets.items()
        ]
        check_unique(brokered)
        rules = [
            HostRules(
                EgressPolicy.from_patterns(r.hosts, ()),
                RequestRules.parse(r.allow, r.preset, r.git_fetch, r.git_push, r.git_refs),
                tuple(r.hosts),
            )
            for r in requests
        ]
        patterns = _patterns(brokered, rules)
        ca = keep.ca if keep is not None and keep.patterns == patterns else SessionCA(patterns)
        return cls(brokered, rules, ca)

    def terminates(self, host: str, port: int) -> bool:
        return self.hosts.decide(host, port).allowed is True

    def rules_for(self, host: str, port: int) -> HostRules | None:
        return next((r for r in self.rules if r.hosts.decide(host, port).allowed is True), None)

    def masks_for(self, host: str, port: int) -> list[bytes]:
        """What every response of ``host`` is searched for: the value of each secret it may receive,
        and its Basic form with each user name seen. Every response, not only those to a request
        that carried it: a host may keep what it was sent and show it to a later request."""
        masks: list[bytes] = []
        for secret in self.secrets:
            if secret.serves(host, port):
                masks += secret.masks()
                if secret.kind == "basic":
                    masks += [form for user in sorted(self._users) for form in secret.masks(user)[1:]]
        return masks

    def misplaced_in(self, data: bytes | bytearray) -> Brokered | None:
        """The secret whose placeholder ``data`` holds, if any (one search for the common prefix)."""
        start = data.find(_PREFIX)
        while start >= 0:
            for placeholder, secret in self._by_placeholder.items():
                if data.startswith(placeholder, start):
                    return secret
            start = data.find(_PREFIX, start + 1)
        return None

    # -- one request ---------------------------------------------------------------------------
    def prepare(self, request: HttpRequest, host: str, port: int) -> Prepared:
        """``request`` judged for ``host:port`` and rewritten for the server; :class:`Refused` says why not."""
        try:
            named = request.tunnelled(host)
        except ValueError as exc:
            raise self.refused(request, host, port, "bad-request", None, str(exc)) from None
        if comparable(named) != comparable(host) or not request.target.startswith("/"):
            why = f"a connection to {where(host, port)} carried a request for {named}: one destination per connection"
            raise self.refused(request, host, port, "host-mismatch", None, why)
        if request.version != "HTTP/1.1" and request.version != "HTTP/1.0":
            raise self.refused(request, host, port, "bad-request", None, f"{request.version} is not relayed")
        if (secret := self.misplaced_in(request.target.encode("latin-1"))) is not None:
            raise self.misplaced(request, host, port, secret, "in the URL")
        prepared = Prepared(request, b"")
        headers = [self._header(request, host, port, name, value, prepared) for name, value in request.headers]
        request = HttpRequest(request.method, request.target, request.version, tuple(headers))
        prepared.request = request
        prepared.masks = self.masks_for(host, port)
        if prepared.masks:  # a compressed response could not be searched for the value: ask for none
            request = prepared.request = _replaced_all(request, "accept-encoding", "identity")
        found = self.rules_for(host, port)
        if found is not None:
            verdict = found.rules.judge(request.method, request.target)
            if not verdict.allowed:
                raise self.refused(request, host, port, "request-refused", verdict.rule, verdict.message)
            repository = found.rules.push_repository(request.method, request.target)
            if repository is not None and found.rules.checks_refs:
                if request.values("content-encoding"):
                    why = "a git push whose body is encoded cannot have its refs checked"
                    raise self.refused(request, host, port, "request-refused", None, why)
                prepared.push = repository
        if prepared.signer is not None:
            self._sign(prepared, host, port)
        prepared.head = _head(prepared.request)
        return prepared

    def judge_push(self, prepared: Prepared, host: str, port: int, body: bytes) -> int | None:
        """Check a git push's ref commands at the start of its body: the offset after them, or
        ``None`` while more body is needed; :class:`Refused` for a ref the rules refuse."""
        from sandbox.network.reqrules import read_ref_commands

        found = self.rules_for(host, port)
        assert found is not None and prepared.push is not None
        try:
            section = read_ref_commands(body)
        except ValueError as exc:
            raise self.refused(prepared.request, host, port, "request-refused", None, str(exc)) from None
        if section is None:
            return None
        verdict = found.rules.judge_push(prepared.push, section[0])
        if not verdict.allowed:
            raise self.refused(prepared.request, host, port, "request-refused", verdict.rule, verdict.message)
        return section[1]

    def sign_body(self, prepared: Prepared, body: bytes, host: str, port: int) -> None:
        """Sign a held SigV4 request again now that its body is known."""
        import hashlib

        assert prepared.signer is not None
        digest = hashlib.sha256(body).hexdigest()
        prepared.request = _replaced(prepared.request, "authorization", self._resigned(prepared, digest, host, port))
        prepared.head = _head(prepared.request)
        prepared.hash_body = False

    def _header(
        self, request: HttpRequest, host: str, port: int, name: str, value: str, prepared: Prepared
    ) -> tuple[str, str]:
        lower = name.lower()
        if lower == "authorization" and is_sigv4(value):
            signer = self._signer(value, host, port)
            if signer is not None:
                prepared.signer = signer
        shown = value + (_basic_password(value) or "" if lower == "authorization" else "")
        if self.misplaced_in(shown.encode("latin-1", "replace")) is None:
            return name, value
        for secret in self.secrets:
            if secret.placeholder not in shown:
                continue
            if not secret.serves(host, port):
                raise self.misplaced(request, host, port, secret, f"in a request to {where(host, port)}")
            replaced = self._substitute(secret, lower, value)
            if replaced is None:
                raise self.misplaced(request, host, port, secret, f"in the header {name} (declared: {secret.kind})")
            value = replaced
        if self.misplaced_in(value.encode("latin-1")) is not None:  # a second placeholder left over
            raise self.refused(request, host, port, "secret-misplaced", None, f"a placeholder left in {name}")
        return name, value

    def _substitute(self, secret: Brokered, header: str, value: str) -> str | None:
        """``value`` with the secret in place of its placeholder, where its kind declares it; else ``None``."""
        kind = secret.kind
        if (
            kind == "env-placeholder"
            and header not in ("host", "authorization")
            or (kind.startswith("header:") and header == kind[7:].lower())
        ):
            return value.replace(secret.placeholder, secret.value)
        if header != "authorization":
            return None
        scheme, _, credentials = value.partition(" ")
        if kind == "bearer" and scheme.lower() == "bearer" and credentials.strip() == secret.placeholder:
            return f"{scheme} {secret.value}"
        if kind == "env-placeholder" and credentials.strip() == secret.placeholder:
            return f"{scheme} {secret.value}"
        pair = _basic(value) if kind == "basic" else None
        if pair is not None and pair[1] == secret.placeholder:
            user = pair[0]
            self._users.add(user)
            return f"{scheme} " + base64.b64encode(f"{user}:{secret.value}".encode()).decode()
        return None

    def _signer(self, value: str, host: str, port: int) -> Brokered | None:
        from sandbox.network.sigv4 import SigV4Auth

        try:
            auth = SigV4Auth.parse(value)
        except ValueError:
            return None
        for secret in self.secrets:
            if (
                secret.kind == "aws-sigv4"
                and secret.spec.access_key_id == auth.access_key_id
                and secret.serves(host, port)
            ):
                return secret
        return None

    def _sign(self, prepared: Prepared, host: str, port: int) -> None:
        try:
            digest = payload_hash(prepared.request.headers)
        except ValueError as exc:
            raise self.refused(prepared.request, host, port, "request-refused", None, str(exc)) from None
        if digest is None:
            prepared.hash_body = True
            return
        new = self._resigned(prepared, digest, host, port)
        prepared.request = _replaced(prepared.request, "authorization", new)

    def _resigned(self, prepared: Prepared, digest: str, host: str, port: int) -> str:
        assert prepared.signer is not None
        request = prepared.request
        try:
            value = resign(request.method, request.target, request.headers, prepared.signer.value, digest)
        except ValueError as exc:
            raise self.refused(request, host, port, "request-refused", None, f"cannot sign again: {exc}") from None
        return value

    def misplaced(self, request: HttpRequest, host: str, port: int, secret: Brokered, why: str) -> Refused:
        hosts = ", ".join(secret.spec.hosts)
        message = f"the placeholder of secret {secret.name} {why}; it is replaced only in {secret.kind} to {hosts}"
        return self.refused(request, host, port, "secret-misplaced", f"secrets.{secret.name}", message)

    @staticmethod
    def refused(
        request: HttpRequest, host: str, port: int, reason: DenialReason, rule: str | None, message: str
    ) -> Refused:
        said = f"{request.method} {request.target.split('?', 1)[0]}: "
        message = message.removeprefix(said)  # the denial's line names the request already
        refused = Refused(host, port, reason, rule, message)
        refused.denial = refused.denial.for_request(request.method, request.target)
        return refused


def _patterns(secrets: Sequence[Brokered], rules: Sequence[HostRules]) -> list[str]:
    """The host patterns the broker terminates: its secrets', then its rules'."""
    return [p for secret in secrets for p in secret.spec.hosts] + [p for rule in rules for p in rule.text]


def _basic(value: str) -> tuple[str, str] | None:
    """User and password of an ``Authorization: Basic`` value, else ``None``."""
    scheme, _, credentials = value.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, colon, password = base64.b64decode(credentials.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if colon else None


def _basic_password(value: str) -> str | None:
    pair = _basic(value)
    return None if pair is None else pair[1]


def _head(request: HttpRequest) -> bytes:
    """The request as the server gets it: no hop-by-hop ``Expect`` (the proxy answered it), as parsed otherwise."""
    kept = tuple(
        (k, v) for k, v in request.headers if k.lower() not in ("expect", "proxy-connection", "proxy-authorization")
    )
    return HttpRequest(request.method, request.target, request.version, kept).serialized()


def _replaced_all(request: HttpRequest, name: str, value: str) -> HttpRequest:
    """``request`` with its ``name`` headers (any number) replaced by one saying ``value``."""
    headers = tuple((k, v) for k, v in request.headers if k.lower() != name) + ((name.title(), value),)
    return HttpRequest(request.method, request.target, request.version, headers)


def _replaced(request: HttpRequest, name: str, value: str) -> HttpRequest:
    headers = tuple((k, value if k.lower() == name else v) for k, v in request.headers)
    return HttpRequest(request.method, request.target, request.version, headers)


def upstream_context(environ: Mapping[str, str] | None = None) -> ssl.SSLContext:
    """How the proxy checks a terminated host's real server: the system's CAs, and ``SANDBOX_NET_TRUST``'s."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    extra = (os.environ if environ is None else environ).get(TRUST_ENV, "").strip()
    if extra:
        context.load_verify_locations(cafile=extra)
    return context
