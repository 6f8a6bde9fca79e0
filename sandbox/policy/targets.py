"""What a command does to the paths it names: which operands it reads and which it writes.

The command judge used to check every operand as a read and then, for a command that is not
read-only, look at the write-protected lists; an operand outside the workspace stopped at "reads
X, outside the workspace" before the write was ever seen, so ``cp x ~/.bashrc`` was described, and
judged, as a read. Here each command that writes says where: cp/mv/install/ln/rsync write their
last operand (or ``-t DIR`` / ``--target-directory``), tee its operands, dd its ``of=``, truncate,
touch, mkdir, rm, chmod, chown their operands, ``sed -i`` its files, ``sort -o``, ``shuf -o``,
split's prefix, patch, ``tar -x -C``, ``unzip -d``, ``curl -o``, ``wget -O``/``-P``, ``git -C`` of a
command that is not a query, ``git clone``/``init``, the gzip family, mktemp. A command not listed
here is not described: the judge checks its operands both ways.

Option scanning is GNU-style (clusters, attached and separate values, ``--``) with the value
letters of each program listed, so an option's value is never taken for an operand.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sandbox.policy.shell import Word

CWD = Word(".")  # a command that writes "here" (wget, unzip, tar -x without a directory)


@dataclass(frozen=True, slots=True)
class Operands:
    reads: tuple[Word, ...] = ()
    writes: tuple[Word, ...] = ()


@dataclass(slots=True)
class _Scan:
    """One command line, options apart from operands: ``options["-t"]`` / ``options["--output"]``."""

    options: dict[str, list[Word]] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)
    positionals: list[Word] = field(default_factory=list)

    def values(self, *names: str) -> list[Word]:
        return [value for name in names for value in self.options.get(name, ())]

    def has(self, *names: str) -> bool:
        return any(name in self.flags or name in self.options for name in names)


Splitter = Callable[[list[Word]], Operands]


def _scan(args: Sequence[Word], short: str = "", long: frozenset[str] = frozenset()) -> _Scan:
    """``short``: letters that take a value; ``long``: long options that take the next word."""
    scan = _Scan()
    index, ended = 0, False
    while index < len(args):
        word, text = args[index], args[index].text
        index += 1
        if ended or text == "-" or not text.startswith("-"):
            scan.positionals.append(word)
        elif text == "--":
            ended = True
        elif text.startswith("--"):
            name, eq, value = text.partition("=")
            if eq:
                scan.options.setdefault(name, []).append(Word(value, word.dynamic))
            elif name[2:] in long and index < len(args):
                scan.options.setdefault(name, []).append(args[index])
                index += 1
            else:
                scan.flags.add(name)
        else:
            index += _cluster(scan, word, short, args, index)
    return scan


def _cluster(scan: _Scan, word: Word, short: str, args: Sequence[Word], index: int) -> int:
    for position, letter in enumerate(word.text[1:]):
        name = "-" + letter
        if letter not in short:
            scan.flags.add(name)
            continue
        rest = word.text[position + 2 :]
        if rest:
            scan.options.setdefault(name, []).append(Word(rest, word.dynamic))
            return 0
        if index < len(args):
            scan.options.setdefault(name, []).append(args[index])
            return 1
        return 0
    return 0


# -- per program ----------------------------------------------------------------------------------

_REMOTE = re.compile(r"^(?:[\w.-]+@)?[\w.-]+:|^\w+://")  # rsync/scp's host:path, rsync://


def _copier(
    short: str,
    long: frozenset[str] = frozenset(),
    *,
    moves: bool = False,
    makes_dirs: bool = False,
    links: bool = False,
) -> Splitter:
    """cp, mv, install, ln, rsync, scp: the target directory, else the last of two or more operands."""

    def split(args: list[Word]) -> Operands:
        scan = _scan(args, short, long | {"target-directory"})
        if makes_dirs and scan.has("-d", "--directory"):  # install -d DIR…: creates every one
            return Operands(writes=tuple(scan.positionals))
        target, sources = scan.values("-t", "--target-directory"), scan.positionals
        if not target and len(sources) >= 2:
            target, sources = sources[-1:], sources[:-1]
        elif not target and links:
            target = [CWD]  # ln -s x: a link named like x, here
        sources = [w for w in sources if not _REMOTE.match(w.text)]
        target = [w for w in target if not _REMOTE.match(w.text)]
        return Operands(reads=tuple(sources), writes=(*target, *(sources if moves else ())))

    return split


def _all_written(short: str = "", long: frozenset[str] = frozenset(), reads: tuple[str, ...] = ()) -> Splitter:
    """tee, truncate, touch, mkdir, rm …: every operand is written; ``reads`` options name inputs."""

    def split(args: list[Word]) -> Operands:
        scan = _scan(args, short, long)
        return Operands(reads=tuple(scan.values(*reads)), writes=tuple(scan.positionals))

    return split


_MODE = re.compile(r"^(?:[0-7]{1,4}|[ugoa]*[-+=][rwxXstugo]*(?:,[ugoa]*[-+=][rwxXstugo]*)*)$")


def _chmod(args: list[Word]) -> Operands:
    scan = _scan(args)
    files = scan.positionals
    if not any(name.startswith("--reference") for name in (*scan.options, *scan.flags)) and files:
        files = files[1:] if _MODE.match(files[0].text) or files[0].dynamic else files
    return Operands(reads=tuple(scan.values("--reference")), writes=tuple(files))


def _chown(args: list[Word]) -> Operands:
    scan = _scan(args)
    files = scan.positionals if "--reference" in scan.options else scan.positionals[1:]
    return Operands(reads=tuple(scan.values("--reference")), writes=tuple(files))


def _dd(args: list[Word]) -> Operands:
    def operand(key: str) -> tuple[Word, ...]:
        return tuple(Word(w.text[len(key) :], w.dynamic) for w in args if w.text.startswith(key))

    return Operands(reads=operand("if="), writes=operand("of="))


def _sed(args: list[Word]) -> Operands:
    scan = _scan(args, "efl", frozenset({"expression", "file", "line-length"}))
    in_place = any(a.text.startswith("--in-place") or _short_has(a.text, "i") for a in args)
    files = scan.positionals if scan.has("-e", "-f", "--expression", "--file") else scan.positionals[1:]
    scripts = tuple(scan.values("-f", "--file"))
    return Operands(reads=scripts, writes=tuple(files)) if in_place else Operands(reads=(*scripts, *files))


def _short_has(text: str, letter: str) -> bool:
    return text.startswith("-") and not text.startswith("--") and letter in text[1:]


def _output(short: str, long: frozenset[str], out: tuple[str, ...], positional_reads: bool = True) -> Splitter:
    """sort -o, shuf -o: the output option is written, the operands read."""

    def split(args: list[Word]) -> Operands:
        scan = _scan(args, short, long)
        reads = tuple(scan.positionals) if positional_reads and not scan.has("-e", "--echo") else ()
        return Operands(reads=reads, writes=tuple(scan.values(*out)))

    return split


def _uniq(args: list[Word]) -> Operands:
    scan = _scan(args, "fsw", frozenset({"skip-fields", "skip-chars", "check-chars"}))
    return Operands(reads=tuple(scan.positionals[:1]), writes=tuple(scan.positionals[1:2]))


def _split(args: list[Word]) -> Operands:
    scan = _scan(args, "abCdlnt", frozenset({"suffix-length", "bytes", "line-bytes", "lines", "number"}))
    prefix = scan.positionals[1:2] or [Word("x")]
    return Operands(reads=tuple(scan.positionals[:1]), writes=tuple(prefix))


def _patch(args: list[Word]) -> Operands:
    scan = _scan(args, "pdDFiorVYzgB", frozenset({"directory", "input", "output", "reject-file", "strip"}))
    writes = [*scan.positionals[:1], *scan.values("-o", "--output", "-r", "--reject-file", "-d", "--directory")]
    return Operands(
        reads=(*scan.positionals[1:2], *scan.values("-i", "--input")),
        writes=tuple(writes or [CWD]),
    )


_TAR_SHORT = "fCTXbgKLNVFHI"
_TAR_LONG = frozenset(
    {"file", "directory", "files-from", "exclude-from", "listed-incremental", "exclude", "transform", "owner", "group"}
)


def _tar_argv(args: list[Word]) -> list[Word]:
    """Old-style ``tar xzf a.tar -C dir``: the bundled letters, their values taken in order."""
    if not args or args[0].text.startswith("-") or not args[0].text.isalpha():
        return args
    rest, out = list(args[1:]), []
    for letter in args[0].text:
        out.append(Word("-" + letter))
        if letter in _TAR_SHORT and rest:
            out.append(rest.pop(0))
    return out + rest


def _tar(args: list[Word]) -> Operands:
    scan = _scan(_tar_argv(args), _TAR_SHORT, _TAR_LONG)
    archive = [w for w in scan.values("-f", "--file") if w.text != "-"]
    directory = scan.values("-C", "--directory")
    inputs = scan.values("-T", "--files-from", "-X", "--exclude-from")
    if scan.has("-x", "--extract", "--get"):
        return Operands(reads=(*archive, *inputs), writes=tuple(directory or [CWD]))
    if scan.has("-c", "--create", "-r", "--append", "-u", "--update", "-A", "--catenate", "--concatenate", "--delete"):
        return Operands(reads=(*directory, *inputs, *scan.positionals), writes=tuple(archive))
    return Operands(reads=(*archive, *directory, *inputs))


def _unzip(args: list[Word]) -> Operands:
    scan = _scan(args, "dP")
    if scan.has("-l", "-t", "-p", "-v", "-Z", "-z"):
        return Operands(reads=tuple(scan.positionals[:1]))
    return Operands(reads=tuple(scan.positionals[:1]), writes=tuple(scan.values("-d") or [CWD]))


_CURL_WRITES = ("-o", "--output", "-D", "--dump-header", "-c", "--cookie-jar", "--trace", "--trace-ascii")
_CURL_WRITES_LONG = ("--stderr", "--libcurl", "--output-dir", "--etag-save")
_CURL_READS = ("-K", "--config", "-T", "--upload-file")


def _curl(args: list[Word]) -> Operands:
    long = frozenset(name[2:] for name in (*_CURL_WRITES, *_CURL_WRITES_LONG, *_CURL_READS) if name.startswith("--"))
    scan = _scan(args, "AbcCdDeEFHKmoPQrtTuUwxXyYz", long)
    writes = [w for w in scan.values(*_CURL_WRITES, *_CURL_WRITES_LONG) if w.text != "-"]
    if scan.has("-O", "--remote-name", "--remote-name-all", "-J") and not scan.values("--output-dir"):
        writes.append(CWD)
    return Operands(reads=tuple(scan.values(*_CURL_READS)), writes=tuple(writes))


_WGET_LONG = frozenset(
    {"output-document", "directory-prefix", "output-file", "append-output", "input-file", "save-cookies"}
)


def _wget(args: list[Word]) -> Operands:
    scan = _scan(args, "oaiBeOtTwQPUlARDXI", _WGET_LONG)
    named = ("-O", "--output-document", "-P", "--directory-prefix")
    logs = ("-o", "--output-file", "-a", "--append-output", "--save-cookies")
    writes = [w for w in scan.values(*named, *logs) if w.text != "-"]
    if not scan.values(*named):
        writes.append(CWD)
    return Operands(reads=tuple(scan.values("-i", "--input-file")), writes=tuple(writes))


def _compressor(short: str) -> Splitter:
    """gzip, xz …: each operand is replaced by its (de)compressed file, unless to stdout or a test."""

    def split(args: list[Word]) -> Operands:
        scan = _scan(args, short)
        if scan.has("-c", "--stdout", "--to-stdout", "-l", "--list", "-t", "--test"):
            return Operands(reads=tuple(scan.positionals))
        return Operands(writes=tuple(scan.positionals))

    return split


def _mktemp(args: list[Word]) -> Operands:
    scan = _scan(args, "p", frozenset({"tmpdir", "suffix"}))
    where = scan.values("-p", "--tmpdir")
    templates = [] if scan.has("-t") else scan.positionals
    return Operands(writes=(*where, *templates))


def git_operands(args: list[Word], query: bool) -> Operands:
    """``git -C DIR`` / ``--git-dir`` / ``--work-tree`` and what clone, init and worktree add create.

    ``query``: the exempt layer calls this git command read-only (status, log …), so its
    directories are read; any other git command writes in them."""
    dirs: list[Word] = []
    index = 0
    while index < len(args) and args[index].text.startswith("-"):
        text = args[index].text
        if text == "-C" and index + 1 < len(args):
            dirs.append(args[index + 1])
            index += 1
        elif text.startswith(("--git-dir=", "--work-tree=")):
            dirs.append(Word(text.partition("=")[2], args[index].dynamic))
        elif text in ("-c", "--git-dir", "--work-tree", "--namespace", "--exec-path") and index + 1 < len(args):
            if text != "-c":
                dirs.append(args[index + 1])
            index += 1
        index += 1
    rest = args[index:]
    if query:
        return Operands(reads=tuple(dirs))
    return Operands(writes=(*dirs, *_git_creates(rest)))


def _git_creates(rest: list[Word]) -> list[Word]:
    if not rest:
        return []
    positionals = [w for w in rest[1:] if not w.text.startswith("-")]
    verb = rest[0].text
    if verb == "clone":
        return positionals[1:2]
    if verb == "init":
        return positionals[:1]
    if verb == "worktree" and positionals[:1] and positionals[0].text == "add":
        return positionals[1:2]
    return []


WRITERS: dict[str, Splitter] = {
    "cp": _copier("tS", frozenset({"suffix"})),
    "mv": _copier("tS", frozenset({"suffix"}), moves=True),
    "install": _copier("tSmog", frozenset({"mode", "owner", "group", "suffix"}), makes_dirs=True),
    "ln": _copier("tS", frozenset({"suffix"}), links=True),
    "rsync": _copier("efBMT", frozenset({"rsh", "filter", "exclude", "include", "temp-dir", "rsync-path"})),
    "scp": _copier("cFiloPSJ"),
    "tee": _all_written(),
    "truncate": _all_written("sr", frozenset({"size", "reference"}), ("-r", "--reference")),
    "touch": _all_written("dtr", frozenset({"date", "reference"}), ("-r", "--reference")),
    "mkdir": _all_written("m", frozenset({"mode"})),
    "rmdir": _all_written(),
    "rm": _all_written(),
    "unlink": _all_written(),
    "shred": _all_written("ns", frozenset({"iterations", "size"})),
    "srm": _all_written(),  # the other deleters (destructive.DELETERS): what they name, they write
    "wipe": _all_written(),
    "trash": _all_written(),
    "trash-put": _all_written(),
    "chmod": _chmod,
    "chown": _chown,
    "chgrp": _chown,
    "dd": _dd,
    "sed": _sed,
    "sort": _output(
        "ktSoT", frozenset({"output", "key", "field-separator", "temporary-directory"}), ("-o", "--output")
    ),
    "shuf": _output("ino", frozenset({"output", "input-range", "head-count"}), ("-o", "--output")),
    "uniq": _uniq,
    "split": _split,
    "patch": _patch,
    "tar": _tar,
    "unzip": _unzip,
    "curl": _curl,
    "wget": _wget,
    "gzip": _compressor("S"),
    "gunzip": _compressor("S"),
    "bzip2": _compressor(""),
    "bunzip2": _compressor(""),
    "xz": _compressor("FCTM"),
    "unxz": _compressor("FCTM"),
    "mktemp": _mktemp,
}


def operands(name: str, args: list[Word]) -> Operands | None:
    """What ``name args`` reads and writes; None for a command this table does not describe."""
    split = WRITERS.get(name)
    return split(args) if split is not None else None
