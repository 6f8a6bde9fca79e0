"""Request rules for hosts whose TLS the proxy terminates: which methods and paths a jailed tool may send.

A rule is ``METHODS PATH``: ``GET,HEAD /repos/org/*`` allows those methods on any path under
/repos/org/ (``*`` matches any run of characters, "/" included); ``* /status`` any method on
/status exactly. The query takes no part in matching; paths compare case-sensitively. A path a
server could read differently from the proxy (a "." or ".." segment, "//", a backslash, an
encoded "/", "\\", "." or "%", a control character, a fragment) is refused before any rule is
consulted; escapes of unreserved characters are decoded first (``/repos/%6Frg/x`` is ``/repos/org/x``).

Besides the rules: the ``read-only`` preset allows GET, HEAD and OPTIONS anywhere; ``git_fetch``
allows git's smart-HTTP fetch from any repository on the host; ``git_push`` names the repositories
(globs) a push may go to, and implies fetch; ``git_refs`` names the refs a push may create, update
or delete, checked on the ref commands that begin a receive-pack body (:func:`read_ref_commands`,
:meth:`RequestRules.judge_push`). No rule at all allows nothing.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

READ_ONLY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PRESETS: dict[str, frozenset[str]] = {"read-only": READ_ONLY_METHODS}
COMMAND_SECTION_LIMIT = 64 * 1024
"""The most bytes a push's ref commands, with their flush, may take."""

_TOKEN = re.compile(r"[!#$%&'+.^_`|~0-9A-Za-z-]+\Z")  # an HTTP token, without "*"
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-_~")  # "." is never decoded: %2E is refused
_AMBIGUOUS_ESCAPES = {"2F": "an encoded '/'", "5C": "an encoded '\\'", "2E": "an encoded '.'", "25": "an encoded '%'"}
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_PARAMETERS = re.compile(r";|%3B")  # Tomcat and others read "..;x" as ".."
_PKT_LENGTH = re.compile(rb"[0-9a-fA-F]{4}\Z")
_COMMAND = re.compile(r"([0-9a-fA-F]{40}|[0-9a-fA-F]{64}) ([0-9a-fA-F]{40}|[0-9a-fA-F]{64}) ([^\x00-\x20\x7f]+)\Z")
_SERVICES = {"service=git-upload-pack": "fetch", "service=git-receive-pack": "push"}
_PACKS = {"/git-upload-pack": "fetch", "/git-receive-pack": "push"}


@dataclass(frozen=True)
class RequestVerdict:
    """The rules' word on a request: ``rule`` is the one that allowed or refused it, as written."""

    allowed: bool
    rule: str | None
    message: str


@dataclass(frozen=True)
class RefCommand:
    """One command of a push: hex object ids (lower-case); an all-zero ``old`` creates, an all-zero ``new`` deletes."""

    old: str
    new: str
    ref: str

    @property
    def action(self) -> str:
        return "create" if not self.old.strip("0") else "delete" if not self.new.strip("0") else "update"


@dataclass(frozen=True)
class Glob:
    """A pattern whose ``*`` matches any run of characters, "/" included; ``text`` is as written."""

    text: str
    pattern: re.Pattern[str]

    @classmethod
    def compile(cls, text: str, normal: str) -> Glob:
        """The glob written as ``text``, matching values compared in their ``normal`` form."""
        return cls(text, re.compile(".*".join(re.escape(part) for part in normal.split("*")), re.DOTALL))

    def matches(self, value: str) -> bool:
        return self.pattern.fullmatch(value) is not None


@dataclass(frozen=True)
class PathRule:
    """``METHODS PATH``; ``methods`` is ``None`` for ``*`` (any method)."""

    methods: frozenset[str] | None
    path: Glob

    @classmethod
    def parse(cls, text: str) -> PathRule:
        words = text.split()
        if len(words) < 2:
            raise ValueError(f"request rule {text!r}: expected 'METHODS PATH', e.g. 'GET,HEAD /repos/org/*'")
        methods = [method.strip().upper() for method in "".join(words[:-1]).split(",")]
        if methods != ["*"] and not all(_TOKEN.match(method) for method in methods):
            raise ValueError(f"request rule {text!r}: methods are HTTP method names separated by ',', or '*' alone")
        if "?" in words[-1]:
            raise ValueError(f"request rule {text!r}: the query takes no part in matching; write the path alone")
        try:
            path = normalize_path(words[-1])
        except ValueError as exc:
            raise ValueError(f"request rule {text!r}: the path is ambiguous ({exc})") from None
        return cls(None if methods == ["*"] else frozenset(methods), Glob.compile(text.strip(), path))

    def matches(self, method: str, path: str) -> bool:
        return (self.methods is None or method in self.methods) and self.path.matches(path)


def normalize_path(path: str) -> str:
    """``path`` with escapes of unreserved characters decoded and other escapes upper-cased;
    ``ValueError`` names what makes it ambiguous."""
    if not path.startswith("/"):
        raise ValueError("not origin form: it does not start with '/'")
    if bad := next((char for char in path if not "!" <= char <= "~"), None):
        raise ValueError(f"a control, space or non-ASCII character ({bad!r})")
    if "\\" in path or "#" in path:
        raise ValueError("a backslash" if "\\" in path else "a fragment ('#')")
    if re.search(r"%(?![0-9A-Fa-f]{2})", path):
        raise ValueError("a '%' not followed by two hex digits")
    codes = sorted({code.upper() for code in _ESCAPE.findall(path)})
    if ambiguous := [_AMBIGUOUS_ESCAPES[code] for code in codes if code in _AMBIGUOUS_ESCAPES]:
        raise ValueError(ambiguous[0])
    if control := [code for code in codes if int(code, 16) < 0x20 or code == "7F"]:
        raise ValueError(f"an encoded control character (%{control[0]})")
    normal = _ESCAPE.sub(_unescaped, path)
    if "//" in normal:
        raise ValueError("an empty segment ('//')")
    if any(_PARAMETERS.split(segment)[0] in (".", "..") for segment in normal.split("/")):
        raise ValueError("a '.' or '..' segment")
    return normal


def _unescaped(match: re.Match[str]) -> str:
    char = chr(int(match[1], 16))
    return char if char in _UNRESERVED else f"%{match[1].upper()}"


def repository(base: str) -> str:
    """The repository a smart-HTTP path's ``base`` (what precedes ``/info/refs``) names: "/org/r.git" -> "org/r"."""
    return base.strip("/").removesuffix(".git")


def git_request(method: str, path: str, query: str) -> tuple[str, str] | None:
    """``("fetch" | "push", repository)`` for a git smart-HTTP request on a normalized path, else ``None``."""
    if method == "GET" and path.endswith("/info/refs") and query in _SERVICES:
        return _SERVICES[query], repository(path.removesuffix("/info/refs"))
    if method == "POST":
        for suffix, kind in _PACKS.items():
            if path.endswith(suffix):
                return kind, repository(path.removesuffix(suffix))
    return None


def _shown(text: str, limit: int = 200) -> str:
    clipped = text if len(text) <= limit else text[:limit] + "..."
    return "".join(char if " " <= char <= "~" else char.encode("unicode_escape").decode() for char in clipped)


def _push_glob(text: str) -> Glob:
    try:
        if not (normal := repository(normalize_path("/" + text.strip("/")))):
            raise ValueError("it names no repository")
    except ValueError as exc:
        raise ValueError(f"git_push pattern {text!r}: {exc}") from None
    return Glob.compile(text, normal)


def _ref_glob(text: str) -> Glob:
    if not text.startswith("refs/") or not all("!" <= char <= "~" for char in text):
        raise ValueError(f"git_refs pattern {text!r}: expected a full ref name, e.g. 'refs/heads/agent/*'")
    return Glob.compile(text, text)


@dataclass(frozen=True)
class RequestRules:
    """One host's request rules, parsed from a profile's ``[[network.requests]]`` table."""

    rules: tuple[PathRule, ...] = ()
    preset: str | None = None
    git_fetch: bool = False
    git_push: tuple[Glob, ...] = ()
    git_refs: tuple[Glob, ...] = ()

    @classmethod
    def parse(
        cls,
        allow: Sequence[str] = (),
        preset: str | None = None,
        git_fetch: bool = False,
        git_push: Sequence[str] = (),
        git_refs: Sequence[str] = (),
    ) -> RequestRules:
        """The rules as a profile writes them; ``ValueError`` says which one is wrong and why."""
        if preset is not None and preset not in PRESETS:
            raise ValueError(f"request preset {preset!r}: unknown (known: {', '.join(PRESETS)})")
        rules = tuple(PathRule.parse(text) for text in allow)
        return cls(rules, preset, git_fetch, tuple(map(_push_glob, git_push)), tuple(map(_ref_glob, git_refs)))

    @property
    def checks_refs(self) -> bool:
        """Whether a push's ref commands are judged (``git_refs`` was given)."""
        return bool(self.git_refs)

    def describe(self) -> list[str]:
        """Every request rule, as verdicts name them."""
        named = [rule.path.text for rule in self.rules]
        named += [f"preset {self.preset}"] if self.preset else []
        named += ["git fetch"] if self.git_fetch or self.git_push else []
        return named + [f"git push {glob.text}" for glob in self.git_push]

    def judge(self, method: str, target: str) -> RequestVerdict:
        """The verdict on a request; ``target`` is in origin form ("/path?query")."""
        method = method.upper()
        raw, _, query = target.partition("?")
        shown = f"{_shown(method, 24)} {_shown(raw)}"
        if not _TOKEN.match(method):
            return RequestVerdict(False, None, f"{shown}: not an HTTP method")
        try:
            path = normalize_path(raw)
        except ValueError as exc:
            return RequestVerdict(False, None, f"{shown}: the path is ambiguous ({_shown(str(exc))}); refused")
        if rule := next((rule for rule in self.rules if rule.matches(method, path)), None):
            return RequestVerdict(True, rule.path.text, f"{shown}: allowed by {rule.path.text}")
        if self.preset and method in PRESETS[self.preset]:
            return RequestVerdict(True, f"preset {self.preset}", f"{shown}: allowed by preset {self.preset}")
        kind, repo = git_request(method, path, query) or ("", "")
        if kind == "fetch" and (self.git_fetch or self.git_push):
            return RequestVerdict(True, "git fetch", f"{shown}: a git fetch from {repo}, allowed by git fetch")
        if kind == "push" and self.git_push:
            if glob := next((glob for glob in self.git_push if glob.matches(repo)), None):
                return RequestVerdict(True, f"git push {glob.text}", f"{shown}: a git push to {repo}, allowed")
            named = ", ".join(glob.text for glob in self.git_push)
            return RequestVerdict(False, None, f"{shown}: a git push to {repo}, which git_push does not name ({named})")
        rules = "; ".join(self.describe()) or "none"
        what = f"a git {kind} from {repo}: " if kind == "fetch" else f"a git push to {repo}: " if kind else ""
        return RequestVerdict(False, None, f"{shown}: {what}no request rule allows it (rules: {rules})")

    def push_repository(self, method: str, target: str) -> str | None:
        """The repository a push (``POST <repo>/git-receive-pack``) goes to, when ``judge`` allows it and
        its ref commands must be judged by :meth:`judge_push`; ``None`` for any other request."""
        if not self.git_refs or method.upper() != "POST" or not self.judge(method, target).allowed:
            return None
        raw, _, query = target.partition("?")
        kind, repo = git_request("POST", normalize_path(raw), query) or ("", "")
        return repo if kind == "push" else None

    def judge_push(self, repository: str, commands: Sequence[RefCommand]) -> RequestVerdict:
        """Whether every command's ref is one ``git_refs`` names (a deletion is judged as an update)."""
        if not self.git_refs:
            return RequestVerdict(True, None, f"a push to {repository}: any ref may change")
        used: list[str] = []
        for command in commands:
            glob = next((glob for glob in self.git_refs if glob.matches(command.ref)), None)
            if glob is None:
                named = ", ".join(glob.text for glob in self.git_refs)
                message = f"a push to {repository}: the {command.action} of {_shown(command.ref)} is refused"
                return RequestVerdict(False, None, f"{message}; git_refs allows only {named}")
            used += [glob.text] if glob.text not in used else []
        rule = f"git refs {', '.join(used)}" if used else None
        return RequestVerdict(True, rule, f"a push to {repository}: every ref allowed")


def read_ref_commands(data: bytes) -> tuple[list[RefCommand], int] | None:
    """The ref commands that begin a git-receive-pack request body and the offset just past their
    flush; ``None`` while ``data`` does not hold them all; ``ValueError`` when they are malformed,
    exceed :data:`COMMAND_SECTION_LIMIT`, or begin a shallow or signed (push-cert) push."""
    commands: list[RefCommand] = []
    at = 0
    while True:
        length = _pkt_length(data[at : at + 4]) if len(data) >= at + 4 else 4  # 4: a header to wait for
        end = at + (length or 4)
        if end > COMMAND_SECTION_LIMIT:
            raise ValueError("a push's ref commands take more than 64 KiB")
        if len(data) < end:
            return None
        if length == 0:
            return commands, end
        commands.append(_ref_command(data[at + 4 : end], first=not commands))
        at = end


def _pkt_length(header: bytes) -> int:
    length = int(header, 16) if _PKT_LENGTH.match(header) else -1
    if length < 0 or 0 < length < 5 or length > 65520:  # 65520: git's LARGE_PACKET_MAX
        raise ValueError(f"a pkt-line length of {header.decode('latin-1')!r} where a ref command belongs")
    return length


def _ref_command(payload: bytes, first: bool) -> RefCommand:
    if payload.startswith(b"shallow "):
        raise ValueError("a push from a shallow clone ('shallow' lines) is refused: push from a full clone")
    if payload.startswith(b"push-cert") and payload[9:10] in (b"", b"\0", b"\n"):
        raise ValueError("a signed push (push-cert) is refused: push without --signed")
    line = payload.removesuffix(b"\n")
    if first:
        line = line.partition(b"\0")[0]  # the client's capabilities follow the first command
    match = _COMMAND.match(line.decode(errors="surrogateescape"))  # git's ref names are bytes, mostly UTF-8
    if match is None or len(match[1]) != len(match[2]):
        raise ValueError(f"not a ref command ('<old> <new> <ref>'): {_shown(line.decode('latin-1'), 120)}")
    return RefCommand(match[1].lower(), match[2].lower(), match[3])
