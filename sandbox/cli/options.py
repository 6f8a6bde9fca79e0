"""The options several subcommands share, spelled once, their values named by the vocabulary.

A choice argparse checks is derived from :mod:`sandbox.vocabulary` (``--backend`` offers
``auto`` and the real backends, never ``fake``). Where a command's contract blames a bad value
on the flag in its own words and answers ``--json`` even then (``run``, ``tool``, ``compare``),
the value is checked by the profile layer instead, and the help names the same vocabulary.

Standard library only: building the parser must not import pydantic or anyio.
"""

from __future__ import annotations

import argparse
import typing
from pathlib import Path

from sandbox.errors import InvalidArgument
from sandbox.vocabulary import BACKENDS, MOUNT_STRATEGIES, OPERATING_MODES, PERMISSION_MODES, NetworkMode

Subparsers: typing.TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
BACKEND_CHOICES = ("auto", *BACKENDS)
NETWORK_MODES: tuple[NetworkMode, ...] = typing.get_args(NetworkMode)


def _either(names: typing.Iterable[str]) -> str:
    *head, last = names
    return f"{', '.join(head)} or {last}"


def add_profile(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    parser.add_argument("--profile", default=default, help="a shipped profile name or a TOML file (default: default)")


def add_backend(parser: argparse.ArgumentParser, *, checked: bool = False, default: str | None = None) -> None:
    """``--backend``; ``checked``: argparse refuses a name that is not a real backend."""
    if checked:
        parser.add_argument("--backend", choices=BACKENDS)
        return
    parser.add_argument("--backend", default=default, help=f"{_either(BACKEND_CHOICES)} (default: the profile's, auto)")


def check_backend(name: str | None) -> None:
    """Refuse a ``--backend`` that names no real backend (``fake`` included: the command line
    offers only what enforces something), with the loader's own message."""
    from sandbox.backends import base

    if name not in (None, "auto"):
        base.get(name, offered=True)


def add_image(parser: argparse.ArgumentParser) -> None:
    """``--image``: the Docker image the jail runs (its programs are the image's)."""
    parser.add_argument(
        "--image",
        metavar="IMAGE",
        help="the Docker image to run the jail in (implies --backend docker), e.g. sandbox-runtime:node for "
        "Node.js and npm (default: the profile's [docker] image, else sandbox-runtime:<version>)",
    )


def image_backend(args: argparse.Namespace) -> str | None:
    """The backend with ``--image`` applied: it implies ``docker``; another named backend is refused."""
    if args.image is None:
        return typing.cast("str | None", args.backend)
    if args.backend not in (None, "auto", "docker"):
        raise InvalidArgument(
            f"--image names a Docker image, and the {args.backend} backend runs none (it runs this host's "
            "programs): use --backend docker, or leave --backend out",
            flag="--image",
        )
    return "docker"


def add_mount(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mount", help=f"{_either(MOUNT_STRATEGIES)} (default: the profile's)")


def add_network(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--network", help=f"{_either(NETWORK_MODES)} (default: the profile's, none)")
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="PATTERN",
        help="let the jail reach this destination through the filtering proxy (repeatable; implies "
        "--network allowlist): host, *.host (subdomains only), host:port, an IP or a CIDR; "
        "no port means 80 and 443",
    )
    parser.add_argument(
        "--allow-index",
        action="append",
        default=[],
        metavar="SPEC",
        help="let the jail reach a package index (repeatable; implies --network allowlist): pypi, npm, crates "
        "or go for the public one's hosts, or NAME=URL for a mirror (its host:port alone is allowed, and "
        "the installers are pointed at it: PIP_INDEX_URL, npm_config_registry, GOPROXY)",
    )


def network_flag(args: argparse.Namespace) -> str | None:
    """The flag that asked for the allowlist (``None``: neither ``--allow-index`` nor ``--allow-host``)."""
    if args.allow_index:
        return "--allow-index"
    return "--allow-host" if args.allow_host else None


def network_mode(args: argparse.Namespace) -> str | None:
    """``--network``, or ``allowlist`` when only ``--allow-host``/``--allow-index`` was given; they must agree."""
    flag = network_flag(args)
    if flag is not None and args.network not in (None, "allowlist"):
        raise InvalidArgument(f"{flag} needs --network allowlist, not --network {args.network}", flag=flag)
    return "allowlist" if flag is not None else args.network


def add_workspace(parser: argparse.ArgumentParser, default: Path | None = None) -> None:
    parser.add_argument(
        "--workspace",
        type=Path,
        default=default,
        help="default: the current directory" if default is None else None,
    )


def add_mode(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=PERMISSION_MODES, default=None, help="the permission mode")


def add_operating_mode(parser: argparse.ArgumentParser, help: str) -> None:
    """``--operating-mode agent|plan|goal`` (seed 003 §10), with ``--plan`` and ``--goal`` as shorthands."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--operating-mode", choices=OPERATING_MODES, default=None, help=help)
    for contract in ("plan", "goal"):
        group.add_argument(
            f"--{contract}",
            dest="operating_mode",
            action="store_const",
            const=contract,
            help=f"--operating-mode {contract}",
        )


def add_json(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    parser.add_argument("--json", action="store_true", help=help)


def add_argv(
    parser: argparse.ArgumentParser, dest: str = "argv", help: str = "-- the command and its arguments"
) -> None:
    parser.add_argument(dest, nargs=argparse.REMAINDER, help=help)


def command(argv: list[str]) -> list[str]:
    """The words after ``--`` (argparse keeps the ``--`` in front of a REMAINDER)."""
    return argv[1:] if argv[:1] == ["--"] else argv
