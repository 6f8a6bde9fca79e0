"""Build the Docker images the docker backend runs: ``sandbox image build`` (``make image`` runs it too).

Variants: ``base`` is ``sandbox-runtime:<version>``; ``node`` adds Debian bookworm's ``nodejs``
and ``npm`` and is tagged ``sandbox-runtime:<version>-node`` and ``sandbox-runtime:node`` (the
name a profile gives as ``[docker] image``: it stays valid across releases, and a stale one is
refused by its version label with the command that rebuilds it).

Two paths give the same base image:

* online: ``Dockerfile`` on top of ``debian:bookworm-slim`` (present locally or pullable);
* offline: ``debootstrap`` builds a rootfs with every package already included, the tarball is
  cached, imported as ``sandbox-rootfs:<version>-<key>``, and ``Dockerfile.offline`` adds the
  same tail with ``--network none``.

A variant is one layer on the base image, whichever path built it (``Dockerfile.variant``): apt
installs its packages through the host's network and apt proxy, from the mirror the base image
names (for the offline path, the one debootstrap used); the rootfs is never bootstrapped twice.

An image whose ``sandbox.image.recipe`` label matches the current recipe is left alone, so a
second run returns in well under a second. The recipe files ship inside the package
(``sandbox/images``, a link to ``images/`` in a checkout) and are read with importlib.resources;
each build sends only its Dockerfile as the context. The docker SDK is imported when a build runs.

Set-up: run as root, a build installs what it lacks with apt-get (``debootstrap`` for the offline
path; ``docker.io`` and a running dockerd when no daemon answers); otherwise the error names the
package to install (:mod:`sandbox.imagehost`, the host side of a build).

Environment: ``SANDBOX_IMAGE_MODE`` (auto|online|offline), ``SANDBOX_IMAGE_CACHE`` (the rootfs
cache; default ``images/.cache`` in a checkout, else ``$XDG_CACHE_HOME/sandbox/images``),
``DEBIAN_MIRROR`` (else taken from the host's apt sources), ``DOCKER_HOST`` and friends.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import importlib.resources
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox import __version__
from sandbox.imagehost import (
    BuildError,
    apt_proxy,
    connect,
    current,
    docker_errors,
    ensure_command,
    is_root,
    log,
    present,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    import docker

SUITE = "bookworm"
BASE_IMAGE = "debian:bookworm-slim"
REPOSITORY = "sandbox-runtime"
ROOTFS_REPOSITORY = "sandbox-rootfs"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Keep in sync with the apt-get line of images/Dockerfile.
PACKAGES = (
    "bash",
    "coreutils",
    "findutils",
    "grep",
    "git",
    "python3",
    "python3-pip",  # pip install and curl through an allowlist (network.mode = "allowlist")
    "python3-venv",  # ensurepip: `python3 -m venv .venv` in the jail, as on a Debian host
    "curl",
    "ripgrep",
    "tini",
    "procps",
    "ca-certificates",
)
# What each variant adds on top of the base image (images/Dockerfile.variant installs them).
VARIANTS: dict[str, tuple[str, ...]] = {"base": (), "node": ("nodejs", "npm")}
# The commands a variant's packages add, for the line a missing one gets (sandbox.calls).
COMMANDS: dict[str, tuple[str, ...]] = {"node": ("node", "nodejs", "npm", "npx")}
MODES = ("auto", "online", "offline")
# What Debian's slim images leave out too; the rest of the rootfs is what debootstrap installed.
PRUNE = (
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/log",
    "var/cache/debconf/templates.dat-old",
)
COMMON_TAIL = "# --- common tail"
BUILD_TAIL = 30  # lines of build output a failure shows


# ---------------------------------------------------------------- names


def tag(variant: str = "base") -> str:
    return f"{REPOSITORY}:{__version__}" + ("" if variant == "base" else f"-{variant}")


def alias(variant: str) -> str | None:
    """The version-free tag of a variant, for profiles (``sandbox-runtime:node``)."""
    return None if variant == "base" else f"{REPOSITORY}:{variant}"


def variant_of(ref: str) -> str | None:
    """Which variant an image reference names, ``None`` when it is not one of ours."""
    repository, _, name = ref.rpartition(":")
    if repository != REPOSITORY:
        return None
    for variant in VARIANTS:
        if variant != "base" and (name == variant or name.endswith(f"-{variant}")):
            return variant
    return "base"


def variant_with(command: str) -> str | None:
    """The variant whose packages add ``command`` (``None``: none of ours does)."""
    return next((variant for variant, commands in COMMANDS.items() if command in commands), None)


def missing_command_hint(ref: str, command: str) -> str:
    """What a command the image ``ref`` lacks gets after its 127 line: the image, and the one that has it."""
    variant = variant_with(command)
    floating = alias(variant) if variant is not None else None
    if floating is not None and variant_of(ref) != variant:
        return f" (image {ref}); the image with {command} is {floating}: --image {floating} or [docker] image"
    return f" (image {ref}); for an image that has it: --image IMAGE or [docker] image"


def build_command(ref: str) -> str:
    """What makes ``ref`` exist, for error messages (a foreign image is pulled, ours built)."""
    variant = variant_of(ref)
    if variant is None:
        return f"docker pull {ref}"
    return "sandbox image build" + ("" if variant == "base" else f" --variant {variant}")


# ---------------------------------------------------------------- recipe


def _recipe_file(name: str) -> bytes:
    try:
        return (importlib.resources.files("sandbox") / "images" / name).read_bytes()
    except OSError as exc:
        raise BuildError(
            f"the image recipe sandbox/images/{name} cannot be read ({exc.strerror}): reinstall the package"
        ) from exc


def _tail(name: str) -> bytes:
    text = _recipe_file(name)
    marker = COMMON_TAIL.encode()
    if marker not in text:
        raise BuildError(f"images/{name} lost its '{COMMON_TAIL}' marker")
    return text[text.index(marker) :]


def recipe(variant: str = "base") -> str:
    """A short hash of everything that shapes the image; the image carries it as a label."""
    if _tail("Dockerfile") != _tail("Dockerfile.offline"):
        raise BuildError("the common tails of images/Dockerfile and images/Dockerfile.offline differ")
    digest = hashlib.sha256()
    for part in (
        _recipe_file("Dockerfile"),
        _recipe_file("Dockerfile.offline"),
        " ".join(PACKAGES).encode(),
        SUITE.encode(),
    ):
        digest.update(part)
    if variant != "base":
        digest.update(_recipe_file("Dockerfile.variant") + " ".join(VARIANTS[variant]).encode())
    return digest.hexdigest()[:12]


def rootfs_key() -> str:
    return hashlib.sha256(f"{SUITE} {' '.join(PACKAGES)} {' '.join(PRUNE)}".encode()).hexdigest()[:12]


# ---------------------------------------------------------------- online: the Debian image


def online_base_available(client: docker.DockerClient) -> bool:
    import docker.errors

    if present(client, BASE_IMAGE):
        return True
    log(f"{BASE_IMAGE} is not present locally; trying to pull it")
    try:
        client.images.pull(BASE_IMAGE)
    except docker.errors.DockerException as exc:
        log(f"cannot pull {BASE_IMAGE} ({str(exc).splitlines()[0][:160]}); building offline")
        return False
    return True


# ---------------------------------------------------------------- offline: debootstrap -> import


def apt_mirror() -> str:
    """The Debian mirror this host's apt uses (debootstrap must use the same reachable one)."""
    explicit = os.environ.get("DEBIAN_MIRROR")
    if explicit:
        return explicit
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        if path.suffix not in ("", ".list", ".sources") or not path.is_file():
            continue
        for uri in _debian_uris(path.read_text(encoding="utf-8", errors="replace")):
            return uri
    return DEFAULT_MIRROR


def _debian_uris(text: str) -> Iterator[str]:
    for line in text.splitlines():
        line = line.strip()
        one_line = re.match(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", line)
        if one_line and one_line.group(2) == SUITE:
            yield one_line.group(1).rstrip("/")
    for stanza in re.split(r"\n\s*\n", text):
        fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.MULTILINE))
        if "deb" in fields.get("Types", "").split() and SUITE in fields.get("Suites", "").split():
            uris = fields.get("URIs", "").split()
            if uris and "security" not in uris[0]:
                yield uris[0].rstrip("/")


def cache_dir() -> Path:
    """Where the rootfs tarball is kept: a checkout's images/.cache (gitignored), else the user's cache."""
    explicit = os.environ.get("SANDBOX_IMAGE_CACHE")
    recipes = Path(str(importlib.resources.files("sandbox") / "images"))
    if explicit:
        path = Path(explicit)
    elif recipes.is_symlink():  # sandbox/images -> ../images: a checkout, keep the cache it always had
        path = recipes.resolve() / ".cache"
    else:
        path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sandbox" / "images"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(f"cannot create the image cache {path}: {exc.strerror}") from exc
    return path


def rootfs_tarball() -> Path:
    """The cached rootfs tarball, made by debootstrap on first use."""
    tarball = cache_dir() / f"rootfs-{SUITE}-{rootfs_key()}.tar"
    if tarball.exists():
        log(f"using cached rootfs {tarball}")
        return tarball
    if not is_root():
        raise BuildError(
            "the offline build runs debootstrap, which needs root (or make debian:bookworm-slim "
            "pullable for the online build)"
        )
    ensure_command("debootstrap", "debootstrap", "the offline image build needs it")
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix="rootfs-") as tmp:
        target = Path(tmp) / "rootfs"
        _debootstrap(target)
        _prune(target)
        partial = tarball.with_suffix(".tar.partial")
        _run(["tar", "--numeric-owner", "--xattrs", "-C", str(target), "-cf", str(partial), "."])
        partial.rename(tarball)
    log(f"cached rootfs {tarball} ({tarball.stat().st_size // 2**20} MiB)")
    return tarball


def _debootstrap(target: Path) -> None:
    mirror = apt_mirror()
    log(f"debootstrap {SUITE} from {mirror} (packages: {', '.join(PACKAGES)})")
    started = time.monotonic()
    _run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(target), mirror],
        env={**os.environ, **apt_proxy()},
        quiet=True,
    )
    log(f"debootstrap took {time.monotonic() - started:.1f}s")


def _prune(target: Path) -> None:
    for rel in PRUNE:
        path = target / rel
        if path.is_dir():
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    # debootstrap copies the host's resolver and hostname in; the image must not carry them.
    for rel in ("etc/resolv.conf", "etc/hostname"):
        (target / rel).unlink(missing_ok=True)
    (target / "etc/hostname").write_text("sandbox\n")


def _run(argv: list[str], env: dict[str, str] | None = None, quiet: bool = False) -> None:
    try:
        out = subprocess.run(argv, env=env, capture_output=quiet, text=True, check=False)
    except OSError as exc:
        raise BuildError(f"cannot run {argv[0]}: {exc.strerror}") from exc
    if out.returncode != 0:
        detail = (out.stderr or out.stdout or "")[-2000:] if quiet else ""
        raise BuildError(f"{argv[0]} failed with exit status {out.returncode}\n{detail}")


def import_rootfs(client: docker.DockerClient, tarball: Path) -> str:
    ref = f"{ROOTFS_REPOSITORY}:{__version__}-{rootfs_key()}"
    if present(client, ref):
        return ref
    log(f"importing {tarball.name} as {ref}")
    repository, image_tag = ref.split(":")
    with docker_errors(f"cannot import {tarball}"):
        reply = client.api.import_image_from_file(str(tarball), repository=repository, tag=image_tag)
        if not present(client, ref):
            # Podman's compatible API names an import <repository>:latest whatever tag was asked
            # (4.3): tag the image its reply names, or Dockerfile.offline's FROM goes to a registry.
            client.images.get(_imported_id(reply)).tag(repository, image_tag)
    return ref


def _imported_id(reply: str) -> str:
    """The image id in an import's reply (JSON lines; the last one names the image)."""
    for line in reversed(reply.splitlines()):
        with contextlib.suppress(ValueError):
            found = json.loads(line)
            if isinstance(found, dict) and str(found.get("status", "")).startswith("sha256:"):
                return str(found["status"])
    raise BuildError(f"the engine's reply to the import names no image: {reply[-300:]}")


# ---------------------------------------------------------------- docker build


def _context(dockerfile: str) -> io.BytesIO:
    """A build context holding one file, the Dockerfile: the recipes COPY nothing."""
    data = _recipe_file(dockerfile)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def docker_build(
    client: docker.DockerClient, dockerfile: str, ref: str, args: dict[str, str], network: str | None
) -> None:
    recent: collections.deque[str] = collections.deque(maxlen=BUILD_TAIL)
    with docker_errors(f"docker build of {ref} failed"):
        stream: Iterator[dict[str, Any]] = client.api.build(
            fileobj=_context(dockerfile),
            custom_context=True,
            dockerfile="Dockerfile",
            tag=ref,
            buildargs=args,
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
            network_mode=network,
        )
        for chunk in stream:
            if "error" in chunk:
                output = "".join(recent).rstrip()
                raise BuildError(f"docker build of {ref} failed: {chunk['error'].strip()}\n{output}")
            text = chunk.get("stream", "")
            recent.append(text)
            if text.startswith(("Step ", "Successfully")):
                log(text.rstrip())


def choose_mode(client: docker.DockerClient, override: str | None) -> str:
    mode = override or os.environ.get("SANDBOX_IMAGE_MODE", "auto")
    if mode not in MODES:
        raise BuildError(f"SANDBOX_IMAGE_MODE={mode!r}: choose auto, online or offline")
    if mode == "auto":
        return "online" if online_base_available(client) else "offline"
    return mode


def _build_base(client: docker.DockerClient, force: bool, mode_override: str | None) -> str:
    ref, want = tag(), recipe()
    if not force and current(client, ref, want):
        log(f"{ref} is up to date (recipe {want})")
        return ref
    mode = choose_mode(client, mode_override)
    args = {"SANDBOX_VERSION": __version__, "SANDBOX_BUILD": mode, "SANDBOX_RECIPE": want}
    if mode == "offline":
        args["BASE"] = import_rootfs(client, rootfs_tarball())
        docker_build(client, "Dockerfile.offline", ref, args, network="none")
    else:
        docker_build(client, "Dockerfile", ref, args, network=None)
    log(f"built {ref} ({mode})")
    return ref


def _build_variant(client: docker.DockerClient, variant: str, base: str, force: bool) -> str:
    ref, want = tag(variant), recipe(variant)
    if force or not current(client, ref, want):
        # The host's network, so an apt proxy on its loopback serves the build as it served debootstrap.
        args = {
            "BASE": base,
            "SANDBOX_RECIPE": want,
            "SANDBOX_VARIANT": variant,
            "SANDBOX_PACKAGES": " ".join(VARIANTS[variant]),
            **apt_proxy(),
        }
        log(f"adding {', '.join(VARIANTS[variant])} to {base} as {ref}")
        docker_build(client, "Dockerfile.variant", ref, args, network="host")
    else:
        log(f"{ref} is up to date (recipe {want})")
    floating = alias(variant)
    if floating is not None:
        repository, name = floating.split(":")
        with docker_errors(f"cannot tag {ref} as {floating}"):
            client.images.get(ref).tag(repository, name)
    return floating or ref


def build(variant: str = "base", *, force: bool = False, mode: str | None = None) -> str:
    """Build (or find current) the image of ``variant``; its tag for profiles."""
    if variant not in VARIANTS:
        raise BuildError(f"unknown image variant {variant!r}; choose {', '.join(VARIANTS)}")
    started = time.monotonic()
    client = connect()
    try:
        with docker_errors("the image build failed"):
            base = _build_base(client, force and variant == "base", mode)
            ref = base if variant == "base" else _build_variant(client, variant, base, force)
    finally:
        client.close()
    log(f"{ref} ready in {time.monotonic() - started:.1f}s")
    return ref
