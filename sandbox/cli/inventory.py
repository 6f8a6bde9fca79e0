"""``sandbox check``, ``sandbox profiles`` and ``sandbox gc``: what this host offers, and what
crashed executors left on it. A refusal is one line on stderr and exit 2."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox.cli import options
from sandbox.cli.output import EXIT_ERROR, emit, guard, say
from sandbox.errors import SandboxError
from sandbox.vocabulary import BACKENDS

if TYPE_CHECKING:
    import argparse

    from sandbox.cli.options import Subparsers


def register(sub: Subparsers) -> None:
    check = sub.add_parser("check", help="what each backend can guarantee on this host")
    options.add_backend(check, checked=True)
    check.add_argument(
        "--profile",
        help="what each backend can guarantee for this profile (a shipped name or a TOML file), whose settings "
        "may change it, as [docker] runtime = 'runsc' (gVisor) does (default: the backends' own defaults)",
    )
    options.add_json(check)
    check.set_defaults(func=guard(cmd_check, EXIT_ERROR))
    prof = sub.add_parser("profiles", help="list the shipped profiles and what they guarantee")
    options.add_json(prof)
    prof.set_defaults(func=guard(cmd_profiles, EXIT_ERROR))
    gc = sub.add_parser(
        "gc", help="remove what crashed executors left: cgroups, private copies, scratch dirs, containers"
    )
    gc.add_argument(
        "--all",
        action="store_true",
        help="also containers of live executors, and call cgroups of the old unowned naming",
    )
    gc.set_defaults(func=guard(cmd_gc, EXIT_ERROR))


def cmd_check(args: argparse.Namespace) -> int:
    from sandbox.backends import base

    prof = None
    if args.profile is not None:
        from sandbox import profile as profiles

        prof = profiles.load(args.profile)
    reports = [base.report_of(name, prof) for name in ([args.backend] if args.backend else BACKENDS)]
    if args.json:
        emit({"backends": [r.to_dict() for r in reports]})
        return 0
    for rep in reports:
        print(rep.to_text())
    return 0


def _profile_row(name: str) -> dict[str, Any]:
    from sandbox import profile as profiles

    prof = profiles.load(name)
    return {
        "name": name,
        "description": prof.description,
        "backend": prof.backend,
        "mount": prof.mount.strategy,
        "network": prof.network.mode,
        "requires": list(prof.requires),
        "limits": prof.limits.in_force(),
        "timeouts": {"default_s": prof.timeouts.default_s, "max_s": prof.timeouts.max_s},
    }


def cmd_profiles(args: argparse.Namespace) -> int:
    from sandbox import profile as profiles

    rows = [_profile_row(name) for name in profiles.available()]
    if args.json:
        emit({"profiles": rows})
        return 0
    for row in rows:
        print(f"{row['name']}: {row['description']}")
        print(
            f"  mount={row['mount']} network={row['network']} backend={row['backend']} "
            f"timeout={row['timeouts']['default_s']:g}s (max {row['timeouts']['max_s']:g}s)"
        )
        print(f"  guarantees: {', '.join(row['requires'])}")
    return 0


def _docker_gc(everything: bool) -> list[str]:
    """The containers removed; none when there is no Docker here (the local sweep still stands)."""
    from sandbox.backends import base

    try:
        base.get("docker")  # BackendUnavailable when the docker extra is not installed
        from sandbox.backends import docker as docker_backend

        return docker_backend.gc(all=everything)
    except SandboxError as exc:
        say(f"docker: {exc.message}")
        return []


def cmd_gc(args: argparse.Namespace) -> int:
    """What crashed executors left: containers, then call cgroups, private copies (their work kept
    as changesets first), scratch dirs."""
    from sandbox import leftovers

    removed = _docker_gc(args.all)  # first: a dead executor's container stops writing its copy
    for name in removed:
        print(name)
    swept = leftovers.sweep(legacy_cgroups=args.all)
    for path in (*swept.cgroups, *swept.copies, *swept.scratch, *swept.reviews):
        print(path)
    for line in swept.recovered:
        say(f"recovered the work of a killed executor as {line}: sandbox changes show {line.split()[0]}")
    for line in swept.kept:
        say(f"kept {line}")
    say(
        f"removed {len(swept.cgroups)} cgroup(s), {len(swept.copies)} private copies, "
        f"{len(swept.scratch)} scratch dir(s), {len(swept.reviews)} review dir(s), {len(removed)} container(s)"
    )
    return 1 if swept.kept else 0
