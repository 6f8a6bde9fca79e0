"""The session's certificate authority: what the proxy shows a jail for a host whose TLS it terminates.

One CA per session proxy, made when it starts: an ECDSA P-256 key that lives only in this
process's memory (never written anywhere, never in the jail), and a certificate valid for a day
with name constraints: it can sign only for the host names the session terminates, so a copy of
it trusted elsewhere vouches for nothing else. Each terminated host gets a leaf certificate, made
on first use and kept for the proxy's life, loaded into its TLS context through a memfd (Python's
``ssl`` loads a key only from a path; the memfd is no file on any disk and is closed at once).

:meth:`SessionCA.trust_files` writes what the jail's tools trust, into the directory bound into
the jail: the CA certificate, the host's CA bundle with it appended (for tools that take one
bundle and drop the system's), and a Java trust store.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import ssl
import threading
import warnings
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sandbox.network.places import BUNDLE_FILE
from sandbox.network.policy import literal_address, parse_rule

SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")
"""Where Debian, Fedora and Alpine keep the system's CA bundle: the first that exists is extended."""
CA_FILE, JAVA_STORE = "ca.pem", "truststore.p12"
JAVA_STORE_PASSWORD = "changeit"  # Java's own default: the store holds no secret, only certificates
LIFETIME = datetime.timedelta(days=1)
CLOCK_SKEW = datetime.timedelta(hours=1)


class SessionCA:
    """A CA whose key never leaves this process; :meth:`server_context` gives a host's TLS context."""

    def __init__(self, names: list[str]) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandbox session CA (egress proxy)")])
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
        )
        constraints = _name_constraints(names)
        if constraints is not None:
            builder = builder.add_extension(constraints, critical=True)
        self.certificate = builder.sign(self._key, hashes.SHA256())
        self.pem = self.certificate.public_bytes(serialization.Encoding.PEM)
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()

    def server_context(self, host: str) -> ssl.SSLContext:
        """The TLS context the proxy serves ``host`` with (HTTP/1.1 only, by ALPN), made once."""
        with self._lock:
            context = self._contexts.get(host)
            if context is None:
                context = self._contexts[host] = self._make_context(host)
            return context

    def _make_context(self, host: str) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        leaf = self._leaf(host)
        chain = leaf.public_bytes(serialization.Encoding.PEM) + self.pem
        key = self._leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        fd = os.memfd_create("sandbox-leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, chain + key)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return context

    def _leaf(self, host: str) -> x509.Certificate:
        now = datetime.datetime.now(datetime.UTC)
        ip = literal_address(host)
        name: x509.GeneralName = x509.IPAddress(ip) if ip is not None else x509.DNSName(host)
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.certificate.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + LIFETIME)
            .add_extension(x509.SubjectAlternativeName([name]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )

    def trust_files(self, directory: Path, more: bytes = b"") -> dict[str, Path]:
        """Write the CA certificate, the system bundle with it (and ``more``, PEM CAs the host also
        trusts), and a Java trust store into ``directory``; their paths by role (``ca``, ``bundle``, ``java``)."""
        system = next((Path(path) for path in SYSTEM_BUNDLES if Path(path).is_file()), None)
        bundle = system.read_bytes() if system is not None else b""
        if more.strip():
            bundle = bundle.rstrip(b"\n") + b"\n" + more.strip() + b"\n"
        paths = {"ca": directory / CA_FILE, "bundle": directory / BUNDLE_FILE, "java": directory / JAVA_STORE}
        paths["ca"].write_bytes(self.pem)
        paths["bundle"].write_bytes(bundle.rstrip(b"\n") + b"\n" + self.pem if bundle else self.pem)
        roots = [self.certificate, *_certificates(bundle)]
        store = pkcs12.serialize_java_truststore(
            [pkcs12.PKCS12Certificate(cert, f"root-{index}".encode()) for index, cert in enumerate(roots)],
            serialization.BestAvailableEncryption(JAVA_STORE_PASSWORD.encode()),
        )
        paths["java"].write_bytes(store)
        for path in paths.values():
            path.chmod(0o644)
        return paths


def _certificates(bundle: bytes) -> list[x509.Certificate]:
    with contextlib.suppress(ValueError), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a system root with a negative serial: Java takes it still
        return x509.load_pem_x509_certificates(bundle)
    return []


def _name_constraints(patterns: list[str]) -> x509.NameConstraints | None:
    """Only the terminated hosts' names and addresses (a name covers its subdomains, as RFC 5280 has it)."""
    permitted: list[x509.GeneralName] = []
    for pattern in patterns:
        rule = parse_rule(pattern)
        if rule.network is not None:
            permitted.append(x509.IPAddress(rule.network))
        elif rule.name:
            permitted.append(x509.DNSName(rule.name))
    return x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=None) if permitted else None
