"""A scripted backend for protocol tests: nothing runs and nothing is enforced.

The fake keeps the :class:`~sandbox.backends.base.Backend` interface to the letter, so the
executor, a session and ``sandbox serve`` can be tested on any host, without bubblewrap or a
Docker daemon, the way httpcore tests its connection pool over a mock backend. Each spawned
command is answered by a :class:`Script`: chunks of stdout and stderr in order, pauses between
them (a pause of ``math.inf`` lasts until the call is killed, for timeout and abort tests), an
exit status, and what the memory accounting reports. Tests choose the script per call, by the
command text (``FakeBackend(scripts={"make": Script.output(b"ok\\n")})``) or by a handler that
sees the whole :class:`Call`, as ``httpx.MockTransport(handler)`` does. What it records is
there to assert on: every jail it opened, every process and the kills each one received.

Anything unscripted gets :func:`default_script`: a toy reading of the command that knows
``echo`` (``>&2`` sends it to stderr), ``sleep``, ``true``, ``false`` and ``exit``, joined by
``;`` or ``&&``, with ``$NAME`` taken from the environment the call was given; any other word
is "command not found" (127), as a shell would say, and a pipe or a redirection it cannot read
is status 2 with a line saying so. That is enough for ``session.open`` with ``backend: "fake"``
and a Bash call to behave like the real thing at the protocol level.

The file tools (Read, Write, Edit, Glob, Grep, LS) send their runner to ``python3`` in the
jail. The fake never runs it, nor touches the workspace: unscripted, such a call gets the
runner's own reply shape saying ``TOOL_FAILED`` (the fake runs no file tools); a test that
needs a file tool to succeed scripts the reply with :meth:`Script.reply`.

What it does not do, ever: isolate, confine, limit or run anything. Its probe grants every
guarantee so that any profile opens, and says in the same report that none is enforced. It is
loadable by name only: ``auto`` never picks it, and the CLI neither offers it nor lists it in
``sandbox check`` (they iterate :data:`sandbox.vocabulary.BACKENDS`, the real backends).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
import shlex
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias, get_args

import anyio
from anyio.abc import ByteReceiveStream

from sandbox.backends.base import Backend, Jail, Process
from sandbox.guarantees import Report
from sandbox.vocabulary import Guarantee, Stream

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from pathlib import Path

    from sandbox.backends.base import Stdin
    from sandbox.network.egress import Egress
    from sandbox.profile import Profile
    from sandbox.snapshots import Snapshot

Step: TypeAlias = "tuple[Stream, bytes] | float"
"""One step of a script: a chunk written to ``stdout`` or ``stderr``, or a pause in seconds."""

Handler: TypeAlias = "Callable[[Call], Script]"
"""Chooses the script of a call the backend's ``scripts`` do not name."""

NOTHING_ENFORCED = "the fake backend is a scripted stand-in for tests: it runs nothing and enforces nothing"
NO_FILE_TOOLS = "the fake backend runs no file tools; script the runner's reply with Script.reply"
READ_SIZE = 1 << 16

# Pids from 2**22 up: above the kernel's largest pid_max, so a fake pid is never a real process.
_pids = itertools.count(1 << 22)


@dataclass(frozen=True)
class Script:
    """What one fake command does: its output steps in order, then its exit."""

    steps: Sequence[Step] = ()
    exit_code: int = 0  # as subprocess reports it: -N for "killed by signal N"
    ignores_term: bool = False  # a kill waits its whole grace before the KILL lands
    leaves_running: bool = False  # a background child outlives the exit, holding the pipes, until killed
    oom_killed: bool = False
    peak_memory: int | None = None

    @classmethod
    def output(cls, stdout: bytes = b"", stderr: bytes = b"", exit_code: int = 0) -> Script:
        """Write ``stdout``, then ``stderr``, then exit."""
        return cls((("stdout", stdout), ("stderr", stderr)), exit_code)

    @classmethod
    def hang(cls, before: Sequence[Step] = ()) -> Script:
        """Run ``before``, then never exit on its own (until a timeout or an abort kills it)."""
        return cls((*before, math.inf))

    @classmethod
    def reply(cls, reply: Mapping[str, Any]) -> Script:
        """A file tool's runner answering ``reply`` (``ok``, ``content``, ``error_code``, ``details``)."""
        return cls.output(json.dumps({"error_code": None, "details": {}, **reply}).encode())


class Kill(NamedTuple):
    """One ``kill_tree`` call: its grace and the fake pids it found running."""

    grace: float
    pids: tuple[int, ...]


@dataclass(frozen=True)
class Call:
    """One spawn as the fake saw it; ``stdin`` holds bytes given whole (a stream is read later)."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    stdin: bytes | None = None

    @property
    def command(self) -> str:
        """The command as a user wrote it: a Bash call's text, else the argv joined as shell words."""
        argv = self.argv
        if argv[:2] == ("/bin/sh", "-c") and len(argv) == 5 and argv[3] == "sandbox-bash":
            return argv[4]  # sandbox.tools' Bash wrapper: sh -c WRAPPER sandbox-bash COMMAND
        if argv[:2] == ("/bin/sh", "-c") and len(argv) > 5 and argv[3] == "sandbox":
            return shlex.join(argv[5:])  # sandbox.calls.checked_argv: sh -c CHECK sandbox HINT ARGV...
        return shlex.join(argv)

    @property
    def is_file_tool(self) -> bool:
        """Whether this is the file tools' runner (``python3 ... -c SOURCE``, a JSON request on stdin)."""
        return bool(self.argv) and self.argv[0].rsplit("/", 1)[-1].startswith("python3") and "-c" in self.argv

    def request(self) -> dict[str, Any]:
        """The file tool's JSON request, or ``{}`` when there is none."""
        try:
            loaded = json.loads(self.stdin or b"")
        except ValueError:
            return {}
        return loaded if isinstance(loaded, dict) else {}


# -- the unscripted default -------------------------------------------------------------------------

_OPERATORS = ";&|<>"
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def default_script(call: Call) -> Script:
    """What an unscripted call does: a file tool fails plainly; a command is read as a toy shell."""
    if call.is_file_tool:
        return _no_file_tools(call)
    try:
        words = _words(call.command)
    except ValueError as exc:
        return Script.output(stderr=f"fake: cannot parse the command: {exc}\n".encode(), exit_code=2)
    unknown = [word for word in words if set(word) <= set(_OPERATORS) and word not in (";", "&&", ">&")]
    if unknown:
        why = f"fake: cannot interpret {unknown[0]!r}; the fake reads only ';', '&&' and '>&2'; script this command\n"
        return Script.output(stderr=why.encode(), exit_code=2)
    return _interpret(words, call.env)


def _no_file_tools(call: Call) -> Script:
    request = call.request()
    return Script.reply(
        {
            "ok": False,
            "error_code": "TOOL_FAILED",
            "content": NO_FILE_TOOLS,
            "details": {"backend": "fake", "op": request.get("op")},
            "resolved": request.get("path"),
        }
    )


def _words(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=_OPERATORS)
    lexer.whitespace_split = True
    return list(lexer)


def _interpret(words: Sequence[str], env: Mapping[str, str]) -> Script:
    steps: list[Step] = []
    status = 0
    for separator, simple in _commands(words):
        if separator == "&&" and status != 0:
            continue
        if simple[:1] == ["exit"]:
            return Script(tuple(steps), _number(simple[1:], status))
        more, status = _simple([_expand(word, env) for word in simple])
        steps += more
    return Script(tuple(steps), status)


def _commands(words: Sequence[str]) -> Iterator[tuple[str, list[str]]]:
    """Each simple command with the separator before it (``;`` for the first)."""
    separator = ";"
    simple: list[str] = []
    for word in words:
        if word in (";", "&&"):
            if simple:
                yield separator, simple
            separator, simple = word, []
        else:
            simple.append(word)
    if simple:
        yield separator, simple


def _simple(words: list[str]) -> tuple[list[Step], int]:
    """The steps and exit status of one simple command."""
    name, args = words[0], words[1:]
    if name == "echo":
        stream: Stream = "stdout"
        if args[-2:] == [">&", "2"]:
            stream, args = "stderr", args[:-2]
        return [(stream, (" ".join(args) + "\n").encode())], 0
    if name == "sleep":
        seconds = _seconds(args)
        if seconds is None:
            return [("stderr", f"fake: sleep: invalid time interval {' '.join(args)!r}\n".encode())], 1
        return [seconds], 0
    if name in ("true", "false"):
        return [], int(name == "false")
    return [("stderr", f"fake: {name}: command not found (the fake backend runs nothing)\n".encode())], 127


def _number(args: Sequence[str], default: int) -> int:
    try:
        return int(float(args[0])) if args else default
    except ValueError:
        return 2


def _seconds(args: Sequence[str]) -> float | None:
    try:
        seconds = float(args[0]) if len(args) == 1 else math.nan  # "infinity": until killed
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _expand(word: str, env: Mapping[str, str]) -> str:
    return _VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), ""), word)


# -- the process ----------------------------------------------------------------------------------


class _Timeline(NamedTuple):
    chunks: dict[Stream, list[tuple[float, bytes]]]  # per stream: (seconds from the start, data)
    end: float  # seconds from the start to the exit


def _timeline(steps: Sequence[Step]) -> _Timeline:
    chunks: dict[Stream, list[tuple[float, bytes]]] = {name: [] for name in get_args(Stream)}
    at = 0.0
    for step in steps:
        if isinstance(step, tuple):
            chunks[step[0]].append((at, step[1]))
        else:
            at += step
    return _Timeline(chunks, at)


class FakeProcess(Process):
    """A script played against the clock; ``kills`` records every ``kill_tree``.

    Nothing runs in the background: each reader waits for its next chunk's moment or for the
    kill, whichever comes first, so a cancelled read loses nothing and a kill stops everything.
    """

    def __init__(self, call: Call, script: Script, stdin: Stdin) -> None:
        self.call, self.script = call, script
        self.pid = next(_pids)
        self.child_pid = next(_pids) if script.leaves_running else None
        self.kills: list[Kill] = []
        self.stdin_received = stdin if isinstance(stdin, bytes) else b""
        self.released = False
        self._stdin = None if stdin is None or isinstance(stdin, bytes) else stdin
        self._started = time.monotonic()
        timeline = _timeline(script.steps)
        self._exit_at = self._started + timeline.end
        self._killed_at: float | None = None
        self._killed = anyio.Event()
        self._kill_status = -signal.SIGTERM
        self.stdout = _ScriptedStream(self, [(self._started + at, data) for at, data in timeline.chunks["stdout"]])
        self.stderr = _ScriptedStream(self, [(self._started + at, data) for at, data in timeline.chunks["stderr"]])

    async def wait(self) -> int:
        if await self.reach(self._exit_at):
            return self.script.exit_code
        return self._kill_status

    async def kill_tree(self, grace: float) -> None:
        alive = self.running_pids()
        self.kills.append(Kill(grace, tuple(alive)))
        if not alive:
            return
        if self.script.ignores_term:
            await anyio.sleep(grace)  # TERM changed nothing; KILL comes when the grace is over
            self._kill_status = -signal.SIGKILL
        self._killed_at = time.monotonic()
        self._killed.set()

    def running_pids(self) -> list[int]:
        main = [self.pid] if self._killed_at is None and time.monotonic() < self._exit_at else []
        child = [self.child_pid] if self.child_pid is not None and self._killed_at is None else []
        return main + child

    def oom_killed(self) -> bool:
        return self.script.oom_killed

    def peak_memory(self) -> int | None:
        return self.script.peak_memory

    async def feed_stdin(self) -> None:
        if self._stdin is not None:
            async for chunk in self._stdin:
                self.stdin_received += chunk

    def release(self) -> None:
        self.released = True

    async def reach(self, moment: float) -> bool:
        """Wait until ``moment`` (monotonic seconds); ``False`` if the kill came first."""
        if self._killed_at is None:
            with anyio.move_on_after(moment - time.monotonic()):
                await self._killed.wait()
        return self._killed_at is None or moment < self._killed_at

    async def pipes_closed(self) -> None:
        """Wait until no process of the call holds the output pipes (end of stream)."""
        if self.child_pid is not None:
            await self._killed.wait()
        else:
            await self.reach(self._exit_at)


class _ScriptedStream(ByteReceiveStream):
    """One output stream of a fake process: its chunks, each at its moment, then end of stream."""

    def __init__(self, process: FakeProcess, chunks: Sequence[tuple[float, bytes]]) -> None:
        self._process = process
        self._chunks = [(moment, data) for moment, data in chunks if data]  # (monotonic moment, data)
        self._next = 0
        self._pending = b""
        self._closed = False

    async def receive(self, max_bytes: int = READ_SIZE) -> bytes:
        if self._closed:
            raise anyio.ClosedResourceError
        if not self._pending:
            self._pending = await self._next_chunk()
        data, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return data

    async def _next_chunk(self) -> bytes:
        if self._next < len(self._chunks):
            moment, data = self._chunks[self._next]
            if await self._process.reach(moment):
                self._next += 1
                return data
        await self._process.pipes_closed()
        raise anyio.EndOfStream

    async def aclose(self) -> None:
        self._closed = True


# -- the jail and the backend ------------------------------------------------------------------------


class FakeJail(Jail):
    """A jail that binds nothing; ``processes`` records every command spawned in it, in order."""

    backend = "fake"

    def __init__(self, workspace: Path, profile: Profile, choose: Handler, scratch: Path | None = None) -> None:
        self.workspace, self.profile, self.scratch = workspace, profile, scratch
        self.processes: list[FakeProcess] = []
        self._choose = choose

    async def _start(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None, stdin: Stdin, runner: bool = False
    ) -> FakeProcess:
        del runner  # the fake tells a runner by its argv (Call.is_file_tool), as scripts are written
        call = Call(tuple(argv), dict(env or {}), cwd, stdin if isinstance(stdin, bytes) else None)
        process = FakeProcess(call, self._choose(call), stdin)
        self.processes.append(process)
        return process

    async def _shutdown(self) -> None:
        for process in self.processes:
            if process.running_pids():
                await process.kill_tree(self.profile.timeouts.kill_grace_s)


class FakeBackend(Backend):
    """Answers each call by ``scripts[call.command]``, else ``handler(call)``, else :func:`default_script`."""

    name = "fake"

    def __init__(self, handler: Handler | None = None, *, scripts: Mapping[str, Script] | None = None) -> None:
        self.handler = handler
        self.scripts: dict[str, Script] = dict(scripts or {})
        self.jails: list[FakeJail] = []

    def _probe(self) -> Report:
        return probe()

    async def _open(
        self,
        workspace: Path,
        profile: Profile,
        *,
        scratch: Path | None,
        egress: Egress | None,  # noqa: ARG002 - the toy shell has no network to filter
        shared: Sequence[tuple[str, str]] = (),  # noqa: ARG002 - the toy shell runs no plugin
        downloads: Path | None = None,  # noqa: ARG002 - refused by open_jail (binds_downloads)
        seed: Snapshot | None = None,  # noqa: ARG002 - refused by open_jail (check_snapshots)
    ) -> FakeJail:
        jail = FakeJail(workspace, profile, self.script_for, scratch)
        self.jails.append(jail)
        return jail

    def script_for(self, call: Call) -> Script:
        if call.command in self.scripts:
            return self.scripts[call.command]
        return (self.handler or default_script)(call)

    @contextlib.contextmanager
    def scripted(
        self, handler: Handler | None = None, *, scripts: Mapping[str, Script] | None = None
    ) -> Iterator[FakeBackend]:
        """Script this instance for one block: for the one ``base.get("fake")`` hands to sessions."""
        saved = self.handler, self.scripts
        self.handler, self.scripts = handler, dict(scripts or {})
        try:
            yield self
        finally:
            self.handler, self.scripts = saved


def probe() -> Report:
    """Every guarantee granted, so any profile opens; the report says that none is enforced."""
    report = Report("fake", True)
    for name in get_args(Guarantee):
        report.grant(name, True)
    report.details["warning"] = NOTHING_ENFORCED
    report.details["enforces"] = "nothing"
    report.advice.append("for tests only: use bwrap or docker to run anything for real")
    return report


backend_class = FakeBackend
