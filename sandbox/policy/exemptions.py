"""Seed 004's switches for the exempt layer once the classifier is on (``policy.exemptions``, ``policy.trusted``).

``declared_dependencies``: installing what the project's manifest or lock file declares (``npm ci``,
``pip install -r requirements.txt``, ``pip install -e '.[dev]'``, ``uv sync``, ``poetry install --with
dev`` …), never a package named on the command line nor from another index. ``trusted.git_remotes``:
a plain ``git push`` (no force, no deletion, only the options of :data:`PUSH_OPTIONS`) to a remote
named, or whose URL is listed (and then only when the workspace's ``.git/config`` gives that remote
no other push URL and rewrites no URL). ``trusted.paths``: a write whose canonical target lies in a
trusted directory, each directory resolved once through its symlinks (:func:`trusted_directories`,
:func:`trusted_write`). ``read_only_web_fetch`` and ``trusted.domains``: a fetch tool's public
http(s) URL, or one a trusted domain admits as the network allowlist would
(:func:`sandbox.network.policy.trusted_rule`). Each returns an exempt :class:`Finding` or ``None``;
the command judge still adds its own findings for the paths a command names, so an exempt install
that reads outside stays judged, and the protected paths and the deny layer are decided first.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sandbox.network.policy import trusted_rule
from sandbox.policy.paths import within
from sandbox.policy.readonly import QUERIES, git_subcommand
from sandbox.policy.verdict import Finding

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from sandbox.policy.flags import Shape
    from sandbox.policy.paths import ResolvedPath

    Check = Callable[[Shape, Sequence[str]], Finding | None]
    WriteCheck = Callable[[ResolvedPath], Finding | None]

# name -> the argument lists (after the name) that install only what is declared
_EXACT: dict[str, tuple[tuple[str, ...], ...]] = {
    "npm": (("ci",), ("install",), ("i",)),
    "yarn": ((), ("install",)),
    "pnpm": (("install",), ("i",)),
    "bun": (("install",), ("i",)),
    "poetry": (("install",),),
    "pipenv": (("install",), ("sync",)),
    "uv": (("sync",),),
    "bundle": (("install",),),
    "cargo": (("fetch",),),
    "go": (("mod", "download"),),
    "composer": (("install",),),
}
# Options that change where packages come from, or add packages: never exempt.
_SOURCE_FLAGS = re.compile(
    r"^(?:-i|-f|--index-url|--extra-index-url|--find-links|--trusted-host|--registry|--add|--global|-g"
    r"|--with|--git|--url|--path|--source)(?:=.*)?$"
)
# Options that only pick among what the manifest declares (poetry's dependency groups and extras).
_DECLARED_SELECTORS: dict[str, re.Pattern[str]] = {
    "poetry": re.compile(r"^--(?:with|without|only)(?:=.*)?$"),
}
# ``.``, ``./`` or ``.[extra,…]``: the project itself with extras its manifest declares.
_PROJECT = re.compile(r"^\./?(?:\[[A-Za-z0-9_.,-]+\])?$")
PIP = frozenset({"pip", "pip3"})
FETCH_TOOLS = frozenset({"fetch_content", "web_fetch", "webfetch", "fetch", "fetch_url", "read_url", "web_search"})


def declared_dependencies(cmd: Shape, texts: Sequence[str]) -> Finding | None:
    name = cmd.name
    query = QUERIES.get(name)
    if query is not None and query(cmd, texts):
        # A report on the installed dependencies (pip list, npm ls) or a type check: read-only, so
        # the read_only_commands switch governs it too (the gate judges exempt.read-only when it is off).
        return Finding("exempt", "exempt.read-only", f"{name} {' '.join(texts[:1])} only reads")
    selector = _DECLARED_SELECTORS.get(name)
    if any(_SOURCE_FLAGS.match(text) and not (selector and selector.match(text)) for text in texts):
        return None
    positionals = tuple(t for t in texts if not t.startswith("-") and not _selected_value(name, texts, t))
    if name in PIP or (name == "uv" and positionals[:1] == ("pip",)):
        rest = list(texts[1:] if name == "uv" else texts)
        return _pip(name, rest)
    if positionals in _EXACT.get(name, ()):
        what = " ".join((name, *positionals))
        return Finding(
            "exempt", "exempt.declared-dependencies", f"{what} installs the dependencies the project declares"
        )
    return None


def _selected_value(name: str, texts: Sequence[str], text: str) -> bool:
    """``dev`` in ``poetry install --with dev``: the value of a selector option, not a positional."""
    selector = _DECLARED_SELECTORS.get(name)
    if selector is None:
        return False
    pairs = zip(texts, texts[1:], strict=False)
    return any(selector.match(before) and "=" not in before and after == text for before, after in pairs)


def _project(arg: str) -> bool:
    return _PROJECT.match(arg) is not None


def _pip(name: str, args: list[str]) -> Finding | None:
    """``pip install -r FILE`` / ``-e .`` / ``.``: the project's own requirements, nothing named."""
    if not args or args[0] != "install":
        return None
    index, declared = 1, False
    while index < len(args):
        arg = args[index]
        if arg in ("-r", "--requirement", "-c", "--constraint") and index + 1 < len(args):
            declared, index = True, index + 2
            continue
        if arg.startswith(("--requirement=", "-r")) and arg not in ("-r",):
            declared = True
        elif arg in ("-e", "--editable") and index + 1 < len(args) and _project(args[index + 1]):
            declared, index = True, index + 2
            continue
        elif _project(arg):
            declared = True
        elif not arg.startswith("-"):
            return None  # a package named on the command line
        index += 1
    if not declared:
        return None
    return Finding("exempt", "exempt.declared-dependencies", f"{name} install of the project's declared requirements")


LOCAL_GIT = frozenset({"add", "commit", "stash"})


def local_git(cmd: Shape, texts: Sequence[str]) -> Finding | None:
    """``in_project_writes`` for git: ``git add``, ``commit`` and ``stash`` write only the workspace's
    repository (hooks under .git/hooks are protected, and ``-c`` configuration is never exempt)."""
    if cmd.name != "git":
        return None
    sub, rest = git_subcommand(texts)
    if sub not in LOCAL_GIT or any(a.startswith(("/", "~")) or ".." in a for a in rest if not a.startswith("-")):
        return None  # a path named outside the workspace is judged
    return Finding("exempt", "exempt.in-project-write", f"git {sub} writes only the workspace's repository")


# The options a trusted push may carry: none forces, deletes, prunes, mirrors, signs or sends options.
PUSH_OPTIONS = frozenset(
    {
        "-u",
        "--set-upstream",
        "-q",
        "--quiet",
        "-v",
        "--verbose",
        "--progress",
        "--no-progress",
        "-n",
        "--dry-run",
        "--porcelain",
        "--follow-tags",
        "--tags",
        "--atomic",
        "--no-verify",
    }
)


def trusted_push(remotes: Sequence[str], workspace: str) -> Check:
    """An :data:`~sandbox.policy.commands.Exemption` for a plain ``git push`` to a trusted remote."""
    trusted = frozenset(remotes)

    def check(cmd: Shape, texts: Sequence[str]) -> Finding | None:
        if cmd.name != "git" or not trusted or (texts and texts[0].startswith("-")):
            return None  # git -C elsewhere push: another repository's remotes
        sub, rest = git_subcommand(texts)
        if sub != "push" or any(a.startswith("-") and a not in PUSH_OPTIONS for a in rest):
            return None
        positionals = [a for a in rest if not a.startswith("-")]
        if not positionals or any(a.startswith(("+", ":")) or a.endswith(":") for a in positionals[1:]):
            return None  # the upstream is not known statically; a + refspec forces, a :ref deletes
        remote = positionals[0]
        if remote in trusted or remote_url(workspace, remote) in trusted:
            return Finding("exempt", "exempt.trusted-git-remote", f"git push to the trusted remote {remote}")
        return None

    return check


_SECTION = re.compile(r'^\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]\s*(?:[#;].*)?$')
_KEY = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*=\s*(.*?)\s*$")


def remote_url(workspace: str, name: str) -> str | None:
    """The push URL of a remote in the workspace's ``.git/config`` (a plain read; no git is run).

    ``None`` (not trusted by URL) where the file does not say it plainly: a ``pushurl``, a URL
    rewrite (``insteadOf``, ``pushInsteadOf``), an ``include``, a second ``url`` or a section the
    parser does not understand could send the push elsewhere than the ``url`` it reads.
    """
    try:
        with open(os.path.join(workspace, ".git", "config"), encoding="utf-8") as handle:
            lines = handle.read(1 << 20).splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    section: tuple[str, str | None] | None = None
    urls: list[str] = []
    for line in lines:
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        header = _SECTION.match(line)
        if header is not None:
            section = (header.group(1).lower(), header.group(2))
            if section[0] in ("include", "includeif") or section[0].startswith(("url", "remote.")):
                return None
            continue
        if line.lstrip().startswith("["):
            return None
        entry = _KEY.match(line)
        if section is None or entry is None:
            if section == ("remote", name):
                return None
            continue
        key, value = entry.group(1).lower(), entry.group(2)
        if section == ("remote", name):
            if key == "pushurl":
                return None
            if key == "url":
                urls.append(value.strip('"'))
    return urls[0] if len(urls) == 1 else None


def trusted_directories(paths: Sequence[str], workspace: str, homes: Sequence[str]) -> tuple[str, ...]:
    """``trusted.paths`` canonical, resolved once (when the policy is read): ``~/`` at the home, a
    relative one inside the workspace, each through ``realpath``. An entry that resolves to ``/``, a
    home or one of its ancestors (``~/..``, a symlink to ``/``) trusts nothing."""
    out: list[str] = []
    for raw in paths:
        if raw.startswith("~") and not (raw == "~" or raw.startswith("~/")):
            continue  # ~user: another account's home is never trusted
        text = homes[0] + raw[1:] if raw.startswith("~") else raw
        canonical = os.path.realpath(os.path.join(workspace, text))
        if canonical == "/" or any(within(canonical, os.path.realpath(home)) for home in homes):
            continue
        out.append(canonical)
    return tuple(dict.fromkeys(out))


def trusted_write(canonical: str, directories: Sequence[str]) -> Finding | None:
    """Seed 004's "writes inside trusted directories": ``canonical`` is the target's real path (a
    :class:`~sandbox.policy.paths.ResolvedPath`'s ``canonical``, never the path as written), so a
    symlink inside a trusted directory that leads out of it is judged where it leads."""
    for directory in directories:
        if within(directory, canonical):
            return Finding(
                "exempt", "exempt.trusted-path", f"writes {canonical}, inside the trusted directory {directory}"
            )
    return None


def write_check(directories: Sequence[str], in_project_writes: bool) -> WriteCheck | None:
    """For the command judge's write targets (a redirect): exempt inside a trusted directory, or
    inside the workspace when ``in_project_writes`` is on; ``None`` when neither can exempt."""
    if not directories and not in_project_writes:
        return None

    def check(path: ResolvedPath) -> Finding | None:
        found = trusted_write(path.canonical, directories)
        if found is None and in_project_writes and path.root == "workspace":
            found = Finding("exempt", "exempt.in-project-write", f"writes {path.canonical}, inside the workspace")
        return found

    return check


def combine(*checks: Check | None) -> Check | None:
    """One exemption from several: the first that exempts."""
    live = [check for check in checks if check is not None]
    if not live:
        return None

    def check(cmd: Shape, texts: Sequence[str]) -> Finding | None:
        for one in live:
            found = one(cmd, texts)
            if found is not None:
                return found
        return None

    return check


def public_fetch(tool: str, args: dict[str, Any], domains: Sequence[str], read_only_web_fetch: bool) -> Finding | None:
    """Seed 004's ``readOnlyWebFetch``: a fetch tool's public http(s) URL runs without a model call;
    a private, loopback or link-local address (or a bare name that may be one) is judged."""
    if tool.lower() not in FETCH_TOOLS and not tool.lower().endswith(("_fetch", "fetch_content", "web_search")):
        return None
    url = args.get("url")
    if url is None and "query" in args and read_only_web_fetch and tool.lower().endswith("search"):
        return Finding("exempt", "exempt.web-search", f"{tool} searches the web (read-only)")
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not host or parts.username or parts.password:
        return None
    trusted = trusted_rule(host, port, domains)
    if trusted is not None:
        return Finding("exempt", "exempt.trusted-domain", f"{tool} fetches {host}, a trusted domain ({trusted})")
    if not read_only_web_fetch or not _public(host):
        return None
    return Finding("exempt", "exempt.read-only-web-fetch", f"{tool} fetches a public URL (read-only)")


def _public(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        # A name: public unless it says otherwise (the proxy checks what it resolves to for Bash).
        return "." in host and not host.endswith((".local", ".internal", ".localhost", ".lan", ".home.arpa"))
    return address.is_global
