"""The exempt layer's table: commands that only read, and the options that would make them write.

A command is exempt only when its name is here, the predicate accepts its arguments, and every
path it names stays inside the session roots (checked by the command judge).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sandbox.policy.flags import Shape

Predicate = Callable[[Shape, Sequence[str]], bool]


def _always(_shape: Shape, _args: Sequence[str]) -> bool:
    return True


def _no_flags(*bad: str) -> Predicate:
    def check(shape: Shape, _args: Sequence[str]) -> bool:
        return not any(flag in shape.flags for flag in bad)

    return check


def _uniq(shape: Shape, _args: Sequence[str]) -> bool:
    return len(shape.positionals) <= 1  # "uniq in out" writes out


def _date(shape: Shape, _args: Sequence[str]) -> bool:
    setting = {"-s", "--set"} & shape.flags
    return not setting and all(p.startswith("+") for p in shape.positionals)


def _hostname(shape: Shape, _args: Sequence[str]) -> bool:
    return not shape.positionals and not {"-F", "--file", "-b", "--boot"} & shape.flags


FIND_ACTIONS = frozenset({"-delete", "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fprint0", "-fprintf", "-fls"})


def _find(_shape: Shape, args: Sequence[str]) -> bool:
    return not FIND_ACTIONS.intersection(args)


GIT_READ = frozenset(
    {
        "status",
        "log",
        "diff",
        "show",
        "branch",
        "rev-parse",
        "ls-files",
        "blame",
        "describe",
        "shortlog",
        "remote",
        "tag",
        "grep",
        "ls-tree",
        "cat-file",
        "rev-list",
        "whatchanged",
        "config",
        "show-ref",
        "ls-remote",
        "reflog",
        "help",
        "version",
    }
)
_GIT_WRITING = ("--output", "--ext-diff", "--no-index", "--textconv", "--exec")


def git_subcommand(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """The git subcommand and its arguments, when the global options are harmless ones."""
    index = 0
    while index < len(args) and args[index].startswith("-"):
        if args[index] in ("--no-pager", "-P", "--no-optional-locks"):
            index += 1
        elif args[index] == "-C" and index + 1 < len(args):
            index += 2
        else:
            return None, []  # -c core.pager=…, --git-dir, --exec-path: configuration injection
    if index >= len(args):
        return None, []
    return args[index], list(args[index + 1 :])


def _git(_shape: Shape, args: Sequence[str]) -> bool:
    sub, rest = git_subcommand(args)
    if sub not in GIT_READ or any(arg.startswith(_GIT_WRITING) for arg in rest):
        return False
    positionals = [arg for arg in rest if not arg.startswith("-")]
    listing = {"-l", "--list"} & set(rest)
    if sub in ("branch", "tag"):
        return not positionals or bool(listing)
    if sub == "remote":
        return not positionals or positionals[0] in ("show", "get-url")
    if sub == "config":
        return bool({"--get", "--get-all", "--list", "-l", "--get-regexp"} & set(rest))
    if sub == "reflog":
        return not positionals or positionals[0] == "show"
    return True


# pip's reports of what is installed; none reaches an index (``list --outdated`` would) or writes a log.
_PIP_READ = frozenset({"list", "show", "freeze", "check"})
_PIP_WRITING = (
    "--log",
    "--cache-dir",
    "--outdated",
    "-o",
    "--uptodate",
    "-u",
    "--index",
    "--extra-index",
    "-i",
    "--path",
)


def _pip(_shape: Shape, args: Sequence[str]) -> bool:
    positionals = [arg for arg in args if not arg.startswith("-")]
    if not positionals:
        return set(args) <= {"--version", "-V"} and bool(args)
    return positionals[0] in _PIP_READ and not any(arg.startswith(_PIP_WRITING) for arg in args)


def _npm(_shape: Shape, args: Sequence[str]) -> bool:
    """``npm ls`` / ``npm list`` (the installed tree, read from node_modules) and ``npm --version``."""
    positionals = [arg for arg in args if not arg.startswith("-")]
    if not positionals:
        return list(args) in (["--version"], ["-v"])
    return positionals[0] in ("ls", "list") and not any(a.startswith(("--prefix", "--global", "-g")) for a in args)


_TSC_WRITING = frozenset({"-b", "--build", "-w", "--watch", "--init", "-i", "--incremental", "--composite"})


def _tsc(_shape: Shape, args: Sequence[str]) -> bool:
    """``tsc --noEmit``: the type check only (no build mode, watch, trace or build-info file)."""
    if "--noEmit" not in args or any(a in _TSC_WRITING for a in args):
        return False
    return not any(a.startswith(("--generateTrace", "--tsBuildInfoFile", "--noEmit=false")) for a in args)


READ_ONLY: dict[str, Predicate] = dict.fromkeys(
    (
        "ls",
        "cat",
        "head",
        "tail",
        "wc",
        "grep",
        "egrep",
        "fgrep",
        "pwd",
        "echo",
        "printf",
        "true",
        "false",
        "which",
        "type",
        "file",
        "stat",
        "du",
        "df",
        "diff",
        "cmp",
        "cut",
        "tr",
        "basename",
        "dirname",
        "realpath",
        "readlink",
        "whoami",
        "id",
        "uname",
        "test",
        "[",
        "sha256sum",
        "sha1sum",
        "sha512sum",
        "md5sum",
        "cksum",
        "b2sum",
        "jq",
        "column",
        "nl",
        "od",
        "hexdump",
        "seq",
        "sleep",
        "expr",
        "comm",
        "paste",
        "fold",
        "fmt",
        "rev",
        "tac",
        "strings",
        "locale",
        "nproc",
        "uptime",
        "cd",
        "pushd",
        "popd",
        "dirs",
        "read",
        ":",
        "wait",
        "arch",
        "tty",
        "groups",
        "getconf",
    ),
    _always,
)
READ_ONLY.update(
    {
        "sort": _no_flags("-o"),
        "uniq": _uniq,
        "date": _date,
        "hostname": _hostname,
        "find": _find,
        "git": _git,
        "tree": _no_flags("-o"),
        "rg": _no_flags("--pre", "--pre-glob"),
    }
)

# Read-only uses of tools that also install or build: not in READ_ONLY, whose names the command judge
# reads as "only reads its paths" (so ``npm install --prefix .git/hooks`` would lose its write
# check); the exemption layer asks these after the paths were judged as writes
# (:func:`sandbox.policy.exemptions.declared_dependencies`).
QUERIES: dict[str, Predicate] = {"pip": _pip, "pip3": _pip, "npm": _npm, "tsc": _tsc}

# Arguments of these are never file paths the command opens.
NO_PATH_ARGS = frozenset(
    {
        "echo",
        "printf",
        "true",
        "false",
        "which",
        "type",
        "tr",
        "basename",
        "dirname",
        "realpath",
        "readlink",
        "whoami",
        "id",
        "uname",
        "test",
        "[",
        "seq",
        "sleep",
        "expr",
        "locale",
        "nproc",
        "uptime",
        "date",
        "hostname",
        "cd",
        "pushd",
        "popd",
        "dirs",
        "read",
        ":",
        "wait",
        "arch",
        "tty",
        "groups",
        "getconf",
        "git",
        "command",
        "kill",
        "export",
        "unset",
        "set",
        "shopt",
        "alias",
    }
)
# The first positional is a pattern, not a path (unless -e / -f supplied it).
PATTERN_FIRST = frozenset({"grep", "egrep", "fgrep", "rg"})
