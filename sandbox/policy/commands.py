"""Command rules for Bash: every simple command inside a command line is judged.

Layers, strongest first (as in safety-gate): **deny**, seed 004's two classes only (format a disk
or write a raw block device; delete /, a home directory or a drive root: never run, never
asked); **ask** (user ask rules and a few built-ins, among them deleting another top-level system
directory such as /usr or /etc: confirmed in every mode, never granted for the session);
**exempt** (read-only commands whose paths stay inside the roots: run silently); everything
else follows the permission mode.

The paths a command names are judged as what it does with them (:mod:`sandbox.policy.targets`):
a write outside the writable roots (workspace, scratch, the jail's /tmp) is asked in every mode and
never covered by a session grant, like the Write tool's outside path, and never called a read.

Wrappers (sudo, env, nice, timeout, xargs, bash -c, sh -c, eval, find -exec, …) are unwrapped and
the inner command judged (:mod:`sandbox.policy.wrappers` names them). What cannot be known
statically (a command name from ``$(…)``, code from a variable, syntax the parser rejects) is never
exempt and is confirmed in every mode: the point of an obfuscated command is to look harmless, so
"follows the mode" would let ``auto`` run it.

The deny layer's commands and what they destroy are :mod:`sandbox.policy.destructive`'s.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox.policy import targets
from sandbox.policy.destructive import (
    BLOCK_DEVICE,
    DELETERS,
    DENY_LAYER_NAMES,
    HARMLESS_DEVICES,
    DenyLayer,
    has_glob,
    removes_entry,
)
from sandbox.policy.flags import Shape, shape
from sandbox.policy.readonly import NO_PATH_ARGS, PATTERN_FIRST, READ_ONLY, git_subcommand
from sandbox.policy.rules import BUILTIN_IDS, RuleSet
from sandbox.policy.shell import Simple, Unparseable, Word, expand_braces, parse
from sandbox.policy.verdict import EXEMPT, Finding, strongest
from sandbox.policy.wrappers import ESCALATION, INTERPRETERS, SHELLS, WRAPPERS, program_reader, unwrap

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandbox.policy.paths import PathPolicy, ResolvedPath
    from sandbox.vocabulary import Layer

MAX_DEPTH = 6
SENSITIVE_VAR = re.compile(
    r"^(PATH|LD_\w*|DYLD_\w*|BASH_ENV|ENV|IFS|PS4|PROMPT_COMMAND|SHELLOPTS|BASHOPTS|GIT_\w*|PAGER|\w*_PAGER"
    r"|EDITOR|VISUAL|BROWSER|PYTHONPATH|PYTHONSTARTUP|NODE_OPTIONS|PERL5OPT|PERL5LIB|RUBYOPT|CDPATH|HOME"
    r"|BASH_FUNC_\w*|HISTFILE)$"
)
PUBLISHERS: dict[str, str] = {
    "npm": "publish",
    "pnpm": "publish",
    "yarn": "publish",
    "bun": "publish",
    "twine": "upload",
    "cargo": "publish",
    "gem": "push",
    "poetry": "publish",
    "flit": "publish",
    "hatch": "publish",
    "uv": "publish",
    "dotnet": "nuget",
    "mvn": "deploy",
    "gradle": "publish",
}
WRITE_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<>", ">&"})


@dataclass(frozen=True, slots=True)
class CommandVerdict:
    finding: Finding
    findings: tuple[Finding, ...]
    external: bool
    paths: tuple[ResolvedPath, ...]


# An extra exemption for one simple command (the classifier's switches, sandbox.policy.exemptions):
# the exempt finding when the command is exempt, else None.
Exemption = Callable[[Shape, "Sequence[str]"], "Finding | None"]
# An exemption for a path a command writes (a redirect): trusted.paths, in_project_writes.
WriteExemption = Callable[["ResolvedPath"], "Finding | None"]


def judge(
    command: str,
    paths: PathPolicy,
    rules: RuleSet,
    exemption: Exemption | None = None,
    writes: WriteExemption | None = None,
    programs: Sequence[str] = (),
) -> CommandVerdict:
    """Judge a whole command line; the strongest finding decides.

    ``programs``: the workspace directories the jail puts first on ``PATH`` (``env.workspace_path``):
    a name found there is the workspace's program, not the system's command of that name.
    """
    judge_ = _Judge(paths, rules)
    judge_.exemption = exemption
    judge_.writes = writes
    judge_.programs = tuple(programs)
    judge_.run(command)
    findings = tuple(judge_.findings)
    external = any(p.external for p in judge_.resolved)
    default = next((f for f in findings if f.layer == "exempt"), EXEMPT)
    return CommandVerdict(strongest(list(findings), default), findings, external, tuple(judge_.resolved))


class _Judge:
    def __init__(self, paths: PathPolicy, rules: RuleSet) -> None:
        self.paths = paths
        self.rules = rules
        self.compiled = [r for r in rules.compiled(paths.homes) if r.rule.tool == "Bash"]
        self.findings: list[Finding] = []
        self.resolved: list[ResolvedPath] = []
        self.cwd: str | None = paths.workspace
        self.depth = 0
        self.deny = DenyLayer(paths)
        self.exemption: Exemption | None = None
        self.writes: WriteExemption | None = None
        self.programs: tuple[str, ...] = ()

    def add(self, layer: Layer, rule_id: str, reason: str) -> None:
        if rule_id in BUILTIN_IDS and not self.rules.enabled(rule_id):
            return
        self.findings.append(Finding(layer, rule_id, reason))

    # -- whole command lines ---------------------------------------------------------------

    def run(self, command: str) -> None:
        if self.depth > MAX_DEPTH:
            self.add("ask", "shell.too-deep", "commands nested too deeply to judge")
            return
        self._text_rules(command)
        try:
            script = parse(command)
        except Unparseable as exc:
            self.add("ask", "parse.unparseable", f"{exc}; a command that cannot be parsed is confirmed")
            self._coarse(command)
            return
        if script.functions:
            self.add("mode", "shell.function", "defines shell functions, so names may not mean what they seem")
        for text in script.nested:
            self._nested(text)
        for cmd in script.commands:
            self._pipe_to_shell(cmd)
            self._simple(cmd)

    def _nested(self, text: str) -> None:
        saved = self.cwd
        self.depth += 1
        try:
            self.run(text)
        finally:
            self.depth -= 1
            self.cwd = saved

    def _text_rules(self, command: str) -> None:
        for rule in self.compiled:
            if rule.rule.action != "allow" and rule.matches_text(command):
                layer: Layer = "deny" if rule.rule.action == "block" else "ask"
                self.add(layer, rule.rule.id, f"matches your {rule.rule.action} rule {rule.rule.text!r}")

    def _coarse(self, command: str) -> None:
        """For text the grammar rejects: still find the deny layer's commands among the words."""
        try:
            lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            tokens = [text for token in lexer for text in expand_braces(token) or (token,)]
        except ValueError:
            return
        words = [Word(t.strip("()`"), "$" in t) for t in tokens]
        for index, word in enumerate(words):
            name = os.path.basename(word.text)
            if name in DENY_LAYER_NAMES or name.startswith("mkfs"):
                end = next(
                    (j for j in range(index, len(tokens)) if tokens[j] in (";", "&&", "||", "|", ";;", "&", "\n")),
                    len(tokens),
                )
                self._deny_layer(name, words[index + 1 : end])

    def _pipe_to_shell(self, cmd: Simple) -> None:
        if cmd.stage == 0 or not cmd.words or cmd.words[0].dynamic:
            return
        name = program_reader(cmd.words)
        if name is not None:
            self.add("ask", "ask.pipe-to-shell", f"the pipeline feeds data to {name} as a program")

    # -- one simple command -----------------------------------------------------------------

    def _simple(self, cmd: Simple) -> None:
        for assignment in cmd.assignments:
            self._assignment(assignment)
        for redirect in cmd.redirects:
            if redirect.target is not None and redirect.op not in ("<<<",):
                self._redirect(redirect.op, redirect.target)
        if cmd.words:
            self._argv(list(cmd.words), unknown_args=False)

    def _assignment(self, text: str) -> None:
        name = text.split("=", 1)[0].rstrip("+").split("[", 1)[0]
        if SENSITIVE_VAR.match(name):
            self.add("mode", "shell.sensitive-variable", f"sets {name}, which changes what later commands run")

    def _redirect(self, op: str, target: Word) -> None:
        if target.procsub:
            return
        if target.dynamic:
            self.add("mode", "shell.dynamic-path", f"redirects to {target.text}, only known at run time")
            return
        if HARMLESS_DEVICES.match(target.text):
            return
        resolved = self._resolve(target.text)
        if resolved is None:
            self.add("mode", "shell.unknown-cwd", "redirects relative to a directory only known at run time")
        elif op in WRITE_REDIRECTS:
            self._write_target(resolved)
        else:
            self._read_target(resolved)

    def _resolve(self, text: str, *, entry: bool = False) -> ResolvedPath | None:
        if "\x00" in text:  # no program can be given such a path: the text is not what it seems
            self.add("ask", "parse.unparseable", "a path with a NUL byte cannot be judged; it is confirmed")
            return None
        if self.cwd is None and not text.startswith(("/", "~")):
            return None
        resolved = self.paths.resolve(text, self.cwd, entry=entry)
        self.resolved.append(resolved)
        return resolved

    def _write_target(self, path: ResolvedPath, operand: bool = False) -> None:
        """A path the command writes: a redirect's target, or an operand ``targets`` calls written.

        Outside the writable roots (workspace, scratch, the jail's /tmp) it is asked in every mode,
        never granted for the session: the Write tool refuses such a path outright, and a command
        must not be the way round that. An operand inside follows the mode with its command."""
        if BLOCK_DEVICE.match(path.canonical) or BLOCK_DEVICE.match(path.lexical):
            self.add("deny", "deny.raw-device", f"writes to the raw block device {path.lexical}")
            return
        finding = self.paths.protection(path, "write")
        if finding is not None:
            self.add(finding.layer, finding.rule_id, finding.reason)
        exempt = self.writes(path) if self.writes is not None and finding is None and not operand else None
        if exempt is not None:
            self.findings.append(exempt)
        elif path.root == "external" and not self.paths.in_tmp(path):
            where = f"outside the workspace, the scratch directory and /tmp ({path.escape} path)"
            self.add("ask", "path.external-write", f"writes {path.canonical}, {where}")
        elif not operand and path.root != "scratch":
            self.add("mode", "shell.writes", f"writes {path.canonical}")

    def _read_target(self, path: ResolvedPath, verb: str = "reads") -> bool:
        """Checks a path the command reads; False when it keeps the command from being exempt."""
        finding = self.paths.protection(path, "read")
        if finding is not None:
            self.add(finding.layer, finding.rule_id, finding.reason)
            return False
        if path.root == "external":
            self.add("mode", "path.external", f"{verb} {path.canonical}, outside the workspace")
            return False
        return True

    # -- argv, wrappers ---------------------------------------------------------------------

    def _argv(self, words: list[Word], unknown_args: bool) -> None:
        head = words[0]
        if head.dynamic:
            self.add("ask", "shell.dynamic-command", f"the command name {head.text!r} is only known at run time")
            self._deny_layer("", words[1:])
            return
        name = os.path.basename(head.text)
        args = words[1:]
        if name in WRAPPERS:
            self._wrapper(name, args, unknown_args)
        elif name in SHELLS:
            self._shell(name, args)
        elif name == "eval":
            self._eval(args)
        else:
            self._command(head, name, args, unknown_args)

    def _wrapper(self, name: str, args: list[Word], unknown_args: bool) -> None:
        if name in ESCALATION:
            self.add("ask", "ask.sudo", f"{name} runs a command with elevated privileges")
        if name == "command" and args and args[0].text in ("-v", "-V"):
            return  # a lookup, runs nothing
        assignments, inner = unwrap(name, args)
        for assignment in assignments:
            self._assignment(assignment)
        if name == "xargs":
            unknown_args = True
            self.add("mode", "shell.xargs", "xargs builds arguments from its input at run time")
        if inner:
            self._argv(inner, unknown_args)
        elif name in ("env", "xargs", "watch", "script"):
            self.add("mode", "shell.command", f"{name} without a command")

    def _shell(self, name: str, args: list[Word]) -> None:
        has_c, index = False, 0
        while index < len(args) and args[index].text.startswith(("-", "+")) and args[index].text != "--":
            text = args[index].text
            has_c = has_c or (not text.startswith("--") and "c" in text[1:])
            index += 2 if text in ("-o", "+o", "-O", "+O") else 1
        if index < len(args) and args[index].text == "--":
            index += 1
        if not has_c:
            self.add("mode", "shell.script", f"{name} runs a script")
            return
        if index >= len(args) or args[index].dynamic:
            self.add("ask", "shell.dynamic-code", f"{name} -c runs code only known at run time")
            return
        self._nested(args[index].text)

    def _eval(self, args: list[Word]) -> None:
        if any(word.dynamic for word in args):
            self.add("ask", "shell.dynamic-code", "eval runs code only known at run time")
            return
        self._nested(" ".join(word.text for word in args))

    # -- a command with its name known -------------------------------------------------------

    def _command(self, head: Word, name: str, args: list[Word], unknown_args: bool) -> None:
        texts = [word.text for word in args]
        cmd = shape(name, texts)
        self._deny_layer(name, args)
        if unknown_args and name in DELETERS:
            self.add("ask", "shell.dynamic-delete", f"{name} deletes paths only known at run time (xargs, find -exec)")
        allowed = self._user_rules(cmd)
        self._builtin_asks(name, cmd, texts)
        if name == "find":
            self._find_exec(args)
        if name in INTERPRETERS:
            self.add("mode", "shell.interpreter", f"{name} runs a program")
        paths_ok = self._operands(name, args, cmd, texts)
        if name in ("cd", "pushd"):
            self._cd(args)
        if "/" not in head.text and self._shadowed(name):
            # `git status` would run the workspace's node_modules/.bin/git: a program, never exempt.
            self.add(
                "mode", "shell.workspace-program", f"{name} is the workspace's own program ({self._shadowed(name)})"
            )
            return
        if allowed or self._exempt(head, name, cmd, texts, unknown_args, paths_ok):
            return
        extra = self.exemption(cmd, texts) if self.exemption is not None and not unknown_args else None
        if extra is not None and "/" not in head.text:
            self.findings.append(extra)
            return
        self.add("mode", "shell.command", f"{name} is not a read-only command")

    def _shadowed(self, name: str) -> str | None:
        """The workspace program the jail's ``PATH`` finds before the system's ``name``, if any."""
        for folder in self.programs:
            path = os.path.join(folder, name)
            if os.path.lexists(path):
                return path
        return None

    def _exempt(
        self, head: Word, name: str, cmd: Shape, texts: Sequence[str], unknown_args: bool, paths_ok: bool
    ) -> bool:
        predicate = READ_ONLY.get(name)
        if predicate is None or unknown_args or not paths_ok:
            return False
        if "/" in head.text and os.path.dirname(head.text) not in ("/bin", "/usr/bin", "/usr/local/bin"):
            return False  # ./ls is a program in the workspace, not the system's ls
        if not self.rules.enabled("exempt.read-only"):
            return False
        return predicate(cmd, texts)

    def _user_rules(self, cmd: Shape) -> bool:
        allowed = False
        for rule in self.compiled:
            if not rule.matches_simple(cmd):
                continue
            if rule.rule.action == "allow":
                allowed = True
            else:
                layer: Layer = "deny" if rule.rule.action == "block" else "ask"
                what = rule.rule.text or rule.rule.command
                self.add(layer, rule.rule.id, f"matches your {rule.rule.action} rule {what!r}")
        return allowed

    def _builtin_asks(self, name: str, cmd: Shape, texts: Sequence[str]) -> None:
        if name == "git":
            sub, rest = git_subcommand(texts)
            forced = {"-f", "--force", "--force-with-lease", "--force-if-includes", "--mirror", "--delete"}
            if sub == "push" and (
                forced & set(rest)
                or any(a.startswith(("+", "--force")) for a in rest)
                or any(a.startswith("-") and not a.startswith("--") and "f" in a for a in rest)
            ):
                self.add("ask", "ask.git-force-push", "force-pushes to a git remote")
        verb = PUBLISHERS.get(name)
        if verb is not None and verb in cmd.positionals:
            self.add("ask", "ask.publish", f"{name} {verb} publishes a package")

    def _find_exec(self, args: list[Word]) -> None:
        index = 0
        while index < len(args):
            if args[index].text in ("-exec", "-execdir", "-ok", "-okdir"):
                end = next((j for j in range(index + 1, len(args)) if args[j].text in (";", "+")), len(args))
                inner = [Word(w.text, w.dynamic or "{}" in w.text) for w in args[index + 1 : end]]
                if inner:
                    self._argv(inner, unknown_args=True)
                index = end
            index += 1

    def _cd(self, args: list[Word]) -> None:
        targets = [w for w in args if not w.text.startswith("-")]
        if not targets:
            self.cwd = self.paths.home
        elif targets[0].dynamic or self.cwd is None and not targets[0].text.startswith(("/", "~")):
            self.cwd = None
        else:
            self.cwd = self.paths.resolve(targets[0].text, self.cwd).canonical

    # -- paths named by a command -------------------------------------------------------------

    def _path_words(self, name: str, args: list[Word], cmd: Shape) -> list[Word]:
        if name in NO_PATH_ARGS:
            return []
        if name == "find":
            return list(itertools.takewhile(lambda w: not w.text.startswith(("-", "(", "!")), args))
        values = set(cmd.values)
        words = [w for w in args if not w.text.startswith("-") or w.text == "-"]
        if name in PATTERN_FIRST and not {"-e", "-f", "--regexp", "--file"} & cmd.flags and words:
            words = words[1:]
        extra = [Word(v, False) for v in values if "/" in v or v.startswith(("~", "."))]
        return [w for w in words if w.text not in values] + extra

    def _path_args(self, name: str, args: list[Word], cmd: Shape, read_only: bool) -> bool:
        ok = True
        for word in self._path_words(name, args, cmd):
            if word.procsub or word.text == "-":
                continue
            if word.dynamic:
                ok = False
                continue
            for text in self._expand_glob(word.text) if read_only else (word.text,):
                ok = self._path_arg(text, read_only) and ok
        return ok

    def _expand_glob(self, text: str) -> list[str]:
        if not has_glob(text) or self.cwd is None:
            return [text]
        pattern = self.paths.expand(text, self.cwd)
        # Bounded: a glob over a huge tree must not make the gate slow; what we saw stands for it.
        return [text, *itertools.islice(glob.iglob(pattern, include_hidden=True), 256)]

    def _path_arg(self, text: str, read_only: bool) -> bool:
        if HARMLESS_DEVICES.match(text):
            return True
        resolved = self._resolve(text)
        if resolved is None:
            return False
        if read_only:
            return self._read_target(resolved)
        # A program ``targets`` does not describe may write what it names, outside or not.
        ok = self._read_target(resolved, "names (may read or write)")
        finding = self.paths.protection(resolved, "write")
        if finding is not None:
            self.add(finding.layer, finding.rule_id, finding.reason)
        return ok

    def _operands(self, name: str, args: list[Word], cmd: Shape, texts: Sequence[str]) -> bool:
        """Judge the paths a command names as what it does with them; False keeps it from being exempt."""
        read_only = name in READ_ONLY
        if name == "git":
            described: targets.Operands | None = targets.git_operands(args, query=READ_ONLY["git"](cmd, texts))
        else:
            described = targets.operands(name, args)
        if described is None:
            return self._path_args(name, args, cmd, read_only)
        ok = True
        for word in described.reads:
            ok = self._path_word(word, read_only) and ok
        for word in described.writes:
            self._write_word(word, entry=removes_entry(name, texts))  # rm removes a link; shred writes its target
        return ok and not described.writes

    def _path_word(self, word: Word, read_only: bool) -> bool:
        if word.procsub or word.text == "-":
            return True
        if word.dynamic:
            return False
        ok = True
        for text in self._expand_glob(word.text) if read_only else (word.text,):
            ok = self._path_arg(text, read_only=True) and ok
        return ok

    def _write_word(self, word: Word, *, entry: bool = False) -> None:
        if word.procsub or word.text == "-" or HARMLESS_DEVICES.match(word.text):
            return
        if word.dynamic:
            self.add("mode", "shell.dynamic-path", f"writes {word.text}, only known at run time")
            return
        resolved = self._resolve(word.text, entry=entry)
        if resolved is None:
            self.add("mode", "shell.unknown-cwd", "writes relative to a directory only known at run time")
            return
        finding = self.paths.protection(resolved, "read")  # what it overwrites it may read back
        if finding is not None:
            self.add(finding.layer, finding.rule_id, finding.reason)
        self._write_target(resolved, operand=True)

    # -- the deny layer ---------------------------------------------------------------------------

    def _deny_layer(self, name: str, args: Sequence[Word]) -> None:
        for finding in self.deny.judge(name, args, self.cwd):
            self.add(finding.layer, finding.rule_id, finding.reason)
