"""The ``-c`` program shipped into jails and the bytecode handed beside it (:mod:`sandbox._jailside`).

A jail agent's start compiled about 70 KB of source each time; :func:`~sandbox._jailside.code_fd`
hands it this Python's bytecode instead. Run here with the interpreter a bwrap jail runs
(``/usr/bin/python3``, the system's): the bytecode is taken when its magic number is the
interpreter's, the text otherwise, and the ``code:FD`` argument never reaches the program.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import subprocess
import sys

import pytest

from sandbox import _jailside
from sandbox.backends.agentlink import AGENT_MODULES, AGENT_PROGRAM

PROGRAM = _jailside.program("runner", "glob")


def _python() -> str:
    """The jail's interpreter when it reads this Python's bytecode, else this one (same magic)."""
    system = "/usr/bin/python3"
    if os.path.exists(system):
        said = subprocess.run(
            [system, "-I", "-S", "-c", "import sys; print(sys.implementation.cache_tag)"],
            capture_output=True,
            text=True,
            check=False,
        )
        if said.stdout.strip() == sys.implementation.cache_tag:
            return system
    return sys.executable


def _blob(source: str, magic: bytes = importlib.util.MAGIC_NUMBER) -> int:
    """``source`` compiled into a new memfd (``{fd}`` in it: that memfd's number)."""
    fd = os.memfd_create("test-program", os.MFD_CLOEXEC)
    code = compile(source.replace("{fd}", str(fd)), "main", "exec", dont_inherit=True)
    os.write(fd, magic + marshal.dumps(([], code)))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _run(program: str, fd: int, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            [_python(), "-I", "-S", "-c", program, f"{_jailside.CODE_ARG}{fd}", *args],
            pass_fds=(fd,),
            input=stdin,
            capture_output=True,
            timeout=30,
            check=False,
        )
    finally:
        os.close(fd)


def test_the_bytecode_runs_instead_of_the_text_and_its_argument_is_gone() -> None:
    """...and so is its descriptor: nothing the program starts later inherits it."""
    done = _run(
        PROGRAM,
        _blob("import os, sys; print('bytecode', sys.argv[1:], os.path.exists('/proc/self/fd/{fd}'))"),
        "a",
        "b",
    )
    assert done.stdout.decode().strip() == "bytecode ['a', 'b'] False", done.stderr


def test_another_pythons_bytecode_is_ignored_for_the_text() -> None:
    """The runner's own text runs (compiled from it: its traceback names its file), not our print."""
    done = _run(PROGRAM, _blob("print('bytecode')", magic=b"\0\0\r\n"), stdin=b"not json")
    assert b"bytecode" not in done.stdout
    assert b'File "sandbox/_jailside/runner.py"' in done.stderr, done.stderr


def test_the_agents_bytecode_is_the_agents_program() -> None:
    """``compiled`` of the agent's modules starts the same agent as its text: with no channel it
    stops at the same place, having defined every module it imports."""
    fd = _jailside.code_fd(*AGENT_MODULES)
    compiled = _run(AGENT_PROGRAM, fd, "", "fd:999")
    text = subprocess.run(
        [_python(), "-I", "-S", "-c", AGENT_PROGRAM, "", "fd:999"], capture_output=True, timeout=30, check=False
    )
    assert compiled.returncode == text.returncode != 0
    assert compiled.stderr.splitlines()[-1] == text.stderr.splitlines()[-1]
    assert b"Bad file descriptor" in compiled.stderr


@pytest.mark.parametrize("main", ["runner", "netfwd"])
def test_each_descriptor_is_a_new_file(main: str) -> None:
    """One file per start: no jail reads a file another jail had (and could have written)."""
    first, second = _jailside.code_fd(main), _jailside.code_fd(main)
    try:
        assert os.fstat(first).st_ino != os.fstat(second).st_ino
        assert os.read(first, 4) == importlib.util.MAGIC_NUMBER
    finally:
        os.close(first)
        os.close(second)
