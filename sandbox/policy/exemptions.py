"""Seed 004's switches for the exempt layer once the classifier is on (``policy.exemptions``, ``policy.trusted``).

``declared_dependencies``: installing what the project's manifest or lock file declares (``npm ci``,
``pip install -r requirements.txt``, ``uv sync`` …), never a package named on the command line nor
from another index. ``trusted.git_remotes``: a plain (not forced) ``git push`` to a remote named, or
whose URL is listed. ``read_only_web_fetch`` and ``trusted.domains``: a fetch tool's public http(s)
URL. Each returns an exempt :class:`Finding` or ``None``; the command judge still adds its own
findings for the paths a command names, so an exempt install that reads outside stays judged.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sandbox.policy.readonly import git_subcommand
from sandbox.policy.verdict import Finding

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from sandbox.policy.flags import Shape

    Check = Callable[[Shape, Sequence[str]], Finding | None]

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
PIP = frozenset({"pip", "pip3"})
FETCH_TOOLS = frozenset({"fetch_content", "web_fetch", "webfetch", "fetch", "fetch_url", "read_url", "web_search"})


def declared_dependencies(cmd: Shape, texts: Sequence[str]) -> Finding | None:
    name = cmd.name
    if any(_SOURCE_FLAGS.match(text) for text in texts):
        return None
    positionals = tuple(t for t in texts if not t.startswith("-"))
    if name in PIP or (name == "uv" and positionals[:1] == ("pip",)):
        rest = list(texts[1:] if name == "uv" else texts)
        return _pip(name, rest)
    if positionals in _EXACT.get(name, ()):
        what = " ".join((name, *positionals))
        return Finding(
            "exempt", "exempt.declared-dependencies", f"{what} installs the dependencies the project declares"
        )
    return None


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
        elif arg in ("-e", "--editable") and index + 1 < len(args) and args[index + 1] == ".":
            declared, index = True, index + 2
            continue
        elif arg == ".":
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


def trusted_push(remotes: Sequence[str], workspace: str) -> Check:
    """An :data:`~sandbox.policy.commands.Exemption` for a plain ``git push`` to a trusted remote."""
    trusted = frozenset(remotes)

    def check(cmd: Shape, texts: Sequence[str]) -> Finding | None:
        if cmd.name != "git" or not trusted:
            return None
        sub, rest = git_subcommand(texts)
        if sub != "push":
            return None
        positionals = [a for a in rest if not a.startswith("-")]
        if not positionals or any(a.startswith("+") or a.startswith(":") for a in positionals[1:]):
            return None  # the upstream is not known statically; a + refspec forces, a :ref deletes
        remote = positionals[0]
        if remote in trusted or remote_url(workspace, remote) in trusted:
            return Finding("exempt", "exempt.trusted-git-remote", f"git push to the trusted remote {remote}")
        return None

    return check


_REMOTE = re.compile(r'^\s*\[remote\s+"([^"]+)"\]\s*$')
_URL = re.compile(r"^\s*url\s*=\s*(\S+)\s*$")


def remote_url(workspace: str, name: str) -> str | None:
    """The URL of a remote in the workspace's ``.git/config`` (a plain read; no git is run)."""
    try:
        with open(os.path.join(workspace, ".git", "config"), encoding="utf-8") as handle:
            lines = handle.read(1 << 20).splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    current = None
    for line in lines:
        section = _REMOTE.match(line)
        if section is not None:
            current = section.group(1)
            continue
        if line.lstrip().startswith("["):
            current = None
            continue
        url = _URL.match(line)
        if url is not None and current == name:
            return url.group(1)
    return None


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
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not host or parts.username or parts.password:
        return None
    if any(host == d or (d.startswith("*.") and host.endswith(d[1:])) for d in domains):
        return Finding("exempt", "exempt.trusted-domain", f"{tool} fetches {host}, a trusted domain")
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
