"""Standard-library-only code shipped into jails.

The modules here run on the far side of the boundary, under the jail's own ``python3 -I -S``:
no site-packages, no ``sandbox`` installed, perhaps another Python than the host's (a Docker
image brings its own). Each is sent as the text of a ``python3 -c`` program, so they import
nothing but the standard library and one another (``tests/unit/test_layers.py`` holds them to
it), and nothing outside this package imports them except to ship them or to test them.

- :mod:`~sandbox._jailside.glob` -- the one glob dialect. The policy reads its rules with it on
  the host; the runner reads Glob patterns and Grep's ``include`` with it in the jail.
- :mod:`~sandbox._jailside.runner` -- the file tools' half in the jail: Read, Write, Edit, Glob,
  Grep, LS and rollback's restore, one JSON request per run.
- :mod:`~sandbox._jailside.agent` -- the warm Docker jail's PID 1, which the host drives over a
  unix socket; with it go its :mod:`~sandbox._jailside.channel` to the host, the
  :mod:`~sandbox._jailside.forked` children it starts calls in, its
  :mod:`~sandbox._jailside.census` of the jail after a call and its
  :mod:`~sandbox._jailside.hardening` at start.
- :mod:`~sandbox._jailside.netfwd` -- an allowlist jail's forwarder: the jail's loopback port
  relayed to the host-side filtering proxy's unix socket (:mod:`sandbox.network.egress`).

:func:`program` builds the ``-c`` text: the modules a program imports, then the program.
Compiling that text cost a jail agent's start about 10 of its 46 ms here (once per session): where
the host can, it hands the jail its bytecode instead (:func:`compiled`, in a file named by a
``code:FD`` first argument), which the program runs when the jail's Python reads the same
bytecode (its magic number) and ignores for the text otherwise.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import CodeType

_HERE = Path(__file__).parent
CODE_ARG = "code:"  # the first argument naming the descriptor of the program's bytecode


def source(module: str) -> str:
    """The text of one module of this package, ``module`` named without the package."""
    return (_HERE / f"{module}.py").read_text(encoding="utf-8")


def program(main: str, *imports: str) -> str:
    """A ``python3 -c`` program that runs module ``main`` as ``__main__`` in the jail.

    Each of ``imports`` is first defined in ``sys.modules`` under its full name, so ``main``
    imports it as it does on the host (``from sandbox._jailside.glob import ...``) although no
    ``sandbox`` package exists in the jail. Tracebacks name the files as in this package.

    A first argument ``code:FD`` (:data:`CODE_ARG`) names a readable descriptor holding
    :func:`compiled` of the same modules: the program closes it and, when the jail's Python
    reads that bytecode, runs it rather than compiling the text; either way the argument is gone
    from ``sys.argv`` before ``main`` runs.
    """
    modules = [(f"{__name__}.{name}", f"sandbox/_jailside/{name}.py", source(name)) for name in imports]
    return "\n".join(
        (
            "import sys, types",
            "code = None",
            f"if sys.argv[1:2] and sys.argv[1].startswith({CODE_ARG!r}):",
            f"    with open(int(sys.argv.pop(1)[{len(CODE_ARG)}:]), 'rb') as given:",
            "        code = given.read()",
            "    if code[:4] != getattr(sys.modules.get('_frozen_importlib_external'), 'MAGIC_NUMBER', None):",
            "        code = None",
            "if code is not None:",
            "    import marshal",
            "    compiled, main = marshal.loads(code[4:])",
            "    code = None",
            "    for name, module_code in compiled:",
            "        module = sys.modules[name] = types.ModuleType(name)",
            "        exec(module_code, module.__dict__)",
            "    exec(main, {'__name__': '__main__'})",
            "else:",
            f"    for name, path, text in {modules!r}:",
            "        module = sys.modules[name] = types.ModuleType(name)",
            "        exec(compile(text, path, 'exec'), module.__dict__)",
            f"    exec(compile({source(main)!r}, 'sandbox/_jailside/{main}.py', 'exec'), {{'__name__': '__main__'}})",
        )
    )


@cache
def compiled(main: str, *imports: str) -> bytes:
    """:func:`program`'s modules compiled by this Python: its bytecode's magic number, then the
    marshalled ``([(module name, code), ...], main's code)``. Code, not data: hand it only to a
    program of the same modules (:func:`code_fd`)."""
    modules = [(f"{__name__}.{name}", _compile(name)) for name in imports]
    return importlib.util.MAGIC_NUMBER + marshal.dumps((modules, _compile(main)))


def _compile(name: str) -> CodeType:
    # Not this module's ``from __future__`` flags: the jail compiles the text without them.
    return compile(source(name), f"sandbox/_jailside/{name}.py", "exec", dont_inherit=True)


def code_fd(main: str, *imports: str) -> int:
    """A new anonymous file holding :func:`compiled`, read from its start: the descriptor for a
    ``code:FD`` argument (the caller closes it once the program started). One per program
    started, so no jail ever reads a file another jail could have written."""
    data = memoryview(compiled(main, *imports))
    fd = os.memfd_create("sandbox-program", os.MFD_CLOEXEC)
    try:
        while data:
            data = data[os.write(fd, data) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
