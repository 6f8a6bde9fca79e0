"""Protected-path globs, compiled: the one dialect of :mod:`sandbox._jailside.glob` anchored for policy.

A pattern's anchor: ``~/`` at each home, ``/`` at the root, a bare pattern at any depth; and
``dir/**`` covers ``dir`` itself as well, so a Glob or LS on the directory is caught. Standard
library only: the policy (:mod:`sandbox.policy.paths`) and the jails' sealing of secrets
(:mod:`sandbox.backends.seal`, on ``sandbox run``'s quick path too) share it.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from sandbox._jailside.glob import translate

if TYPE_CHECKING:
    from collections.abc import Iterable

# Defaults a profile or a trusted project extends; a leading "!" carves an exception.
# Bare names (".env", "*.pem") match at any depth; "~/" and "/" patterns are absolute.
HOME_SECRETS: tuple[str, ...] = (
    "~/.ssh/**",
    "~/.aws/**",
    "~/.gnupg/**",
    "~/.netrc",
    "~/.git-credentials",
    "~/.docker/config.json",
    "~/.kube/config",
    "~/.config/gcloud/**",
)
DEFAULT_DENY_READ: tuple[str, ...] = (
    *HOME_SECRETS,
    ".env",
    ".env.*",
    "!.env.example",
    "!.env.sample",
    "!.env.template",
    "!.env.dist",
    "*.pem",
    "*.key",
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
)


@functools.lru_cache(maxsize=1024)
def _tree(body: str) -> str:
    """``body`` in the glob dialect; a trailing ``/**`` also covers the directory itself (cached:
    every session's gate compiles the same default globs)."""
    if body.endswith("/**"):
        return translate(body[:-3]) + "(?:/.*)?"
    return translate(body)


def glob_to_regex(pattern: str, homes: Iterable[str]) -> list[str]:
    """Regexes over absolute '/'-paths for one protected-path glob (several homes when ~ is a link)."""
    if pattern.startswith("~"):
        rest = pattern[1:].lstrip("/")
        return ["^" + re.escape(home.rstrip("/")) + "/" + _tree(rest) + "$" for home in homes]
    if pattern.startswith("/"):
        return ["^" + _tree(pattern) + "$"]
    return ["(?:^|/)" + _tree(pattern.removeprefix("./")) + "$"]


class PatternSet:
    """A list of globs compiled into one include and one exclude regex."""

    def __init__(self, patterns: Iterable[str], homes: Iterable[str]) -> None:
        homes = tuple(homes)
        patterns = tuple(patterns)
        include: list[str] = []
        exclude: list[str] = []
        for pattern in patterns:
            target = exclude if pattern.startswith("!") else include
            target.extend(glob_to_regex(pattern.lstrip("!"), homes))
        self.patterns = patterns
        self._include = re.compile("|".join(include)) if include else None
        self._exclude = re.compile("|".join(exclude)) if exclude else None

    def matches(self, path: str) -> bool:
        if self._include is None or not self._include.search(path):
            return False
        return not (self._exclude is not None and self._exclude.search(path))


class NameSet:
    """Bare globs (no ``/``: ``.env``, ``*.pem``) judged on one name, as :class:`PatternSet` would
    judge a path ending in it, with ``fullmatch``: a seventh of the ``search`` that a path needs
    (the sealing of a 50,000-file workspace checks every name)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        patterns = tuple(patterns)
        if any("/" in p.lstrip("!") or p.startswith("~") for p in patterns):
            raise ValueError("NameSet takes bare globs only")
        self.patterns = patterns
        self._include = _alternatives(p for p in patterns if not p.startswith("!"))
        self._exclude = _alternatives(p[1:] for p in patterns if p.startswith("!"))

    def matches(self, name: str) -> bool:
        if self._include is None or not self._include.fullmatch(name):
            return False
        return not (self._exclude is not None and self._exclude.fullmatch(name))


def _alternatives(patterns: Iterable[str]) -> re.Pattern[str] | None:
    bodies = [f"(?:{_tree(p)})" for p in patterns]
    return re.compile("|".join(bodies)) if bodies else None
