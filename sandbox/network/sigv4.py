"""AWS Signature Version 4, re-signed at the boundary: the jail signs with a placeholder secret key.

A jail holds an access key id and a placeholder for its secret key (a random string), and signs
its requests with the placeholder as any AWS SDK does. The proxy, which sees the request in the
clear, recomputes the ``Authorization`` header's signature with the real secret key over the same
canonical request (:func:`resign`): the same method, path, query, signed headers, payload hash and
credential scope. The jail never holds the real key, yet any request it signs is signed for it:
the request rules (method, path) are what bound what the key may do.

Only the header form is handled: ``Authorization: AWS4-HMAC-SHA256 Credential=..., SignedHeaders=...,
Signature=...`` with an ``X-Amz-Date`` header. A presigned URL (``X-Amz-Signature`` in the query),
a ``Date`` header instead of ``X-Amz-Date``, and streaming payloads signed chunk by chunk
(:data:`STREAMING_SIGNED`: each chunk's signature chains from the header's) are refused with
``ValueError``.

The canonical URI is the path as sent for S3 (which does not normalise it); other services
remove dot segments and empty segments and encode the path a second time, as the SDKs do (a
Lambda function named by its ARN travels as ``arn%3Aaws...`` and is signed as ``arn%253Aaws...``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

ALGORITHM = "AWS4-HMAC-SHA256"
STREAMING_SIGNED = frozenset(
    {
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
        "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD",
        "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD-TRAILER",
    }
)
"""``X-Amz-Content-Sha256`` values whose body carries chunk signatures chained from the header's."""

_DATE = re.compile(r"[0-9]{8}\Z")
_AMZ_DATE = re.compile(r"[0-9]{8}T[0-9]{6}Z\Z")
_SIGNATURE = re.compile(r"[0-9a-f]{64}\Z")
_HEADER_NAME = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+\Z")
_SCOPE_PART = re.compile(r"[A-Za-z0-9._-]+\Z")


@dataclass(frozen=True)
class SigV4Auth:
    """An ``Authorization`` header's parts; ``date`` is the credential scope's (``20261206``)."""

    access_key_id: str
    date: str
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str

    @classmethod
    def parse(cls, value: str) -> SigV4Auth:
        """Read a header value; ``ValueError`` for another algorithm, a missing or repeated part, a bad scope."""
        if not is_sigv4(value):
            raise ValueError(f"not an {ALGORITHM} Authorization header")
        parts: dict[str, str] = {}
        for item in value[len(ALGORITHM) + 1 :].split(","):
            name, equals, part = item.strip().partition("=")
            if not equals or name not in ("Credential", "SignedHeaders", "Signature") or name in parts:
                raise ValueError(f"unexpected part {name!r} in the Authorization header")
            parts[name] = part
        if len(parts) != 3:
            raise ValueError("the Authorization header lacks Credential, SignedHeaders or Signature")
        return cls(*_credential(parts["Credential"]), _signed_headers(parts["SignedHeaders"]), parts["Signature"])

    def __post_init__(self) -> None:
        if not _SIGNATURE.match(self.signature):
            raise ValueError("the signature is not 64 lower-case hex digits")

    @property
    def scope(self) -> str:
        """The credential scope, ``20261206/us-east-1/s3/aws4_request``."""
        return f"{self.date}/{self.region}/{self.service}/aws4_request"

    def header(self) -> str:
        """The ``Authorization`` header value these parts make."""
        return (
            f"{ALGORITHM} Credential={self.access_key_id}/{self.scope}, "
            f"SignedHeaders={';'.join(self.signed_headers)}, Signature={self.signature}"
        )


def _credential(value: str) -> tuple[str, str, str, str]:
    parts = value.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not _DATE.match(parts[1]):
        raise ValueError(f"not a SigV4 credential scope: {value!r}")
    if not all(_SCOPE_PART.match(part) for part in (parts[0], parts[2], parts[3])):
        raise ValueError(f"not a SigV4 credential scope: {value!r}")
    return parts[0], parts[1], parts[2], parts[3]


def _signed_headers(value: str) -> tuple[str, ...]:
    names = tuple(value.split(";"))
    if not all(_HEADER_NAME.match(name) for name in names):
        raise ValueError(f"SignedHeaders must be lower-case header names joined by ';': {value!r}")
    return names


def is_sigv4(value: str) -> bool:
    """Whether an ``Authorization`` header value is a SigV4 one (so the proxy should re-sign it)."""
    return value.startswith(ALGORITHM + " ")


def canonical_request(
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]],
    signed_headers: Sequence[str],
    payload_hash: str,
    *,
    normalize: bool = False,
) -> str:
    """The canonical request of a request whose ``target`` is its origin-form ``path?query`` as sent.

    ``normalize`` asks for the path to be normalised and encoded a second time (every service but
    S3). ``ValueError`` when a signed header is absent.
    """
    path, _, query = target.partition("?")
    lines = [method, _canonical_path(path, normalize), _canonical_query(query)]
    for name in signed_headers:
        values = [_trim(value) for key, value in headers if key.lower() == name.lower()]
        if not values:
            raise ValueError(f"the signed header {name!r} is not in the request")
        lines.append(f"{name.lower()}:{','.join(values)}")
    lines += ["", ";".join(name.lower() for name in signed_headers), payload_hash]
    return "\n".join(lines)


def _canonical_path(path: str, normalize: bool) -> str:
    if not normalize:
        return urllib.parse.quote(path, safe="/%~")
    segments: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            segments = segments[:-1]
        elif segment not in ("", "."):
            segments.append(segment)
    trailing = "/" if path.endswith("/") and segments else ""
    return urllib.parse.quote("/" + "/".join(segments) + trailing, safe="/~")


def _canonical_query(query: str) -> str:
    pairs = []
    for item in query.split("&"):
        if item:
            name, _, value = item.partition("=")
            pairs.append((_uri_encode(name), _uri_encode(value)))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def _uri_encode(text: str) -> str:
    return urllib.parse.quote(urllib.parse.unquote_to_bytes(text), safe="-_.~")


def _trim(value: str) -> str:
    return " ".join(word for word in value.strip(" \t").split(" ") if word)


def string_to_sign(amz_date: str, scope: str, canonical: str) -> str:
    """What is signed: the algorithm, the request's time, the scope and the canonical request's hash."""
    return "\n".join([ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """The key derived from a secret access key for one day, region and service."""
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.digest(key, part.encode(), "sha256")
    return key


def resign(method: str, target: str, headers: Sequence[tuple[str, str]], secret: str, payload_hash: str) -> str:
    """The request's ``Authorization`` value signed anew with ``secret``: same key id, scope and signed headers.

    ``ValueError`` when the request has no SigV4 ``Authorization`` header, no ``X-Amz-Date`` (the
    ``Date`` form is not supported), or lacks a header it signed.
    """
    auth = _authorization(headers)
    signature = _signature(method, target, headers, auth, secret, payload_hash)
    return SigV4Auth(auth.access_key_id, auth.date, auth.region, auth.service, auth.signed_headers, signature).header()


def verify(method: str, target: str, headers: Sequence[tuple[str, str]], secret: str, payload_hash: str) -> bool:
    """Whether the request's signature is the one ``secret`` makes (``ValueError`` as for :func:`resign`)."""
    auth = _authorization(headers)
    expected = _signature(method, target, headers, auth, secret, payload_hash)
    return hmac.compare_digest(expected, auth.signature)


def payload_hash(headers: Sequence[tuple[str, str]]) -> str | None:
    """The ``X-Amz-Content-Sha256`` value to sign with, ``None`` when absent (the caller hashes the body).

    ``ValueError`` for a streaming payload signed chunk by chunk (:data:`STREAMING_SIGNED`).
    """
    value = _single(headers, "x-amz-content-sha256")
    if value in STREAMING_SIGNED:
        raise ValueError(
            f"X-Amz-Content-Sha256 {value}: each chunk's signature chains from the header's, "
            "so chunk-signed uploads cannot be re-signed (use UNSIGNED-PAYLOAD or a signed payload hash)"
        )
    return value


def _authorization(headers: Sequence[tuple[str, str]]) -> SigV4Auth:
    value = _single(headers, "authorization")
    if value is None:
        raise ValueError("the request has no Authorization header")
    return SigV4Auth.parse(value)


def _signature(
    method: str, target: str, headers: Sequence[tuple[str, str]], auth: SigV4Auth, secret: str, payload: str
) -> str:
    amz_date = _single(headers, "x-amz-date")
    if amz_date is None:
        raise ValueError("the request has no X-Amz-Date header (a signature dated by Date is not supported)")
    if not _AMZ_DATE.match(amz_date) or amz_date[:8] != auth.date:
        raise ValueError(f"X-Amz-Date {amz_date!r} is not a time on the credential scope's day {auth.date}")
    normalize = not auth.service.startswith("s3")
    canonical = canonical_request(method, target, headers, auth.signed_headers, payload, normalize=normalize)
    key = signing_key(secret, auth.date, auth.region, auth.service)
    return hmac.new(key, string_to_sign(amz_date, auth.scope, canonical).encode(), hashlib.sha256).hexdigest()


def _single(headers: Sequence[tuple[str, str]], name: str) -> str | None:
    values = [value for key, value in headers if key.lower() == name]
    if len(values) > 1:
        raise ValueError(f"the request has {len(values)} {name} headers")
    return values[0].strip() if values else None
