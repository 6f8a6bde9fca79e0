"""Redaction: tokens, keys, passwords and secret-looking values taken out of text before it is kept or shown.

The bottom layer every record goes through: the audit log (:mod:`sandbox.audit`), an approval
card and the classifier's question (:mod:`sandbox.policy.authorize`). :func:`redact` rewrites a
text (a command line, a header, a config line, a private key block); :func:`redact_value` a
JSON-like structure, dropping every value under an environment key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[REDACTED]"
_SECRET_NAME = (
    r"[A-Za-z0-9_.-]*(?:pass(?:word|wd|phrase)?|pwd|secret|token|api[_-]?key|apikey|access[_-]?key"
    r"|private[_-]?key|credential|auth|session[_-]?id|cookie|signature|salt|dsn)[A-Za-z0-9_.-]*"
)
_DONE = r"\"?\[REDACTED\]"
_SCHEME = r"(?:bearer|basic|token|digest|negotiate|ntlm|aws4-hmac-sha256)"
# A header whose name says it carries a secret: X-Api-Key, X-Goog-Api-Key, X-Auth-Token, Private-Token,
# Cookie. One hyphen at least (or an X- prefix, or Cookie): a bare "token: parsing" in prose is left alone.
_HEADER_NAME = (
    r"(?:(?:set-)?cookie|x-[a-z0-9-]*(?:key|token|secret|auth|pass(?:word)?|signature|session|credential)s?[a-z0-9-]*"
    r"|[a-z0-9]+(?:-[a-z0-9]+)*-(?:api-?key|key|token|secret|auth|signature|session))"
)
_MYSQL = r"(?:mysql[a-z]*|mariadb(?:-[a-z]+)?)"  # mysql, mysqldump, mysqladmin, mariadb-dump …
_LOGIN = r"(?:docker|podman|buildah|skopeo|nerdctl|helm|oras)"  # … login -p PASSWORD
_HTPASSWD_B = r"(?=(?:-[A-Za-z]+\s+)*-[A-Za-z]*b)"  # a -b among its flags: the password is on the line
_HTPASSWD_N = r"(?:-[A-Za-z]+\s+)*-[A-Za-z]*n"  # -n: printed, no file named
_PRIVATE_KEY = (
    re.compile(
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY"
        r"( BLOCK)?-----|\Z)",
        re.S,
    ),
    "[REDACTED PRIVATE KEY]",
)
# Begins at its literal "://", so the search skips ahead to each one (a scheme-first pattern tried every
# word of a megabyte of output: 25 ms against 2).
_URL_PASSWORD = (re.compile(r"(://[^/\s:@'\"]*):[^\s'\"/?#]+@"), rf"\1:{REDACTED}@")
_TOKENS = (
    re.compile(
        r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"
        r"|xox[abposr]-[A-Za-z0-9-]{10,}|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{10,}"
        r"|sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}|AIza[0-9A-Za-z_-]{30,}|npm_[A-Za-z0-9]{30,}"
        r"|hf_[A-Za-z0-9]{30,}|(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}"
        r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"
    ),
    REDACTED,
)
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    _PRIVATE_KEY,
    # Authorization: Bearer x, Proxy-Authorization=Basic x (the scheme stays readable)
    (re.compile(rf"(?i)\b((?:proxy-)?authorization\s*[:=]\s*{_SCHEME}\s+)[^\s'\",;]+"), rf"\1{REDACTED}"),
    (re.compile(rf"(?i)\b((?:proxy-)?authorization\s*[:=]\s*)(?!{_SCHEME}\s)[^\s'\",;]+"), rf"\1{REDACTED}"),
    # X-Api-Key: x, X-Auth-Token: x, Private-Token: x, Cookie: a=1; b=2: the value runs to a quote or the line's end
    (re.compile(rf"(?im)\b({_HEADER_NAME}[ \t]*:[ \t]*)[^\s'\"][^\r\n'\"]*"), rf"\1{REDACTED}"),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {REDACTED}"),
    # scheme://user:password@host, also with an empty user (redis://:pw@) and an @ inside the password
    _URL_PASSWORD,
    # passwords glued to a flag or after one: mysql -pSECRET, sshpass -p SECRET, curl -u user:SECRET
    (re.compile(rf"(?i)(\b{_MYSQL}\b[^\n;&|]*?\s-p)(?=[^\s;&|])[^\s;&|]+"), rf"\1{REDACTED}"),
    (re.compile(r"(?i)(\bsshpass\b[^\n;&|]*?\s-p\s*)[^\s;&|]+"), rf"\1{REDACTED}"),
    (re.compile(r"(?i)(\bredis-cli\b[^\n;&|]*?\s-a\s+)[^\s;&|]+"), rf"\1{REDACTED}"),
    (re.compile(r"(?i)(\bcurl\b[^\n;&|]*?\s(?:-u\s*|--user[ =])['\"]?[^\s:;&|'\"]*:)[^\s;&|'\"]+"), rf"\1{REDACTED}"),
    # registry logins (docker login -p X), archives (zip -P X, 7z -pX), keys (openssl -k X, -passin pass:X)
    (re.compile(rf"(?i)(\b{_LOGIN}\b[^\n;&|]*?\blogin\b[^\n;&|]*?\s-p\s*)[^\s;&|]+"), rf"\1{REDACTED}"),
    (re.compile(r"(\bzip\b[^\n;&|]*?\s-P\s*)[^\s;&|]+"), rf"\1{REDACTED}"),
    (re.compile(r"(\b7z[arxu]?\b[^\n;&|]*?\s-p)(?=[^\s;&|])[^\s;&|]+"), rf"\1{REDACTED}"),
    (re.compile(r"(\bopenssl\b[^\n;&|]*?\s-k\s+)[^\s;&|]+"), rf"\1{REDACTED}"),
    (re.compile(r"(\s-pass(?:in|out)?\s+['\"]?pass:)[^\s;&|'\"]+"), rf"\1{REDACTED}"),
    # htpasswd -b FILE USER PASS (-nb USER PASS: no file): the password is the last word
    (re.compile(rf"(\bhtpasswd\s+{_HTPASSWD_B}(?={_HTPASSWD_N})(?:-[A-Za-z]+\s+)+\S+\s+)[^\s;&|]+"), rf"\1{REDACTED}"),
    (
        re.compile(rf"(\bhtpasswd\s+{_HTPASSWD_B}(?!{_HTPASSWD_N})(?:-[A-Za-z]+\s+)+\S+\s+\S+\s+)[^\s;&|]+"),
        rf"\1{REDACTED}",
    ),
    # password: X inside a command (echo 'password: X' >> config.yml, sed 's/secret: a/secret: X/')
    (
        re.compile(
            r"(?i)(?<=[\s'\"/])([A-Za-z0-9_.-]*(?:pass(?:word|wd|phrase)|secret|api[_-]?key)[A-Za-z0-9_.-]*\s*:[ \t]*)"
            rf"(?!{_DONE})[^\s'\"/,;}}]+"
        ),
        rf"\1{REDACTED}",
    ),
    _TOKENS,
    # "password": "x", 'token': 'x' and password: x (JSON, Python, YAML); a header the patterns above
    # already redacted is left as it is
    (
        re.compile(
            rf"(?im)((?:^\s*{_SECRET_NAME}|([\"']){_SECRET_NAME}\2)\s*:\s*)(?!{_DONE}|{_SCHEME}\s+{_DONE})"
            r"(\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^\s,}]+)"
        ),
        rf'\1"{REDACTED}"',
    ),
    # NAME=value, export NAME=value, --password=value, --token value
    (re.compile(rf"(?i)(\b{_SECRET_NAME}\s*=\s*)(\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^\s;&|]+)"), rf"\1{REDACTED}"),
    (re.compile(rf"(?i)(--?{_SECRET_NAME}\s+)(\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^\s;&|-][^\s;&|]*)"), rf"\1{REDACTED}"),
    # Long high-entropy runs (mixed letters and digits) are treated as keys even without a name. A run
    # that starts with / or inside a path or word is a path: an approval card must show it as it is.
    (
        re.compile(
            r"(?<![\w/.~+-])(?![/+])(?=[A-Za-z0-9+/_-]*[0-9])(?=[A-Za-z0-9+/_-]*[A-Za-z])[A-Za-z0-9+/_-]{40,}={0,2}"
        ),
        REDACTED,
    ),
)


def redact(text: str) -> str:
    """Remove tokens, keys, passwords, private key blocks and secret-looking NAME=value pairs."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


_TOKEN_LITERALS = (
    *("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "xox", "_live_", "_test_", "sk-"),
    *("AIza", "npm_", "hf_", "AKIA", "ASIA", "AGPA", "AIDA", "AROA", "eyJ"),
)  # one literal of each of _TOKENS' alternatives
_OUTPUT_PATTERNS = (
    (_PRIVATE_KEY, ("PRIVATE KEY",)),
    (_URL_PASSWORD, ("://",)),
    (_TOKENS, _TOKEN_LITERALS),
)
"""Each output pattern with the literals it cannot match without: a text with none of them is not
searched (most output; the token pattern alone costs 20 ms a megabyte)."""


def redact_output(text: str) -> tuple[str, int]:
    """A command's output with what is unmistakably a credential taken out (a private key block, a
    URL's password, a token of a known format), and how many were. Only those: output the model
    reads must stay what the program printed (hashes, base64, ``password: …`` in a test fixture)."""
    count = 0
    for (pattern, replacement), needs in _OUTPUT_PATTERNS:
        if any(literal in text for literal in needs):
            text, found = pattern.subn(replacement, text)
            count += found
    return text, count


def redact_value(value: Any, key: str = "") -> Any:
    """Redact a JSON-like structure; every value under an env/environment key is dropped."""
    if key.lower() in ("env", "environ", "environment"):
        return dict.fromkeys(value, REDACTED) if isinstance(value, Mapping) else REDACTED
    if re.fullmatch(_SECRET_NAME, key, re.I) and isinstance(value, str | int | float):
        return REDACTED
    if isinstance(value, Mapping):
        return {k: redact_value(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    return redact(value) if isinstance(value, str) else value
