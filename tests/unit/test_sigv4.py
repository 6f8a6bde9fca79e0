"""SigV4 re-signing: AWS's published example, vectors signed by botocore, re-signing a placeholder, refusals.

The botocore vectors were generated once (botocore 1.44, ``SigV4Auth``/``S3SigV4Auth`` with the
secret below, at 2026-12-06T10:20:30Z) and are kept here as data: botocore is not a test dependency.
"""

from __future__ import annotations

import hashlib

import pytest

from sandbox.network.sigv4 import (
    STREAMING_SIGNED,
    SigV4Auth,
    canonical_request,
    is_sigv4,
    payload_hash,
    resign,
    signing_key,
    string_to_sign,
    verify,
)

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
PLACEHOLDER = "sandbox-placeholder-3f9c2a7e1b"
EMPTY = hashlib.sha256(b"").hexdigest()
Headers = list[tuple[str, str]]


def auth(scope: str, signed: str, signature: str, key: str = "AKIDEXAMPLE") -> str:
    return f"AWS4-HMAC-SHA256 Credential={key}/{scope}, SignedHeaders={signed}, Signature={signature}"


IAM_TARGET = "/?Action=ListUsers&Version=2010-05-08"
IAM_HEADERS: Headers = [
    ("Host", "iam.amazonaws.com"),
    ("Content-Type", "application/x-www-form-urlencoded; charset=utf-8"),
    ("X-Amz-Date", "20150830T123600Z"),
]
IAM_SIGNATURE = "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"


def test_the_published_iam_example_gives_the_published_hash_key_and_signature() -> None:
    canonical = canonical_request("GET", IAM_TARGET, IAM_HEADERS, ["content-type", "host", "x-amz-date"], EMPTY)
    scope = "20150830/us-east-1/iam/aws4_request"
    assert canonical.splitlines()[:3] == ["GET", "/", "Action=ListUsers&Version=2010-05-08"]
    assert hashlib.sha256(canonical.encode()).hexdigest() == (
        "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59"
    )
    assert string_to_sign("20150830T123600Z", scope, canonical).endswith(
        "\n20150830T123600Z\n20150830/us-east-1/iam/aws4_request\n"
        "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59"
    )
    assert signing_key(SECRET, "20150830", "us-east-1", "iam").hex() == (
        "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"
    )
    signed = [*IAM_HEADERS, ("Authorization", auth(scope, "content-type;host;x-amz-date", "0" * 64))]
    assert resign("GET", IAM_TARGET, signed, SECRET, EMPTY) == auth(
        scope, "content-type;host;x-amz-date", IAM_SIGNATURE
    )


S3_SCOPE = "20261206/us-east-1/s3/aws4_request"
S3_SIGNED = "host;x-amz-content-sha256;x-amz-date"
DATED = ("X-Amz-Date", "20261206T102030Z")
EMPTY_SHA = ("X-Amz-Content-SHA256", EMPTY)
BUCKET = ("Host", "examplebucket.s3.amazonaws.com")

# (method, target, headers without Authorization, the Authorization botocore sent, payload hash)
BOTOCORE: list[tuple[str, str, Headers, str, str]] = [
    (  # an S3 listing, its query unsorted and holding an encoded slash
        "GET",
        "/?list-type=2&prefix=photos%2F2026&max-keys=10&delimiter=%2F",
        [BUCKET, DATED, EMPTY_SHA],
        auth(S3_SCOPE, S3_SIGNED, "f911142d9dd6d3b8ab94774bf4574c059bf470173162c44236dc73a4d64624b5"),
        EMPTY,
    ),
    (  # an S3 upload with payload signing off
        "PUT",
        "/reports/q4.csv",
        [
            ("Host", "examplebucket.s3.eu-west-1.amazonaws.com"),
            ("Content-Type", "text/csv"),
            DATED,
            ("X-Amz-Content-SHA256", "UNSIGNED-PAYLOAD"),
        ],
        auth(
            "20261206/eu-west-1/s3/aws4_request",
            "content-type;host;x-amz-content-sha256;x-amz-date",
            "0a9fc3c069c04b0fa87d3dc03a3ceef4dd42bf878f3ea4d3b8ca1959995e9312",
        ),
        "UNSIGNED-PAYLOAD",
    ),
    (  # an S3 key with spaces, parentheses and an accented letter, signed as sent (encoded once)
        "GET",
        "/my%20folder/r%C3%A9sum%C3%A9%20%282%29.pdf",
        [BUCKET, DATED, EMPTY_SHA],
        auth(S3_SCOPE, S3_SIGNED, "ec58b1b1600e862ba05cd108e59eb449727cb52556a6dc10a7eff797bd3a2e7f"),
        EMPTY,
    ),
    (  # a repeated query parameter, upper case sorting first, a parameter without "=", runs of spaces
        "GET",
        "/?tag=b&tag=a&Zeta=1&alpha=x%20y&empty",
        [BUCKET, ("X-Amz-Meta-Note", "  two   runs  of    spaces "), DATED, EMPTY_SHA],
        auth(
            S3_SCOPE,
            S3_SIGNED + ";x-amz-meta-note",
            "1e1c61a8933680f331cae1fe5783a2975259999c533fcd01ddb707dec823eae3",
        ),
        EMPTY,
    ),
    (  # a header sent twice: its values joined by ","
        "GET",
        "/a/b",
        [BUCKET, ("X-Amz-Meta-Tag", "one"), ("X-Amz-Meta-Tag", " two  words "), DATED, EMPTY_SHA],
        auth(
            S3_SCOPE,
            S3_SIGNED + ";x-amz-meta-tag",
            "903ce7bdf5eb9c88929392373e65ec5d7243d0d77a9737f0c37407d824815b4c",
        ),
        EMPTY,
    ),
    (  # Lambda invoked by ARN: a service other than S3 encodes the path a second time
        "POST",
        "/2015-03-31/functions/arn%3Aaws%3Alambda%3Aus-east-1%3A123456789012%3Afunction%3Amy-fn/invocations",
        [("Host", "lambda.us-east-1.amazonaws.com"), ("Content-Type", "application/json"), DATED],
        auth(
            "20261206/us-east-1/lambda/aws4_request",
            "content-type;host;x-amz-date",
            "ec327451081c3db71ab511c964d0084d5963eb3879dd1ca2704fcf2c71414590",
        ),
        hashlib.sha256(b'{"k": 1}').hexdigest(),
    ),
    (  # ... and removes dot segments and empty segments first
        "GET",
        "/prod/./items//x/../caf%C3%A9%20menu?b=2&a=1",
        [("Host", "abc123.execute-api.eu-central-1.amazonaws.com"), DATED],
        auth(
            "20261206/eu-central-1/execute-api/aws4_request",
            "host;x-amz-date",
            "8646e7558cdede4826adf2f531f30872e2389499ee0740dcf13d71f9f9826deb",
        ),
        EMPTY,
    ),
    (  # temporary credentials: the session token is a signed header like any other
        "GET",
        "/?Action=GetCallerIdentity&Version=2011-06-15",
        [("Host", "sts.amazonaws.com"), DATED, ("X-Amz-Security-Token", "FwoGZXIvYXdzEXAMPLETOKEN")],
        auth(
            "20261206/us-east-1/sts/aws4_request",
            "host;x-amz-date;x-amz-security-token",
            "6d41a0ad41a399cc22d03872fb5d2982c7b0deaf9b60f468aac5a1806a61740a",
            key="ASIAEXAMPLE",
        ),
        EMPTY,
    ),
]


@pytest.mark.parametrize(("method", "target", "headers", "sent", "payload"), BOTOCORE)
def test_a_request_botocore_signed_verifies_and_resigns_to_the_same_header(
    method: str, target: str, headers: Headers, sent: str, payload: str
) -> None:
    request = [*headers, ("Authorization", sent)]
    assert verify(method, target, request, SECRET, payload)
    assert resign(method, target, request, SECRET, payload) == sent


def signed_with(secret: str, headers: Headers, signed: str, target: str = "/a/b") -> Headers:
    """``headers`` with an Authorization signed by ``secret``, as the jail's SDK would send them."""
    request = [*headers, ("Authorization", auth(S3_SCOPE, signed, "0" * 64))]
    return [*headers, ("Authorization", resign("GET", target, request, secret, EMPTY))]


def test_a_placeholder_signature_resigned_with_the_real_secret_verifies_for_it_alone() -> None:
    headers: Headers = [BUCKET, DATED, EMPTY_SHA]
    request = signed_with(PLACEHOLDER, headers, S3_SIGNED)
    assert verify("GET", "/a/b", request, PLACEHOLDER, EMPTY)
    assert not verify("GET", "/a/b", request, SECRET, EMPTY)

    resigned = [*headers, ("Authorization", resign("GET", "/a/b", request, SECRET, EMPTY))]
    assert verify("GET", "/a/b", resigned, SECRET, EMPTY)
    assert not verify("GET", "/a/b", resigned, PLACEHOLDER, EMPTY)
    old, new = SigV4Auth.parse(request[-1][1]), SigV4Auth.parse(resigned[-1][1])
    assert (new.access_key_id, new.scope, new.signed_headers) == (old.access_key_id, old.scope, old.signed_headers)


def test_a_resigned_request_changed_after_signing_no_longer_verifies() -> None:
    headers: Headers = [BUCKET, DATED, EMPTY_SHA]
    request = signed_with(SECRET, headers, S3_SIGNED)
    assert verify("GET", "/a/b", request, SECRET, EMPTY)
    assert not verify("GET", "/a/c", request, SECRET, EMPTY)
    assert not verify("DELETE", "/a/b", request, SECRET, EMPTY)
    assert not verify("GET", "/a/b", [("Host", "other.s3.amazonaws.com"), *request[1:]], SECRET, EMPTY)


def test_unsigned_headers_do_not_enter_the_signature_and_header_names_match_in_any_case() -> None:
    request = signed_with(SECRET, [BUCKET, DATED, EMPTY_SHA], S3_SIGNED)
    shouted = [(name.upper(), value) for name, value in request]
    assert verify("GET", "/a/b", [*shouted, ("User-Agent", "anything")], SECRET, EMPTY)


def test_the_canonical_query_sorts_by_name_then_value_and_encodes_per_aws() -> None:
    canonical = canonical_request("GET", "/p?b=2&a=z&a=y&c&d=%7e+x!&e=%2f", [BUCKET], ["host"], EMPTY)
    assert canonical.splitlines()[2] == "a=y&a=z&b=2&c=&d=~%2Bx%21&e=%2F"


def test_an_s3_path_is_signed_as_sent_and_only_characters_outside_it_are_encoded() -> None:
    canonical = canonical_request("GET", "/a/./b//c%2Fd/e f(1)~", [BUCKET], ["host"], EMPTY)
    assert canonical.splitlines()[1] == "/a/./b//c%2Fd/e%20f%281%29~"


@pytest.mark.parametrize(
    "value",
    [
        "AWS4-HMAC-SHA512 Credential=AKID/20261206/us-east-1/s3/aws4_request, SignedHeaders=host, Signature="
        + "a" * 64,
        "AWS4-ECDSA-P256-SHA256 Credential=AKID/20261206/s3/aws4_request, SignedHeaders=host, Signature=" + "a" * 64,
        "Bearer token",
        "AWS4-HMAC-SHA256 Credential=AKID/20261206/us-east-1/s3/aws4_request, SignedHeaders=host",
        "AWS4-HMAC-SHA256 Credential=AKID/20261206/us-east-1/s3/aws4_request, Signature=" + "a" * 64,
        auth("20261206/us-east-1/s3", "host", "a" * 64),
        auth("2026-12-06/us-east-1/s3/aws4_request", "host", "a" * 64),
        auth("20261206/us-east-1/s3/aws5_request", "host", "a" * 64),
        auth("20261206//s3/aws4_request", "host", "a" * 64),
        auth(S3_SCOPE, "Host;x-amz-date", "a" * 64),
        auth(S3_SCOPE, "host;;x-amz-date", "a" * 64),
        auth(S3_SCOPE, "host", "A" * 64),
        auth(S3_SCOPE, "host", "a" * 63),
        auth(S3_SCOPE, "host", "a" * 64) + ", Signature=" + "b" * 64,
        auth(S3_SCOPE, "host", "a" * 64) + ", Extra=1",
    ],
)
def test_an_authorization_value_that_is_not_header_sigv4_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match=r"Authorization|scope|SignedHeaders|signature"):
        SigV4Auth.parse(value)


def test_a_sigv4_value_parses_into_its_parts_and_back() -> None:
    value = auth(S3_SCOPE, S3_SIGNED, "ab" * 32)
    parsed = SigV4Auth.parse(value)
    assert parsed == SigV4Auth("AKIDEXAMPLE", "20261206", "us-east-1", "s3", tuple(S3_SIGNED.split(";")), "ab" * 32)
    assert parsed.header() == value
    assert is_sigv4(value)
    assert not is_sigv4("AWS4-HMAC-SHA256Credential=x")
    assert not is_sigv4("Basic dXNlcjpwYXNz")


PLACEHOLDER_AUTH = ("Authorization", auth(S3_SCOPE, S3_SIGNED, "0" * 64))


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ([BUCKET, DATED, EMPTY_SHA], "no Authorization"),
        ([BUCKET, DATED, EMPTY_SHA, ("Authorization", "Basic dXNlcjpwYXNz")], "not an AWS4-HMAC-SHA256"),
        ([BUCKET, DATED, EMPTY_SHA, PLACEHOLDER_AUTH, PLACEHOLDER_AUTH], "2 authorization headers"),
        ([BUCKET, ("Date", "Sun, 06 Dec 2026 10:20:30 GMT"), EMPTY_SHA, PLACEHOLDER_AUTH], "no X-Amz-Date"),
        ([BUCKET, ("X-Amz-Date", "20261207T000000Z"), EMPTY_SHA, PLACEHOLDER_AUTH], "credential scope's day"),
        ([BUCKET, ("X-Amz-Date", "20261206"), EMPTY_SHA, PLACEHOLDER_AUTH], "credential scope's day"),
        ([BUCKET, DATED, DATED, EMPTY_SHA, PLACEHOLDER_AUTH], "2 x-amz-date headers"),
        ([DATED, EMPTY_SHA, PLACEHOLDER_AUTH], "signed header 'host'"),
    ],
)
def test_a_request_that_cannot_be_resigned_is_refused(headers: Headers, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resign("GET", "/a/b", headers, SECRET, EMPTY)
    with pytest.raises(ValueError, match=message):
        verify("GET", "/a/b", headers, SECRET, EMPTY)


@pytest.mark.parametrize("value", [EMPTY, "UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"])
def test_a_payload_hash_the_client_declared_is_used_as_is(value: str) -> None:
    assert payload_hash([BUCKET, ("x-amz-content-sha256", value)]) == value


def test_without_a_declared_payload_hash_the_caller_hashes_the_body() -> None:
    assert payload_hash([BUCKET, DATED]) is None


@pytest.mark.parametrize("value", sorted(STREAMING_SIGNED))
def test_a_payload_signed_chunk_by_chunk_is_refused(value: str) -> None:
    assert "STREAMING-AWS4-HMAC-SHA256-PAYLOAD" in STREAMING_SIGNED
    assert "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER" in STREAMING_SIGNED
    with pytest.raises(ValueError, match="chunk-signed uploads cannot be re-signed"):
        payload_hash([BUCKET, ("X-Amz-Content-SHA256", value)])
