"""Path policy: canonical resolution, containment in the session roots, protected paths.

Resolution follows the kernel: ``~`` is expanded, a relative path joins the workspace, and
``os.path.realpath`` walks the components in order, so a symlink is followed *before* a later
``..`` is applied (``link/../x`` means "beside the link's target", as ``open`` would see it).
Components that do not exist yet are kept as written, which is "resolve the nearest existing
parent, then append the rest" for a file about to be created.

Containment compares canonical paths component by component: ``/work/app2`` is not inside
``/work/app``.

Protected-path globs speak the one dialect of :mod:`sandbox._jailside.glob`, the Glob tool's
too. What this module adds is policy: where a pattern is anchored (``~/`` at each home, ``/`` at
the root, a bare pattern at any depth) and that ``dir/**`` protects ``dir`` itself as well, so a
Glob or LS on the directory is caught.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox.errors import InvalidArgument
from sandbox.patterns import DEFAULT_DENY_READ, HOME_SECRETS, PatternSet
from sandbox.policy.verdict import Finding

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sandbox.vocabulary import Escape, Operation, Root

DEFAULT_DENY_WRITE: tuple[str, ...] = HOME_SECRETS
# A jail's /tmp is a tmpfs of its own (its HOME lives there too): Bash may write it like the scratch
# directory. Not a root for the file tools, and never a home below it (the host's view decides).
TMP_ROOTS: tuple[str, ...] = ("/tmp",)
SHELL_RC_FILES: tuple[str, ...] = (
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".kshrc",
    ".cshrc",
    ".tcshrc",
    ".config/fish/config.fish",
    ".inputrc",
)
DEFAULT_CONFIRM_WRITE: tuple[str, ...] = (
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    ".git/hooks/**",
    ".git/config",
    ".gitmodules",
    ".sandbox/**",
    *SHELL_RC_FILES,
)


def within(root: str, path: str) -> bool:
    """True when canonical ``path`` is ``root`` or below it (a relation between components)."""
    if path == root:
        return True
    prefix = root if root.endswith(os.sep) else root + os.sep
    return path.startswith(prefix)


def entry_path(path: str, *, through: bool) -> str:
    """The canonical path of the entry ``path`` names, as a deletion sees it: the links on the way
    resolved, the last component kept (``rm -rf link`` removes the link, never what it names) unless
    the operand goes ``through`` it (``link/``, ``link/.``), which is the target."""
    head, tail = os.path.split(path.rstrip("/") or "/")
    if through or not tail or tail in (".", ".."):
        return os.path.realpath(path)
    return os.path.join(os.path.realpath(head), tail)


@dataclass(frozen=True, slots=True)
class ResolvedPath:
    """One path argument, as written and as the kernel would reach it."""

    raw: str
    lexical: str
    canonical: str
    root: Root
    escape: Escape | None

    @property
    def external(self) -> bool:
        return self.root == "external"


def _homes() -> tuple[str, ...]:
    home = os.path.expanduser("~")
    real = os.path.realpath(home)
    return (home,) if real == home else (home, real)


class PathPolicy:
    """Resolves path arguments against the session roots and applies the protected lists."""

    def __init__(
        self,
        workspace: str | os.PathLike[str],
        scratch: str | os.PathLike[str],
        *,
        deny_read: Iterable[str] = (),
        deny_write: Iterable[str] = (),
        confirm_write: Iterable[str] = (),
        state_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.workspace = os.path.realpath(os.fspath(workspace))
        self.scratch = os.path.realpath(os.fspath(scratch))
        self.state_dir = os.path.realpath(os.fspath(state_dir)) if state_dir is not None else None
        self.homes = _homes()
        self.home = self.homes[0]
        self.tmp = tuple(dict.fromkeys(p for root in TMP_ROOTS for p in (root, os.path.realpath(root))))
        self.deny_read = PatternSet((*DEFAULT_DENY_READ, *deny_read), self.homes)
        self.deny_write = PatternSet((*DEFAULT_DENY_WRITE, *deny_write), self.homes)
        self.confirm_write = PatternSet((*DEFAULT_CONFIRM_WRITE, *confirm_write), self.homes)

    def _joined(self, raw: str, base: str | None) -> str:
        if "\0" in raw:
            raise InvalidArgument("a path cannot contain a NUL byte", path=raw)
        if raw == "~" or raw.startswith("~/"):
            raw = self.home + raw[1:]
        elif raw.startswith("~"):
            raw = os.path.expanduser(raw)
        return os.path.join(base or self.workspace, raw)

    def expand(self, raw: str, base: str | None = None) -> str:
        """The absolute, ``..``-normalised path, symlinks not followed."""
        return os.path.normpath(self._joined(raw, base))

    def root_of(self, canonical: str) -> Root:
        # Scratch first: it is the more specific root if it ever sits inside the workspace.
        if within(self.scratch, canonical):
            return "scratch"
        if within(self.workspace, canonical):
            return "workspace"
        return "external"

    def resolve(self, raw: str, base: str | None = None, *, entry: bool = False) -> ResolvedPath:
        """``raw`` resolved; ``entry``: the directory entry itself is meant (a deletion), so a last
        component that is a symlink is the link, not what it names (:func:`entry_path`)."""
        joined = self._joined(raw, base)
        lexical = os.path.normpath(joined)
        canonical = entry_path(joined, through=raw.endswith(("/", "/."))) if entry else os.path.realpath(joined)
        root = self.root_of(canonical)
        return ResolvedPath(raw, lexical, canonical, root, self._escape(raw, lexical, root))

    def _escape(self, raw: str, lexical: str, root: Root) -> Escape | None:
        if root != "external":
            return None
        if self.root_of(lexical) != "external":
            return "symlink"
        if raw.startswith("~"):
            return "home"
        return "absolute" if os.path.isabs(raw) else "parent"

    def in_tmp(self, path: ResolvedPath) -> bool:
        """Whether a command writing ``path`` writes the jail's private /tmp (as written and as resolved)."""
        return all(
            any(within(tmp, candidate) for tmp in self.tmp) and not any(within(h, candidate) for h in self.homes)
            for candidate in (path.lexical, path.canonical)
        )

    def protection(self, path: ResolvedPath, operation: Operation) -> Finding | None:
        """A deny or confirm finding when ``path`` (as written or as resolved) is protected."""
        candidates = (path.canonical,) if path.canonical == path.lexical else (path.canonical, path.lexical)
        for candidate in candidates:
            finding = self._protect_one(candidate, operation)
            if finding is not None:
                return finding
        return None

    def _protect_one(self, path: str, operation: Operation) -> Finding | None:
        if self.state_dir is not None and within(self.state_dir, path) and not within(self.scratch, path):
            return Finding("deny", "path.sandbox-state", f"{path} belongs to the sandbox's own state")
        if operation == "read":
            if self.deny_read.matches(path):
                return Finding("deny", "path.deny-read", f"reading {path} is not allowed (protected path)")
            return None
        if self.deny_write.matches(path):
            return Finding("deny", "path.deny-write", f"writing {path} is not allowed (protected path)")
        if self.confirm_write.matches(path):
            return Finding("ask", "path.confirm-write", f"{path} is a protected path: writing needs approval")
        return None

    def readable(self, canonical: str) -> bool:
        """For directory walks (Glob/Grep/LS): skip entries a direct Read would be denied."""
        return self._protect_one(canonical, "read") is None
