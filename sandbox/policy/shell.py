"""Parse a Bash command into the simple commands it runs.

bashlex (a port of bash's own grammar) is the authority. Every simple command comes out: those
joined by ``&&``, ``||``, ``;`` and pipes, inside subshells, brace groups, loops, ``if``,
function bodies and ``$(…)``, backticks and ``<(…)``; substitutions come out *before* the
command that uses them, because they run first.

Two things bashlex does not do are handled here. It does not parse a substitution nested in a
parameter expansion (``${x:-$(rm -rf /)}``), so those are cut out and parsed on their own. And it
costs about 200 µs per command, so the common case (plain words, quotes, ``&&``, ``||``, ``;``,
``|``, no ``$``, backslash, parenthesis, brace, redirect or reserved word) goes through the
standard library's POSIX lexer, which agrees with bash on exactly that subset; anything else goes
to bashlex. Results are cached by command text: parsing is pure.

Brace expansion is bash's first expansion and bashlex leaves it to the caller, so each word of a
command is expanded here: ``rm -rf /{,}`` runs ``rm -rf / /`` and ``{rm,-rf,~}`` runs ``rm -rf ~``.
Quotes are gone by then, so a quoted brace expands too, which only ever makes a judgement stricter.
A word that would expand past :data:`MAX_BRACE_WORDS` is kept whole and marked dynamic.
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from typing import Any

import bashlex  # type: ignore[import-untyped]
import bashlex.errors  # type: ignore[import-untyped]


class Unparseable(Exception):
    """The command uses syntax the parser does not understand; it is never exempt."""


@dataclass(frozen=True, slots=True)
class Word:
    text: str  # after quote removal; "$HOME" is rewritten to "~"
    dynamic: bool = False  # the value is only known at run time ($var, $(…), `…`)
    procsub: bool = False  # <(…) / >(…): a pipe, not a file the user named


@dataclass(frozen=True, slots=True)
class Redirect:
    op: str
    target: Word | None  # None for descriptor duplication (2>&1)


@dataclass(frozen=True, slots=True)
class Simple:
    words: tuple[Word, ...]
    assignments: tuple[str, ...] = ()
    redirects: tuple[Redirect, ...] = ()
    pipeline: int = -1  # commands of one pipeline share an id; -1 when not piped
    stage: int = 0


@dataclass(frozen=True, slots=True)
class Script:
    commands: tuple[Simple, ...]
    functions: tuple[str, ...] = ()
    nested: tuple[str, ...] = ()  # substitution texts found inside ${…}: parsed separately


_FAST_UNSAFE = re.compile(r"[$`\\(){}<>\n#!]")
_OPERATORS = frozenset({"&&", "||", ";", "|", "&"})
_RESERVED = frozenset(
    {
        "if",
        "then",
        "else",
        "elif",
        "fi",
        "for",
        "while",
        "until",
        "do",
        "done",
        "case",
        "esac",
        "function",
        "select",
        "time",
        "coproc",
        "[[",
        "]]",
        "{",
        "}",
        "!",
        "in",
    }
)
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
_HOME_PARAM = re.compile(r"^\$(?:HOME\b|\{HOME\})")
_HOME_VALUE = re.compile(r"^([\w-]+=)\$(?:HOME\b|\{HOME\})")  # an option's value: of=$HOME/x
_NESTED = re.compile(r"\$\(|`|[<>]\(")
_SEQUENCE = re.compile(r"^(-?\d+|[A-Za-z])\.\.(-?\d+|[A-Za-z])(?:\.\.(-?\d+))?$")
MAX_BRACE_WORDS = 256


class _TooMany(Exception):
    pass


@functools.lru_cache(maxsize=2048)
def parse(command: str) -> Script:
    if not command.strip():
        return Script(())
    fast = _fast_parse(command)
    if fast is not None:
        return fast
    return _bashlex_parse(command)


def _lex(command: str) -> list[str] | None:
    lexer = shlex.shlex(command, posix=True, punctuation_chars="&;|")
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: let bashlex produce the error
        return None


def _fast_parse(command: str) -> Script | None:
    if _FAST_UNSAFE.search(command):
        return None
    tokens = _lex(command)
    if not tokens:
        return None
    commands: list[Simple] = []
    current: list[str] = []
    pipe_id, stage, next_pipe = -1, 0, 0
    for token in [*tokens, ";"]:
        if token not in _OPERATORS and any(c in token for c in "&;|") and token.strip("&;|") == "":
            return None  # ";;", "|&", "&&&": leave the odd ones to the real grammar
        if token not in _OPERATORS:
            current.append(token)
            continue
        if not current or current[0] in _RESERVED or _ASSIGNMENT.match(current[0]):
            if token == ";" and not current and commands and tokens[-1] in _OPERATORS:
                break  # a trailing ";" or "&"
            return None
        commands.append(Simple(tuple(Word(t) for t in current), pipeline=pipe_id, stage=stage))
        current = []
        if token == "|":
            if pipe_id == -1:
                pipe_id, next_pipe = next_pipe, next_pipe + 1
                commands[-1] = Simple(commands[-1].words, pipeline=pipe_id, stage=0)
            stage += 1
        else:
            pipe_id, stage = -1, 0
    return Script(tuple(commands))


def _bashlex_parse(command: str) -> Script:
    try:
        trees = bashlex.parse(command)
    except (
        bashlex.errors.ParsingError,
        NotImplementedError,
        AttributeError,
        IndexError,
        TypeError,
        ValueError,
        AssertionError,
    ) as exc:
        raise Unparseable(f"the shell parser cannot read this command ({exc})") from exc
    walker = _Walker()
    for tree in trees:
        walker.visit(tree)
    return Script(tuple(walker.commands), tuple(walker.functions), tuple(walker.nested))


class _Walker:
    def __init__(self) -> None:
        self.commands: list[Simple] = []
        self.functions: list[str] = []
        self.nested: list[str] = []
        self._pipes = 0

    def visit(self, node: Any, pipeline: int = -1, stage: int = 0) -> None:
        kind = node.kind
        handler = getattr(self, f"_visit_{kind}", None)
        if handler is None:
            raise Unparseable(f"unsupported shell construct: {kind}")
        handler(node, pipeline, stage)

    def _visit_list(self, node: Any, _pipeline: int, _stage: int) -> None:
        for part in node.parts:
            self.visit(part)

    def _visit_pipeline(self, node: Any, _pipeline: int, _stage: int) -> None:
        pipe_id, self._pipes = self._pipes, self._pipes + 1
        position = 0
        for part in node.parts:
            if part.kind in ("pipe", "reservedword"):
                continue
            self.visit(part, pipe_id, position)
            position += 1

    def _visit_compound(self, node: Any, pipeline: int, stage: int) -> None:
        for part in node.list:
            self.visit(part, pipeline, stage)
        redirects = tuple(self._redirect(r) for r in getattr(node, "redirects", []) or [])
        if redirects:
            self.commands.append(Simple((), (), redirects, pipeline, stage))

    def _visit_loop(self, node: Any, pipeline: int, stage: int) -> None:
        words = [part for part in node.parts if part.kind == "word"]
        if node.kind == "for" and words:
            # "for PATH in …" assigns like "PATH=…" does: record it so the judge sees it.
            self.commands.append(Simple((), (f"{words[0].word}=",), (), pipeline, stage))
        for part in node.parts:
            if part.kind == "word":
                # A for-loop variable and its items: only their substitutions run.
                self._substitutions(part)
                continue
            self.visit(part, pipeline, stage)

    _visit_for = _visit_while = _visit_until = _visit_if = _visit_loop

    def _visit_function(self, node: Any, _pipeline: int, _stage: int) -> None:
        self.functions.append(node.name.word)
        self.visit(node.body)

    def _visit_reservedword(self, _node: Any, _pipeline: int, _stage: int) -> None:
        return None

    _visit_operator = _visit_pipe = _visit_reservedword

    def _visit_command(self, node: Any, pipeline: int, stage: int) -> None:
        words: list[Word] = []
        assignments: list[str] = []
        redirects: list[Redirect] = []
        for part in node.parts:
            if part.kind == "word":
                words.extend(_brace_words(self._word(part)))
            elif part.kind == "assignment":
                self._substitutions(part)
                assignments.append(part.word)
            elif part.kind == "redirect":
                redirects.append(self._redirect(part))
            else:
                self.visit(part, pipeline, stage)
        self.commands.append(Simple(tuple(words), tuple(assignments), tuple(redirects), pipeline, stage))

    def _redirect(self, node: Any) -> Redirect:
        target = node.output if not isinstance(node.output, int) else None
        if target is None or node.type in ("<<", "<<-"):
            return Redirect(node.type, None)
        return Redirect(node.type, self._word(target))

    def _word(self, node: Any) -> Word:
        dynamic, procsub = self._substitutions(node)
        text = node.word
        params = [p for p in _walk(node) if p.kind == "parameter"]
        if params and len(params) == 1 and params[0].value == "HOME" and _HOME_PARAM.match(text):
            text = "~" + _HOME_PARAM.sub("", text)
        elif params and len(params) == 1 and params[0].value == "HOME" and _HOME_VALUE.search(text):
            text = _HOME_VALUE.sub(r"\1~", text, count=1)  # of=$HOME/x, --target-directory=${HOME}/x
        elif params:
            dynamic = True
        return Word(text, dynamic, procsub)

    def _substitutions(self, node: Any) -> tuple[bool, bool]:
        """Visit every command nested in a word; report whether its value is dynamic."""
        dynamic = procsub = False
        for part in _walk(node):
            if part.kind in ("commandsubstitution", "processsubstitution"):
                dynamic = True
                procsub = procsub or part.kind == "processsubstitution"
                self.visit(part.command)
            elif part.kind == "parameter" and _NESTED.search(part.value):
                # bashlex leaves ${x:-$(cmd)} unparsed: cut the substitutions out ourselves.
                dynamic = True
                self.nested.extend(extract_substitutions(part.value))
        return dynamic, procsub


def _brace_words(word: Word) -> list[Word]:
    if word.procsub or "{" not in word.text:
        return [word]
    texts = expand_braces(word.text)
    if texts is None:
        return [Word(word.text, True, word.procsub)]
    return [Word(text, word.dynamic, word.procsub) for text in texts]


def expand_braces(text: str, limit: int = MAX_BRACE_WORDS) -> list[str] | None:
    """The words bash's brace expansion makes of ``text``, in order; ``None`` past ``limit`` words."""
    try:
        return _expand(text, limit)
    except _TooMany:
        return None


def _expand(text: str, limit: int) -> list[str]:
    found = _first_brace(text, limit)
    if found is None:
        return [text]
    prefix, alternatives, suffix = found
    words: list[str] = []
    for alternative in alternatives:
        words.extend(_expand(prefix + alternative + suffix, limit))
        if len(words) > limit:
            raise _TooMany
    return words


def _first_brace(text: str, limit: int) -> tuple[str, list[str], str] | None:
    """The first brace that expands: ``(prefix, alternatives, suffix)``; ``{x}``, ``{}``, ``${…}`` stay."""
    for start, char in enumerate(text):
        if char != "{" or text[start - 1 : start] == "$":
            continue
        depth = 0
        commas: list[int] = []
        for index in range(start, len(text)):
            if text[index] == "{":
                depth += 1
            elif text[index] == "}":
                depth -= 1
                if depth == 0:
                    body = text[start + 1 : index]
                    alternatives = _alternatives(body, [c - start - 1 for c in commas], limit)
                    if alternatives is not None:
                        return text[:start], alternatives, text[index + 1 :]
                    break
            elif text[index] == "," and depth == 1:
                commas.append(index)
    return None


def _alternatives(body: str, commas: list[int], limit: int) -> list[str] | None:
    if commas:
        bounds = [-1, *commas, len(body)]
        return [body[bounds[i] + 1 : bounds[i + 1]] for i in range(len(bounds) - 1)]
    match = _SEQUENCE.match(body)
    if match is None:
        return None
    first, last, step = match.group(1), match.group(2), abs(int(match.group(3) or 1)) or 1
    if first.lstrip("-").isdigit() != last.lstrip("-").isdigit():
        return None
    numeric = first.lstrip("-").isdigit()
    low, high = (int(first), int(last)) if numeric else (ord(first), ord(last))
    if abs(high - low) // step + 1 > limit:
        raise _TooMany
    values = range(low, high + 1, step) if low <= high else range(low, high - 1, -step)
    return [str(v) if numeric else chr(v) for v in values]


def _walk(node: Any) -> list[Any]:
    """The word's own parts, not descending into the substitutions (visited separately)."""
    found: list[Any] = []
    for part in getattr(node, "parts", []) or []:
        found.append(part)
        if part.kind not in ("commandsubstitution", "processsubstitution"):
            found.extend(_walk(part))
    return found


def extract_substitutions(text: str) -> list[str]:
    """Inner texts of ``$(…)``, ``<(…)``, ``>(…)`` and backticks, by bracket matching."""
    found: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "`":
            end = text.find("`", i + 1)
            if end == -1:
                raise Unparseable("unterminated backtick")
            found.append(text[i + 1 : end])
            i = end + 1
        elif text[i] in "$<>" and text.startswith("(", i + 1):
            end = _matching_paren(text, i + 1)
            found.append(text[i + 2 : end])
            i = end + 1
        else:
            i += 1
    return found


def _matching_paren(text: str, start: int) -> int:
    depth = 0
    for index in range(start, len(text)):
        if text[index] == "(":
            depth += 1
        elif text[index] == ")":
            depth -= 1
            if depth == 0:
                return index
    raise Unparseable("unbalanced parenthesis in a substitution")
