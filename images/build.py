"""Build the sandbox runtime image ``sandbox-runtime:<version>`` (what ``make image`` runs).

Two paths give the same image:

* online: ``images/Dockerfile`` on top of ``debian:bookworm-slim`` (present locally or pullable);
* offline: ``debootstrap`` builds a rootfs with every package already included, the tarball is
  cached under ``images/.cache/``, imported as ``sandbox-rootfs:<version>-<recipe>``, and
  ``images/Dockerfile.offline`` adds the same tail with ``--network none``.

An image whose ``sandbox.image.recipe`` label matches the current recipe is left alone, so a
second run returns in well under a second. Talks to the daemon through the docker SDK only.

Environment: ``SANDBOX_IMAGE_MODE`` (auto|online|offline), ``SANDBOX_IMAGE_CACHE`` (rootfs cache
dir), ``DEBIAN_MIRROR`` (else taken from the host's apt sources), ``DOCKER_HOST`` and friends.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors

if TYPE_CHECKING:
    from collections.abc import Iterator

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SUITE = "bookworm"
BASE_IMAGE = "debian:bookworm-slim"
REPOSITORY = "sandbox-runtime"
ROOTFS_REPOSITORY = "sandbox-rootfs"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Keep in sync with the apt-get line of images/Dockerfile.
PACKAGES = ("bash", "coreutils", "findutils", "grep", "git", "python3", "ripgrep", "tini", "procps",
            "ca-certificates")
# What Debian's slim images leave out too; the rest of the rootfs is what debootstrap installed.
PRUNE = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
         "usr/share/info", "usr/share/locale", "var/log", "var/cache/debconf/templates.dat-old")
COMMON_TAIL = "# --- common tail"


class BuildError(Exception):
    """Something the operator must fix; printed without a traceback."""


def log(message: str) -> None:
    print(f"[image] {message}", flush=True)  # noqa: T201 - this is a command-line tool


def version() -> str:
    text = (ROOT / "sandbox" / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if not match:
        raise BuildError("no __version__ in sandbox/__init__.py")
    return match.group(1)


def _tail(dockerfile: Path) -> str:
    text = dockerfile.read_text(encoding="utf-8")
    if COMMON_TAIL not in text:
        raise BuildError(f"{dockerfile} lost its '{COMMON_TAIL}' marker")
    return text[text.index(COMMON_TAIL):]


def recipe() -> str:
    """A short hash of everything that shapes the image; the image carries it as a label."""
    online, offline = HERE / "Dockerfile", HERE / "Dockerfile.offline"
    if _tail(online) != _tail(offline):
        raise BuildError("the common tails of images/Dockerfile and images/Dockerfile.offline differ")
    digest = hashlib.sha256()
    for part in (online.read_bytes(), offline.read_bytes(), " ".join(PACKAGES).encode(), SUITE.encode()):
        digest.update(part)
    return digest.hexdigest()[:12]


def rootfs_key() -> str:
    return hashlib.sha256(f"{SUITE} {' '.join(PACKAGES)} {' '.join(PRUNE)}".encode()).hexdigest()[:12]


def connect() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except docker.errors.DockerException as exc:
        raise BuildError(f"no Docker daemon reachable ({exc}); start dockerd or set DOCKER_HOST") from exc
    return client


def current(client: docker.DockerClient, tag: str, want: str) -> bool:
    try:
        labels = client.images.get(tag).labels or {}
    except docker.errors.ImageNotFound:
        return False
    return labels.get("sandbox.image.recipe") == want


def online_base_available(client: docker.DockerClient) -> bool:
    try:
        client.images.get(BASE_IMAGE)
        return True
    except docker.errors.ImageNotFound:
        pass
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


def apt_proxy_env() -> dict[str, str]:
    """debootstrap fetches with wget, which honours http_proxy; carry apt's proxy over to it."""
    env = dict(os.environ)
    try:
        dump = subprocess.run(["apt-config", "dump"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return env
    for scheme in ("http", "https"):
        match = re.search(rf'^Acquire::{scheme}::Proxy\s+"([^"]+)";', dump, re.MULTILINE)
        if match and f"{scheme}_proxy" not in env:
            env[f"{scheme}_proxy"] = match.group(1)
    return env


def cache_dir() -> Path:
    path = Path(os.environ.get("SANDBOX_IMAGE_CACHE") or HERE / ".cache")
    path.mkdir(parents=True, exist_ok=True)
    return path


def rootfs_tarball() -> Path:
    """The cached rootfs tarball, made by debootstrap on first use."""
    tarball = cache_dir() / f"rootfs-{SUITE}-{rootfs_key()}.tar"
    if tarball.exists():
        log(f"using cached rootfs {tarball}")
        return tarball
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is not installed (apt-get install -y debootstrap)")
    if os.geteuid() != 0:
        raise BuildError("the offline build runs debootstrap, which needs root")
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
    _run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(target), mirror],
         env=apt_proxy_env(), quiet=True)
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
    out = subprocess.run(argv, env=env, capture_output=quiet, text=True, check=False)
    if out.returncode != 0:
        detail = (out.stderr or out.stdout or "")[-2000:] if quiet else ""
        raise BuildError(f"{argv[0]} failed with exit status {out.returncode}\n{detail}")


def import_rootfs(client: docker.DockerClient, tarball: Path) -> str:
    ref = f"{ROOTFS_REPOSITORY}:{version()}-{rootfs_key()}"
    try:
        client.images.get(ref)
        return ref
    except docker.errors.ImageNotFound:
        pass
    log(f"importing {tarball.name} as {ref}")
    repository, tag = ref.split(":")
    client.api.import_image_from_file(str(tarball), repository=repository, tag=tag)
    return ref


# ---------------------------------------------------------------- docker build


def build(client: docker.DockerClient, dockerfile: str, tag: str, args: dict[str, str],
          offline: bool) -> None:
    stream: Iterator[dict[str, Any]] = client.api.build(
        path=str(HERE), dockerfile=dockerfile, tag=tag, buildargs=args, rm=True, forcerm=True,
        pull=False, decode=True, network_mode="none" if offline else None,
    )
    for chunk in stream:
        if "error" in chunk:
            raise BuildError(f"docker build failed: {chunk['error'].strip()}")
        text = chunk.get("stream", "").rstrip()
        if text.startswith("Step ") or text.startswith("Successfully"):
            log(text)


def choose_mode(client: docker.DockerClient) -> str:
    mode = os.environ.get("SANDBOX_IMAGE_MODE", "auto")
    if mode not in ("auto", "online", "offline"):
        raise BuildError(f"SANDBOX_IMAGE_MODE={mode!r}: choose auto, online or offline")
    if mode == "auto":
        return "online" if online_base_available(client) else "offline"
    return mode


def make(force: bool, mode_override: str | None) -> str:
    started = time.monotonic()
    tag, want = f"{REPOSITORY}:{version()}", recipe()
    client = connect()
    if not force and current(client, tag, want):
        log(f"{tag} is up to date (recipe {want}); nothing to do ({time.monotonic() - started:.2f}s)")
        return tag
    if mode_override:
        os.environ["SANDBOX_IMAGE_MODE"] = mode_override
    mode = choose_mode(client)
    args = {"SANDBOX_VERSION": version(), "SANDBOX_BUILD": mode, "SANDBOX_RECIPE": want}
    if mode == "offline":
        args["BASE"] = import_rootfs(client, rootfs_tarball())
        build(client, "Dockerfile.offline", tag, args, offline=True)
    else:
        build(client, "Dockerfile", tag, args, offline=False)
    log(f"built {tag} ({mode}) in {time.monotonic() - started:.1f}s")
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--force", action="store_true", help="rebuild even if the image is current")
    parser.add_argument("--mode", choices=("auto", "online", "offline"), help="override SANDBOX_IMAGE_MODE")
    parser.add_argument("--print-tag", action="store_true", help="print the tag and exit")
    opts = parser.parse_args(argv)
    try:
        if opts.print_tag:
            print(f"{REPOSITORY}:{version()}")  # noqa: T201
            return 0
        make(opts.force, opts.mode)
    except BuildError as exc:
        log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
