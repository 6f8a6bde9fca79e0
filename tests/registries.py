"""Hermetic package indexes for the recipe tests and the dependency benchmark: PyPI and npm on loopback.

Two halves, both stdlib only (the server half runs as a plain script in a child process):

* **Fetch** (``python tests/registries.py fetch DIR``, what ``make test-fixtures`` runs, once;
  idempotent): real projects nobody here wrote, with their own test suites, and everything
  installing them and their test dependencies needs:

  - ``DIR/pypi/``: the source distributions of :data:`PY_PROJECTS` (they ship their tests) and
    the wheels of :data:`PY_WHEELS` (pytest and its dependencies, the projects' build backends),
    for CPython 3.11, the Python of both the host's Debian and the Docker image;
  - ``DIR/npm/``: ``npm pack`` of :data:`NPM_PROJECT` (a tape suite) and the tarball of every
    package of its dependency tree, devDependencies included (the tree ``npm install`` resolves:
    532 packages), with ``index.json`` holding each tarball's manifest.

* **Serve** (:class:`Registries`): one child process listening on a random ``127.213.X.Y`` (not
  127.0.0.1: a jail's ``no_proxy`` sends that to the jail's own loopback, so requests to the
  registries go through the allowlist proxy like any index's, and the proxy lets them through only
  because the index spec names the address) serving

  - a PEP 503 simple index at ``/simple/`` (files linked with ``#sha256=`` fragments), for
    ``--allow-index pypi=URL`` (``PIP_INDEX_URL``);
  - an npm registry stand-in at ``/npm/``: ``GET /npm/<name>`` (``@scope%2fname`` too) answers the
    packument JSON, its ``dist.tarball`` URLs point back at this server; for
    ``--allow-index npm=URL`` (``npm_config_registry``).

The fixtures live in ``.cache/fixtures/`` of the checkout (gitignored), or where
``SANDBOX_TEST_FIXTURES`` says. Nothing here reaches the network but the fetch.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import functools
import hashlib
import html
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import TracebackType

# Two pure-Python libraries whose sdists ship their pytest-runnable suites, with different build
# backends (setuptools without a pyproject.toml; flit_core): what `pip install .` meets in the wild.
PY_PROJECTS = ("six==1.17.0", "more-itertools==10.5.0")
PY_WHEELS = ("pytest==8.3.4", "setuptools==75.3.0", "wheel==0.45.1", "flit_core==3.10.1")
PY_VERSION = "3.11"
# minimist's own tape suite, with the whole devDependency tree its package.json names (eslint,
# nyc, tape ...): the 532-package install the issue measured.
NPM_PROJECT = "minimist@1.2.8"
NPM_REGISTRY = "https://registry.npmjs.org/"
FIXTURES_VERSION = "1"  # bump when the lists above change: `make test-fixtures` fetches again
DEFAULT_DIR = Path(__file__).resolve().parents[1] / ".cache" / "fixtures"
STAMP = ".complete"
MANIFEST_KEYS = (
    "name",
    "version",
    "dependencies",
    "optionalDependencies",
    "peerDependencies",
    "peerDependenciesMeta",
    "bin",
    "engines",
    "os",
    "cpu",
    "license",
)
START_TIMEOUT_S = 30.0


class FixturesMissing(Exception):
    """The fixtures were never fetched: the message says which command fetches them."""


def fixtures_dir() -> Path:
    """Where the fixtures are (``SANDBOX_TEST_FIXTURES``, else the checkout's ``.cache/fixtures``)."""
    return Path(os.environ.get("SANDBOX_TEST_FIXTURES") or DEFAULT_DIR)


def require_fixtures(root: Path | None = None) -> Path:
    """The fixtures directory, complete, or :class:`FixturesMissing` naming ``make test-fixtures``."""
    root = root or fixtures_dir()
    stamp = root / STAMP
    if not stamp.is_file() or stamp.read_text().strip() != FIXTURES_VERSION:
        raise FixturesMissing(f"no package fixtures in {root}: run `make test-fixtures` (needs the network once)")
    return root


def sdist(root: Path, project: str) -> Path:
    """The source distribution of ``project`` (``six``, ``more-itertools``) in the fixtures."""
    stem = project.replace("-", "_").lower()
    for path in sorted((root / "pypi").glob("*.tar.gz")):
        if path.name.replace("-", "_").lower().startswith(stem + "_"):
            return path
    raise FixturesMissing(f"no sdist of {project} in {root / 'pypi'}: run `make test-fixtures`")


def unpack(archive: Path, dest: Path) -> Path:
    """Extract a ``.tar.gz`` (an sdist, an npm tarball) into ``dest``; its one top directory."""
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Debian 12's Python 3.11.2 predates extraction filters; these archives were fetched by us
            tar.extractall(dest)
    (top,) = [path for path in dest.iterdir() if path.is_dir()]
    return top


# --- fetch -----------------------------------------------------------------------------------


def fetch(root: Path) -> None:
    """Fetch every fixture into ``root`` unless a complete set is already there (idempotent)."""
    with contextlib.suppress(FixturesMissing):
        require_fixtures(root)
        sys.stdout.write(f"fixtures: {root} is complete\n")
        return
    partial = Path(tempfile.mkdtemp(prefix=".fetch-", dir=_made(root.parent)))
    try:
        _fetch_pypi(partial / "pypi")
        _fetch_npm(partial / "npm")
        (partial / STAMP).write_text(FIXTURES_VERSION + "\n")
        shutil.rmtree(root, ignore_errors=True)
        partial.rename(root)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    sys.stdout.write(f"fixtures: fetched into {root}\n")


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fetch_pypi(dest: Path) -> None:
    pip = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d", str(dest)]
    subprocess.run([*pip, "--no-deps", "--no-binary", ":all:", *PY_PROJECTS], check=True)
    target = ["--only-binary", ":all:", "--python-version", PY_VERSION, "--implementation", "cp"]
    subprocess.run([*pip, *target, *PY_WHEELS], check=True)


def _fetch_npm(dest: Path) -> None:
    tarballs = _made(dest / "tarballs")
    subprocess.run(["npm", "pack", "--silent", NPM_PROJECT], cwd=dest, check=True, stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as scratch:
        project = unpack(next(dest.glob("*.tgz")), Path(scratch))
        # The tree `npm install` would resolve, without installing it: its lock file lists every tarball.
        quiet = ["--no-audit", "--no-fund", "--loglevel=error", "--ignore-scripts"]
        subprocess.run(["npm", "install", "--package-lock-only", *quiet], cwd=project, check=True)
        lock = json.loads((project / "package-lock.json").read_text())
    urls = sorted({_tarball_url(key, entry) for key, entry in lock["packages"].items() if key and "version" in entry})
    if not urls:
        raise RuntimeError(f"npm resolved no packages for {NPM_PROJECT}")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        manifests = list(pool.map(lambda url: _download_tarball(url, tarballs), urls))
    (dest / "index.json").write_text(json.dumps(manifests, indent=1, sort_keys=True))


def _tarball_url(key: str, entry: dict[str, Any]) -> str:
    # npm 11 leaves "resolved" out of a registry package's lock entry: its URL is the registry's rule.
    if "resolved" in entry:
        return str(entry["resolved"])
    name = entry.get("name") or key.rsplit("node_modules/", 1)[1]
    return f"{NPM_REGISTRY}{name}/-/{name.rsplit('/', 1)[-1]}-{entry['version']}.tgz"


def _download_tarball(url: str, dest: Path) -> dict[str, Any]:
    name = urllib.parse.unquote(url.rsplit("/-/", 1)[0].split("/", 3)[3])
    version_file = url.rsplit("/", 1)[1]
    path = dest / f"{name.replace('/', '+')}+{version_file}"
    path.write_bytes(_download(url))
    manifest = _tarball_manifest(path)
    manifest["_file"] = path.name
    return manifest


def _download(url: str, attempts: int = 6) -> bytes:
    # A CI machine's resolver or the registry fails now and then ("Temporary failure in name
    # resolution"): a download is tried again, waiting longer each time, before the fetch fails.
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                return bytes(response.read())
        except OSError as error:  # URLError, a reset, a timeout
            if attempt == attempts - 1:
                raise RuntimeError(f"{url}: {error} ({attempts} attempts)") from error
            time.sleep(min(2**attempt, 20) + random.random())
    raise AssertionError("unreachable")


def _tarball_manifest(path: Path) -> dict[str, Any]:
    with tarfile.open(path) as tar:
        for member in tar:
            # The top directory is "package" by convention, not always (some tarballs use the name).
            if member.isfile() and member.name.count("/") == 1 and member.name.endswith("/package.json"):
                extracted = tar.extractfile(member)
                assert extracted is not None
                data = json.loads(extracted.read())
                return {key: data[key] for key in MANIFEST_KEYS if key in data}
    raise ValueError(f"{path}: no package.json")


# --- serve -----------------------------------------------------------------------------------


class Registries:
    """The two registries, served by a child process; a context manager (or call :meth:`close`).

    ``pypi_url`` is the simple index (``http://127.213.X.Y:PORT/simple/``), ``npm_url`` the npm
    registry (``http://127.213.X.Y:PORT/npm/``), ``address`` the ``host:port`` both listen on.
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = require_fixtures(root)
        host = f"127.213.{random.randrange(1, 255)}.{random.randrange(2, 255)}"
        argv = [sys.executable, str(Path(__file__).resolve()), "serve", str(self.root), host]
        self._process = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        assert self._process.stdout is not None
        line = self._process.stdout.readline()  # "listening HOST PORT", or EOF if it died
        if not line.startswith("listening "):
            self.close()
            raise RuntimeError(f"the registries did not start (exit {self._process.returncode})")
        _, host, port = line.split()
        self.address = f"{host}:{port}"
        self.pypi_url = f"http://{self.address}/simple/"
        self.npm_url = f"http://{self.address}/npm/"

    def downloads(self) -> dict[str, int]:
        """The package files and tarballs served so far, by path (how many times each)."""
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy of ours
        with direct.open(f"http://{self.address}/_lab/downloads", timeout=10) as answer:
            return dict(json.loads(answer.read()))

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()

    def __enter__(self) -> Registries:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class _Store:
    """What the server answers from: the PyPI files by normalised project, the npm manifests by name."""

    def __init__(self, root: Path) -> None:
        self.pypi = root / "pypi"
        self.tarballs = root / "npm" / "tarballs"
        self.projects: dict[str, list[tuple[str, str]]] = {}
        for path in sorted(self.pypi.iterdir()):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            self.projects.setdefault(_pep503_name(path.name), []).append((path.name, digest))
        self.packages: dict[str, list[dict[str, Any]]] = {}
        for manifest in json.loads((root / "npm" / "index.json").read_text()):
            self.packages.setdefault(manifest["name"], []).append(manifest)

    @functools.lru_cache(maxsize=1024)  # noqa: B019 (one store per server process, alive as long as it)
    def packument(self, name: str, base: str) -> bytes:
        """The packument JSON of ``name``, its tarballs linked under ``base``; computed once (hashes)."""
        versions = {}
        for manifest in self.packages[name]:
            data = (self.tarballs / manifest["_file"]).read_bytes()
            dist = {
                "tarball": f"{base}-/tarballs/{urllib.parse.quote(manifest['_file'])}",
                "shasum": hashlib.sha1(data).hexdigest(),  # npm's legacy checksum
                "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode(),
            }
            versions[manifest["version"]] = {k: v for k, v in manifest.items() if k != "_file"} | {"dist": dist}
        latest = max(versions, key=_version_key)
        return json.dumps({"name": name, "dist-tags": {"latest": latest}, "versions": versions}).encode()


def _pep503_name(filename: str) -> str:
    # Wheels: name-version-...; sdists: name-version.tar.gz. The name never contains "-" in a
    # wheel; an sdist's may ("more-itertools-10.5.0"), so take everything before the version.
    stem = filename.removesuffix(".tar.gz").removesuffix(".whl")
    match = re.match(r"(.+?)-\d", stem)
    return re.sub(r"[-_.]+", "-", (match.group(1) if match else stem)).lower()


def _version_key(version: str) -> tuple[int, ...]:
    release = version.split("-", 1)[0].split("+", 1)[0]
    return tuple(int(part) if part.isdigit() else 0 for part in release.split("."))


class _Handler(BaseHTTPRequestHandler):
    store: _Store
    protocol_version = "HTTP/1.1"

    served: ClassVar[dict[str, int]] = {}  # downloads (package files, tarballs) answered, by path

    def do_GET(self) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        try:
            body, kind = self._route(path)
        except (KeyError, FileNotFoundError, IsADirectoryError):
            body, kind, status = b'{"error":"not found"}', "application/json", 404
        else:
            status = 200
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        if status == 200 and path.startswith(_DOWNLOADS):
            self.served[path] = self.served.get(path, 0) + 1
            self.send_header("Cache-Control", "max-age=365000000, immutable, public")  # as PyPI's files say
        elif status == 200 and not path.startswith("/_lab/"):
            self.send_header("Cache-Control", "max-age=600, public")  # as PyPI's simple pages say
        if self.headers.get("Connection", "").lower() == "close":
            # What real registries answer: the allowlist proxy asks the server to close after each
            # response, and a client must be told, or it sends its next request into a closing socket.
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _route(self, path: str) -> tuple[bytes, str]:
        base = f"http://{self.headers['Host']}/npm/"
        if path == "/_lab/downloads":
            return json.dumps(self.served).encode(), "application/json"
        if path in ("/simple", "/simple/"):
            links = "".join(f'<a href="/simple/{name}/">{name}</a>\n' for name in sorted(self.store.projects))
            return _page(links), "text/html"
        if path.startswith("/simple/"):
            files = self.store.projects[path.removeprefix("/simple/").strip("/")]
            links = "".join(f'<a href="/files/{quoted(fn)}#sha256={sha}">{html.escape(fn)}</a>\n' for fn, sha in files)
            return _page(links), "text/html"
        if path.startswith("/files/"):
            return (self.store.pypi / Path(path).name).read_bytes(), "application/octet-stream"
        if path.startswith("/npm/-/tarballs/"):
            return (self.store.tarballs / Path(path).name).read_bytes(), "application/octet-stream"
        if path.startswith("/npm/"):
            return self.store.packument(path.removeprefix("/npm/"), base), "application/json"
        raise KeyError(path)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a test's output is the jail's, not the registry's access log."""


_DOWNLOADS = ("/files/", "/npm/-/tarballs/")


def quoted(name: str) -> str:
    return html.escape(urllib.parse.quote(name))


def _page(links: str) -> bytes:
    return f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n".encode()


def serve(root: Path, host: str) -> None:
    """Serve until killed; print ``listening HOST PORT`` once ready (what :class:`Registries` waits for)."""
    _Handler.store = _Store(require_fixtures(root))
    server = ThreadingHTTPServer((host, 0), _Handler)
    server.daemon_threads = True
    sys.stdout.write(f"listening {host} {server.server_address[1]}\n")
    sys.stdout.flush()
    server.serve_forever()


@contextlib.contextmanager
def running(root: Path | None = None) -> Iterator[Registries]:
    """``with running() as reg:`` the registries for the length of the block."""
    registries = Registries(root)
    try:
        yield registries
    finally:
        registries.close()


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "fetch":
        fetch(Path(argv[1]).resolve())
        return 0
    if len(argv) == 3 and argv[0] == "serve":
        serve(Path(argv[1]), argv[2])
        return 0
    sys.stderr.write("usage: registries.py fetch DIR | serve DIR HOST\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
