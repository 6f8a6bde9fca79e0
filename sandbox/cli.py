"""The ``sandbox`` command.

``sandbox run`` is a contract scripts and CI depend on: the command's own exit status, 128+N
for signal N, 124 on timeout, 125 when the sandbox could not start or refused (one line on
stderr); with ``--json`` exactly one JSON object on stdout at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import typing
from pathlib import Path
from typing import Any

import anyio

from sandbox import __version__
from sandbox import exec as executor
from sandbox import profile as profiles
from sandbox.backends import base
from sandbox.errors import InvalidArgument, SandboxError, find_error

Subparsers: typing.TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
EXIT_TIMEOUT = 124
EXIT_SANDBOX = 125


def _say(line: str) -> None:
    print(f"sandbox: {line}", file=sys.stderr, flush=True)


def _add_run(sub: Subparsers) -> None:
    run = sub.add_parser("run", help="run a command in a jail", description="Run ARGV in a jail.")
    run.add_argument("--profile", help="a shipped profile name or a TOML file (default: default)")
    run.add_argument("--backend", help="auto, bwrap, docker or host (default: the profile's, auto)")
    run.add_argument("--workspace", type=Path, default=None, help="default: the current directory")
    run.add_argument("--mount", help="ro, rw, copy or overlay (default: the profile's)")
    run.add_argument("--timeout", type=float, help="seconds, 1 to 300 (default: the profile's, 60)")
    run.add_argument("--memory", help="memory limit, e.g. 512MiB")
    run.add_argument("--pids", type=int, help="process limit")
    run.add_argument("--network", help="none or host (default: the profile's, none)")
    run.add_argument("--json", action="store_true", help="one JSON object on stdout at the end")
    run.add_argument("--apply", action="store_true", help="copy mount: apply the changeset to the workspace")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- the command and its arguments")
    run.set_defaults(func=cmd_run)


def _load_profile(args: argparse.Namespace) -> profiles.Profile:
    if args.backend not in (None, "auto"):
        base.get(args.backend)
    prof = profiles.load(args.profile)
    prof = prof.with_overrides(**{
        "mount.strategy": args.mount, "limits.memory": args.memory, "limits.pids": args.pids,
        "network.mode": args.network, "backend": args.backend,
    })
    return prof


def cmd_run(args: argparse.Namespace) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    try:
        if not argv:
            raise InvalidArgument("no command given: sandbox run [options] -- ARGV...")
        prof = _load_profile(args)
        executor.check_timeout(args.timeout, prof)
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


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _writer(fd: int) -> executor.OutputCallback:
    async def write(chunk: bytes) -> None:
        await anyio.to_thread.run_sync(_write_all, fd, chunk)

    return write


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


async def _run(args: argparse.Namespace, prof: profiles.Profile, workspace: Path, argv: list[str]) -> int:
    backend = base.choose(prof.backend, prof)
    abort = anyio.Event()
    received: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch_signals, abort, received)
        async with await backend.open_jail(workspace, prof) as jail:
            result = await executor.run(
                jail, argv, timeout=args.timeout, abort=abort,
                on_stdout=None if args.json else _writer(1), on_stderr=None if args.json else _writer(2),
            )
            changes = await jail.changes()
            applied = await jail.apply(changes) if changes is not None and args.apply else None
        tg.cancel_scope.cancel()
    return _report(args, prof, result, changes, applied, received)


async def _watch_signals(abort: anyio.Event, received: list[int]) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            received.append(signum)
            abort.set()


def _report(args: argparse.Namespace, prof: profiles.Profile, result: executor.ExecResult,
            changes: Any, applied: Any, received: list[int]) -> int:
    if result.timed_out:
        code = EXIT_TIMEOUT
    elif result.aborted and received:
        code = 128 + received[0]
    else:
        code = result.exit_code
    if args.json:
        _emit({
            **result.model_dump(exclude={"spawn_ms", "kill_ms", "oom_killed", "peak_memory_bytes"}),
            "profile": prof.name,
            "changes": changes.to_list() if changes is not None else None,
            "applied": applied.to_dict() if applied is not None else None,
            "exit_status": code,
        })
    else:
        _review(result, changes, applied, args.apply)
    return code


def _review(result: executor.ExecResult, changes: Any, applied: Any, apply: bool) -> None:
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
    names = [args.backend] if args.backend else list(base.BACKENDS)
    reports = []
    for name in names:
        try:
            reports.append(base.get(name).probe().to_dict())
        except SandboxError as exc:
            reports.append({"backend": name, "available": False, "reason": exc.message, "guarantees": {}})
    if args.json:
        _emit({"backends": reports})
        return 0
    for rep in reports:
        state = "available" if rep["available"] else f"unavailable: {rep['reason']}"
        print(f"{rep['backend']}: {state}")
        for name, info in rep["guarantees"].items():
            mark = "yes" if info["ok"] else f"no  ({info.get('why_not', '')})"
            print(f"  {name:18} {mark}")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    rows = []
    for name in profiles.available():
        prof = profiles.load(name)
        rows.append({"name": name, "description": prof.description, "backend": prof.backend,
                     "mount": prof.mount.strategy, "network": prof.network.mode,
                     "requires": list(prof.requires)})
    if args.json:
        _emit({"profiles": rows})
        return 0
    for row in rows:
        print(f"{row['name']}: {row['description']}")
        print(f"  mount={row['mount']} network={row['network']} backend={row['backend']}")
        print(f"  guarantees: {', '.join(row['requires'])}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from sandbox.backends import docker as docker_backend

    removed = docker_backend.gc(all=args.all)
    for name in removed:
        print(name)
    _say(f"removed {len(removed)} container(s)")
    return 0


class _Parser(argparse.ArgumentParser):
    """Bad usage is a structured INVALID_ARGUMENT, so ``sandbox run`` can answer it with 125."""

    def error(self, message: str) -> typing.NoReturn:
        raise InvalidArgument(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sandbox", description="Run agent tools under an OS-level boundary.")
    parser.add_argument("--version", action="version", version=f"sandbox {__version__}")
    sub = typing.cast("Subparsers", parser.add_subparsers(dest="command", required=True))
    _add_run(sub)
    check = sub.add_parser("check", help="what each backend can guarantee on this host")
    check.add_argument("--backend", choices=base.BACKENDS)
    check.add_argument("--json", action="store_true")
    check.set_defaults(func=cmd_check)
    prof = sub.add_parser("profiles", help="list the shipped profiles and what they guarantee")
    prof.add_argument("--json", action="store_true")
    prof.set_defaults(func=cmd_profiles)
    gc = sub.add_parser("gc", help="remove containers left behind by a crashed executor")
    gc.add_argument("--all", action="store_true", help="also containers of live executors")
    gc.set_defaults(func=cmd_gc)
    _register_optional(sub)
    return parser


def _register_optional(sub: Subparsers) -> None:
    """Subcommands of the other layers, registered when their modules are present."""
    import importlib

    for module in ("sandbox.cli_policy", "sandbox.cli_tools", "sandbox.cli_compare"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        mod.register(sub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    raw = sys.argv[1:] if argv is None else argv
    try:
        args = parser.parse_args(raw)
    except InvalidArgument as exc:
        _say(exc.message)
        return EXIT_SANDBOX if raw[:1] in (["run"], ["compare"]) else 2
    try:
        code: int = args.func(args)
    except SandboxError as exc:
        _say(str(exc))
        return EXIT_SANDBOX if args.command == "run" else 2
    return code


if __name__ == "__main__":
    sys.exit(main())
