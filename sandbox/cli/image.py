"""``sandbox image build``: the Docker image the docker backend runs (``--microvm``: what the microvm
backend boots), without a checkout or a Makefile.

The same code as ``make image`` (:mod:`sandbox.image`): progress lines on stdout, the ready tag
last; a problem the operator must fix is one line on stderr and exit 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox.cli.output import guard

if TYPE_CHECKING:
    import argparse

    from sandbox.cli.options import Subparsers
    from sandbox.errors import SandboxError

# sandbox.image's VARIANTS and MODES, spelled here so the parser imports nothing (a test keeps
# them equal).
VARIANTS = ("base", "node")
MODES = ("auto", "online", "offline")
EXIT_BUILD_FAILED = 1


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("image", help="build the Docker image of the docker backend")
    sub = parser.add_subparsers(dest="image_command", required=True)
    build = sub.add_parser(
        "build",
        help="build sandbox-runtime:<version> (or a variant); returns at once when current",
        description="Build the Docker backend's image: online from debian:bookworm-slim when it can be "
        "pulled, else offline from a debootstrap rootfs. As root, installs what it lacks.",
    )
    build.add_argument(
        "--variant",
        choices=VARIANTS,
        default="base",
        help="base, or node (adds Node.js and npm; profiles name it sandbox-runtime:node)",
    )
    build.add_argument("--force", action="store_true", help="rebuild even if the image is current")
    build.add_argument("--mode", choices=MODES, help="the base image's build path (default: auto)")
    build.add_argument("--print-tag", action="store_true", help="print the variant's tag and exit")
    build.add_argument(
        "--microvm",
        action="store_true",
        help="build the microvm backend's kernel, initramfs and root file system instead (from Debian packages)",
    )
    build.set_defaults(func=guard(_build, EXIT_BUILD_FAILED, render=_image_problem))


def _image_problem(error: SandboxError) -> str:
    return f"image: {error.message}"


def _build(args: argparse.Namespace) -> int:
    from sandbox import image

    if args.microvm:
        from sandbox.backends.microvm import assets

        print(assets.ensure().rootfs.parent, flush=True)
        return 0
    if args.print_tag:
        print(image.alias(args.variant) or image.tag(args.variant))
        return 0
    ref = image.build(args.variant, force=args.force, mode=args.mode)
    print(ref, flush=True)
    return 0
