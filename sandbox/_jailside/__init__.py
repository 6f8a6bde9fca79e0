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
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).parent


def source(module: str) -> str:
    """The text of one module of this package, ``module`` named without the package."""
    return (_HERE / f"{module}.py").read_text(encoding="utf-8")


def program(main: str, *imports: str) -> str:
    """A ``python3 -c`` program that runs module ``main`` as ``__main__`` in the jail.

    Each of ``imports`` is first defined in ``sys.modules`` under its full name, so ``main``
    imports it as it does on the host (``from sandbox._jailside.glob import ...``) although no
    ``sandbox`` package exists in the jail. Tracebacks name the files as in this package.
    """
    modules = [(f"{__name__}.{name}", f"sandbox/_jailside/{name}.py", source(name)) for name in imports]
    return "\n".join(
        (
            "import sys, types",
            f"for name, path, text in {modules!r}:",
            "    module = sys.modules[name] = types.ModuleType(name)",
            "    exec(compile(text, path, 'exec'), module.__dict__)",
            f"exec(compile({source(main)!r}, 'sandbox/_jailside/{main}.py', 'exec'), {{'__name__': '__main__'}})",
        )
    )
