"""The network-off line: why an install failed in a jail with no network, and the way to one that has it.

A jail under ``network.mode = "none"`` has a private loopback and nothing else, so pip retries
five times and dies on "Temporary failure in name resolution", npm on ``EAI_AGAIN``, curl on
"Could not resolve host": each true, none saying the sandbox did it. :func:`network_off` reads
the end of a failed call's stderr and, when it shows a name-resolution or connect failure,
returns one line naming the profile's network and the flags that open a package index
(``--allow-index pypi``) or a host (``--allow-host HOST``). Pure: no I/O, so the same answer goes
to the terminal and to ``--json``'s ``hints``. Under ``allowlist`` the proxy's own denial line
already says which host was refused, so nothing is added there.
"""

from __future__ import annotations

import re

# What a resolver or connect failure looks like, per tool: glibc/Python (pip, uv, urllib), node
# (npm, npx), curl and git (libcurl), cargo (libcurl and its own), go (its pure-Go resolver).
_OFFLINE = re.compile(
    r"Temporary failure in name resolution|Name or service not known|No address associated with hostname"
    r"|NewConnectionError|Failed to establish a new connection|Network is unreachable"
    r"|\bENOTFOUND\b|\bEAI_AGAIN\b|\bENETUNREACH\b|\bECONNREFUSED\b"
    r"|Could not resolve host|Couldn't resolve host|dial tcp: lookup|: no such host"
    # pip --retries 0 says only this; with no network at all, no index was seen, whatever the package.
    r"|\(from versions: none\)",
)
# Which ecosystem failed, so the line names the index that fits: the first of these that matches.
_ECOSYSTEMS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("crates", re.compile(r"crates\.io|\bcargo\b|crates-io")),
    ("go", re.compile(r"proxy\.golang\.org|sum\.golang\.org|\bgo: ")),
    ("npm", re.compile(r"registry\.npmjs\.org|\bnpm (?:ERR!|error)|\bnpm\b")),
    ("pypi", re.compile(r"pypi\.org|pythonhosted\.org|\bpip\b|\buv\b|No matching distribution")),
)
_HOST = re.compile(r"(?:Could not resolve host|Couldn't resolve host name \(Could not resolve host): ([\w.-]+)")
# A failure reported at the very end of a long log counts; a resolver error in the middle of one that
# then went on to fail for another reason is still likely the cause, so the whole capture is read.
_TAIL = 64 * 1024


def network_off(stderr: str, *, profile: str, needs_other_profile: bool) -> str | None:
    """The line for a call that failed under ``network.mode = "none"`` (``None``: not a network failure).

    ``needs_other_profile``: the profile requires ``net-none``, so no flag opens its network and
    the line names ``--profile untrusted-deps``; otherwise ``--allow-index``/``--allow-host`` on
    the same profile is enough.
    """
    text = stderr[-_TAIL:]
    if not _OFFLINE.search(text):
        return None
    way = "--profile untrusted-deps " if needs_other_profile else ""
    head = f"this jail has no network (profile {profile}: network none)"
    index = _ecosystem(text)
    if index is not None:
        return f"{head}; to install packages: {way}--allow-index {index}"
    host = _HOST.search(text)
    target = host.group(1) if host else "HOST"
    return f"{head}; to reach {target}: {way}--allow-host {target}"


def _ecosystem(text: str) -> str | None:
    for name, pattern in _ECOSYSTEMS:
        if pattern.search(text):
            return name
    return None
