"""The ``sandbox`` command.

``sandbox run`` is a contract scripts and CI depend on: the command's own exit status, 128+N
for signal N, 124 on timeout, 125 when the sandbox could not start or refused (one line on
stderr), 127 when the command is not found in the jail and 126 when it cannot be executed there
(one line naming it), 141 when our stdout was closed (as SIGPIPE ends a Unix tool); with
``--json`` exactly one JSON object on stdout at the end, naming the network mode and every limit
in force. Our stdin is the command's (streamed; a terminal is not forwarded). A flag never
overrides a guarantee the profile requires: ``--network host`` under a profile that requires
``net-none`` is refused with 125, and a bad value is blamed on the flag that gave it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import typing
from pathlib import Path
from typing import Any

from sandbox import __version__, calls, cli_compare, cli_image, cli_policy, cli_tools
from sandbox.backends import BACKENDS
from sandbox.errors import InvalidArgument, SandboxError, find_error

if typing.TYPE_CHECKING:
    import anyio

    from sandbox import exec as executor
    from sandbox import launch
    from sandbox import profile as profiles

# Start-up is a product figure (`sandbox --version`, every `sandbox run`): this module and the
# subcommand modules import only the standard library at the top; each command imports what it
# uses (pydantic, anyio, the backends, the policy layer) when it runs.

Subparsers: typing.TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
EXIT_TIMEOUT = 124
EXIT_SANDBOX = 125
EXIT_SIGPIPE = 128 + signal.SIGPIPE


def _say(line: str) -> None:
    with contextlib.suppress(OSError):  # nobody reads our stderr any more: nothing to tell
        print(f"sandbox: {line}", file=sys.stderr, flush=True)


def _add_run(sub: Subparsers) -> None:
    run = sub.add_parser("run", help="run a command in a jail", description="Run ARGV in a jail.")
    run.add_argument("--profile", help="a shipped profile name or a TOML file (default: default)")
    run.add_argument("--backend", help="auto, bwrap, docker or host (default: the profile's, auto)")
    run.add_argument("--workspace", type=Path, default=None, help="default: the current directory")
    run.add_argument("--mount", help="ro, rw, copy or overlay (default: the profile's)")
    run.add_argument(
        "--timeout",
        type=float,
        help="seconds, from 1 to the profile's timeouts.max_s (default: its timeouts.default_s)",
    )
    run.add_argument("--memory", help="memory limit, binary units as Docker reads them: 512m, 2g = 2GiB")
    run.add_argument("--pids", type=int, help="process limit (at least 8)")
    run.add_argument("--network", help="none or host (default: the profile's, none)")
    run.add_argument("--json", action="store_true", help="one JSON object on stdout at the end")
    run.add_argument("--apply", action="store_true", help="copy mount: apply the changeset to the workspace")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- the command and its arguments")
    run.set_defaults(func=cmd_run)


# Which flag sets which profile key: errors in a flag's value name the flag, not the file.
_FLAGS = {
    "mount.strategy": "--mount",
    "limits.memory": "--memory",
    "limits.pids": "--pids",
    "network.mode": "--network",
    "backend": "--backend",
}


def _load_profile(args: argparse.Namespace) -> profiles.Profile:
    from sandbox import profile as profiles
    from sandbox.backends import base

    if args.backend not in (None, "auto"):
        base.get(args.backend)
    prof = profiles.load(args.profile)
    values = {
        "mount.strategy": args.mount,
        "limits.memory": args.memory,
        "limits.pids": args.pids,
        "network.mode": args.network,
        "backend": args.backend,
    }
    return prof.override(values, _FLAGS)


def cmd_run(args: argparse.Namespace) -> int:
    from sandbox import launch

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    try:
        if not argv:
            raise InvalidArgument("no command given: sandbox run [options] -- ARGV...")
        quick = launch.run(args, argv)
        if quick is not None:
            with contextlib.suppress(OSError):  # a closed stderr: the review has no reader either
                _review(quick, None, None, apply=False)
            return _exit_status(quick, quick.received)
        import anyio

        prof = _load_profile(args)
        args.timeout_s = calls.check_timeout(args.timeout, prof)
        workspace = args.workspace or Path.cwd()
        return anyio.run(_run, args, prof, workspace, argv)
    except (SandboxError, BaseExceptionGroup) as exc:
        error = find_error(exc, SandboxError)
        if error is None:
            raise
        _say(str(error))
        if args.json:
            _emit({"error": error.to_dict(), "exit_code": EXIT_SANDBOX})
        return EXIT_SANDBOX


def _emit(obj: dict[str, Any]) -> bool:
    """Write one JSON line on stdout; ``False`` when nobody reads it any more."""
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # Else the interpreter's final flush of the same buffer prints a traceback-like warning.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return False
    return True


async def _run(args: argparse.Namespace, prof: profiles.Profile, workspace: Path, argv: list[str]) -> int:
    import anyio

    from sandbox import cli_stdio, launch
    from sandbox import exec as executor
    from sandbox.backends import base

    backend = base.choose(prof.backend, prof)
    if backend.name == "bwrap":
        launch.remember(args, prof)  # the next run of this profile here may take the quick path
    abort = anyio.Event()
    received: list[int] = []

    def reader_gone() -> None:
        received.append(signal.SIGPIPE)
        abort.set()

    out, err = cli_stdio.Sink(1, reader_gone), cli_stdio.Sink(2, reader_gone)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_signals, abort, received)
            async with await backend.open_jail(workspace, prof) as jail:
                result = await executor.run(
                    jail,
                    calls.checked_argv(jail, argv),
                    timeout=args.timeout,
                    abort=abort,
                    stdin=cli_stdio.stdin_source(),
                    on_stdout=None if args.json else out.write,
                    on_stderr=None if args.json else err.write,
                )
                changes = await jail.changes()
                applied = await jail.apply(changes) if changes is not None and args.apply else None
            tg.cancel_scope.cancel()
    finally:
        out.close()
        err.close()
    return _report(args, prof, result, changes, applied, received, backend.probe().limits_in_force(prof))


async def _watch_signals(abort: anyio.Event, received: list[int]) -> None:
    import anyio

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            received.append(signum)
            abort.set()


def _exit_status(result: executor.ExecResult | launch.Outcome, received: list[int]) -> int:
    if signal.SIGPIPE in received:
        return EXIT_SIGPIPE  # as a Unix tool ends when its reader has gone: quietly
    if result.timed_out:
        return EXIT_TIMEOUT
    if result.aborted and received:
        return 128 + received[0]
    return result.exit_code


def _report(
    args: argparse.Namespace,
    prof: profiles.Profile,
    result: executor.ExecResult,
    changes: Any,
    applied: Any,
    received: list[int],
    enforced: dict[str, Any],
) -> int:
    code = _exit_status(result, received)
    if args.json:
        emitted = _emit(
            {
                **result.model_dump(exclude={"spawn_ms", "kill_ms", "oom_killed", "peak_memory_bytes"}),
                "profile": prof.name,
                "network": prof.network.mode,
                "limits": prof.limits.in_force(),
                "limits_enforced": enforced,  # how this host enforces each (cgroup per call, rlimit per process)
                "timeout_s": args.timeout_s,
                "changes": changes.to_list() if changes is not None else None,
                "applied": applied.to_dict() if applied is not None else None,
                "exit_status": code,
            }
        )
        return code if emitted else EXIT_SIGPIPE
    with contextlib.suppress(OSError):  # a closed stderr: the review has no reader either
        _review(result, changes, applied, args.apply)
    return code


def _review(result: executor.ExecResult | launch.Outcome, changes: Any, applied: Any, apply: bool) -> None:
    if result.timed_out:
        _say(f"timed out; every process of the call was killed ({result.kill_ms} ms after the deadline)")
    if result.oom_killed:
        _say("the memory limit killed a process of the call")
    if changes is None:
        return
    if not changes.changes:
        _say("no changes in the private copy")
        return
    state = "applied" if apply else "not applied; rerun with --apply to apply"
    _say(f"changes in the private copy ({state}):")
    for change in changes.changes:
        flags = f"  [{', '.join(change.flags)}]" if change.flags else ""
        skip = f"  (never applied: {change.reason})" if not change.applicable else ""
        print(f"  {change.status[0].upper()} {change.path}{flags}{skip}", file=sys.stderr)
    if applied is not None:
        for conflict in applied.conflicts:
            _say(f"CONFLICT {conflict['path']}: {conflict['reason']}")


def cmd_check(args: argparse.Namespace) -> int:
    from sandbox.backends import base
    from sandbox.guarantees import Report

    reports: list[Report] = []
    for name in [args.backend] if args.backend else BACKENDS:
        try:
            reports.append(base.get(name).probe())
        except SandboxError as exc:
            reports.append(Report(name, False, exc.message))
    if args.json:
        _emit({"backends": [r.to_dict() for r in reports]})
        return 0
    for rep in reports:
        print(rep.to_text())
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from sandbox import profile as profiles

    rows: list[dict[str, Any]] = []
    for name in profiles.available():
        prof = profiles.load(name)
        rows.append(
            {
                "name": name,
                "description": prof.description,
                "backend": prof.backend,
                "mount": prof.mount.strategy,
                "network": prof.network.mode,
                "requires": list(prof.requires),
                "limits": prof.limits.in_force(),
                "timeouts": {"default_s": prof.timeouts.default_s, "max_s": prof.timeouts.max_s},
            }
        )
    if args.json:
        _emit({"profiles": rows})
        return 0
    for row in rows:
        print(f"{row['name']}: {row['description']}")
        print(
            f"  mount={row['mount']} network={row['network']} backend={row['backend']} "
            f"timeout={row['timeouts']['default_s']:g}s (max {row['timeouts']['max_s']:g}s)"
        )
        print(f"  guarantees: {', '.join(row['requires'])}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    """What crashed executors left: call cgroups, private copies, scratch dirs, then containers."""
    from sandbox import leftovers
    from sandbox.backends import base

    swept = leftovers.sweep(legacy_cgroups=args.all)
    for path in (*swept.cgroups, *swept.copies, *swept.scratch):
        print(path)
    for line in swept.kept:
        _say(f"kept {line}")
    removed: list[str] = []
    try:
        base.get("docker")  # BackendUnavailable when the docker extra is not installed
        from sandbox.backends import docker as docker_backend

        removed = docker_backend.gc(all=args.all)
    except SandboxError as exc:  # no Docker here: the local sweep still stands
        _say(f"docker: {exc.message}")
    for name in removed:
        print(name)
    _say(
        f"removed {len(swept.cgroups)} cgroup(s), {len(swept.copies)} private copies, "
        f"{len(swept.scratch)} scratch dir(s), {len(removed)} container(s)"
    )
    return 1 if swept.kept else 0


class _Parser(argparse.ArgumentParser):
    """Bad usage is a structured INVALID_ARGUMENT, so ``sandbox run`` can answer it with 125."""

    def error(self, message: str) -> typing.NoReturn:
        raise InvalidArgument(f"{self.prog}: {message}")

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse asks shutil for the terminal's width at every add_argument: shutil (with the
        # compressors it imports) would be a tenth of a short run's imports.
        return self.formatter_class(prog=self.prog, width=_columns() - 2)  # type: ignore[call-arg]


def _columns() -> int:
    """``shutil.get_terminal_size().columns``: $COLUMNS, else our stdout's terminal, else 80."""
    with contextlib.suppress(KeyError, ValueError):
        if (columns := int(os.environ["COLUMNS"])) > 0:
            return columns
    with contextlib.suppress(AttributeError, ValueError, OSError):
        return os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    return 80


def build_parser(only_run: bool = False) -> argparse.ArgumentParser:
    """The whole parser; ``only_run``: just ``sandbox run``'s, which parses its arguments the same
    (building every subcommand's parser is a tenth of a short run)."""
    parser = _Parser(prog="sandbox", description="Run agent tools under an OS-level boundary.")
    parser.add_argument("--version", action="version", version=f"sandbox {__version__}")
    sub = typing.cast("Subparsers", parser.add_subparsers(dest="command", required=True))
    _add_run(sub)
    if only_run:
        return parser
    check = sub.add_parser("check", help="what each backend can guarantee on this host")
    check.add_argument("--backend", choices=BACKENDS)
    check.add_argument("--json", action="store_true")
    check.set_defaults(func=cmd_check)
    prof = sub.add_parser("profiles", help="list the shipped profiles and what they guarantee")
    prof.add_argument("--json", action="store_true")
    prof.set_defaults(func=cmd_profiles)
    gc = sub.add_parser(
        "gc", help="remove what crashed executors left: cgroups, private copies, scratch dirs, containers"
    )
    gc.add_argument(
        "--all",
        action="store_true",
        help="also containers of live executors, and call cgroups of the old unowned naming",
    )
    gc.set_defaults(func=cmd_gc)
    for module in (cli_policy, cli_tools, cli_compare, cli_image):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    parser = build_parser(only_run=raw[:1] == ["run"])
    try:
        args = parser.parse_args(raw)
    except InvalidArgument as exc:
        _say(exc.message)
        if raw[:2] == ["policy", "test"] and "--json" in raw[: raw.index("--") if "--" in raw else None]:
            from sandbox.cli_policy import print_refusal

            print_refusal(None, exc)
        return EXIT_SANDBOX if raw[:1] in (["run"], ["compare"]) else 2
    try:
        code: int = args.func(args)
    except SandboxError as exc:
        _say(str(exc))
        return EXIT_SANDBOX if args.command == "run" else 2
    return code


def entry() -> typing.NoReturn:
    """The console script: ``main``, then exit without the interpreter's teardown.

    Finalising a few hundred modules costs more than a short ``sandbox run`` itself; by the
    time ``main`` returns every jail is closed, every file we wrote is closed or committed, and
    only our own output buffers remain to flush. ``serve`` exits the ordinary way.
    """
    code = main()
    if sys.argv[1:2] == ["serve"]:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
