"""The tables of a profile that shape the jail: the workspace's mount, the network, limits and
timeouts, the environment and each backend's own settings, with the sizes they are written in.

Each table checks its own keys here; :mod:`sandbox.profile` puts them together into a profile,
loads it and checks across tables (no setting may void a guarantee the profile requires). Sizes
are binary whatever the spelling, as Docker reads them; zero, fractions of a byte and memory
below :data:`MIN_MEMORY` are refused. The permission layer's ``[policy]`` table is in
:mod:`sandbox.profile_policy`.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from sandbox import envrules
from sandbox.errors import InvalidArgument
from sandbox.vocabulary import CacheMode, Lifecycle, MountStrategy, NetworkMode

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
MIN_MEMORY = 6 * 2**20  # Docker's own floor; below it no Python, shell or test runner starts anyway


def parse_size(value: object) -> int:
    """``"512MiB"``, ``"1g"``, ``"2 GB"`` or an int of bytes -> bytes.

    Every unit is binary, as Docker reads them: ``2g`` = ``2G`` = ``2GB`` = ``2GiB`` = 2**31.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError("a size is a number of bytes or a string like '512MiB'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a size (examples: 4096, '512MiB', '2g', '1GiB')")
    number = Fraction(match.group(1))
    scaled = number * 1024 ** ("_kmgt".index((match.group(2) or "_").lower()))
    if scaled.denominator != 1:
        raise ValueError(f"{value!r} is a fraction of a byte; give whole bytes (e.g. '1536KiB')")
    return int(scaled)


def _positive(value: int) -> int:
    if value <= 0:
        raise ValueError("must be more than 0 bytes")
    return value


def _enough_memory(value: int) -> int:
    if value < MIN_MEMORY:
        raise ValueError(f"must be at least {MIN_MEMORY // 2**20}MiB, got {value} bytes")
    return value


Size = Annotated[int, BeforeValidator(parse_size)]
PositiveSize = Annotated[int, BeforeValidator(parse_size), AfterValidator(_positive)]
MemorySize = Annotated[int, BeforeValidator(parse_size), AfterValidator(_enough_memory)]
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # the schema's sanity cap; each profile sets its own timeouts.max_s


class Table(BaseModel):
    # A profile's table: a key it does not know is refused, and a loaded profile never changes.
    model_config = ConfigDict(extra="forbid", frozen=True)


_GLOB_CHARS = frozenset("*?[]{}")


def _workspace_entry(value: str) -> str:
    """An ``exclude`` entry: a plain path relative to the workspace, returned normalised."""
    path = PurePosixPath(value)
    if not value.strip() or not path.parts:
        raise ValueError("an empty path names the whole workspace; name a directory inside it")
    if path.is_absolute():
        raise ValueError(f"{value!r} is absolute; give a path relative to the workspace (e.g. '.venv')")
    if ".." in path.parts:
        raise ValueError(f"{value!r} leaves the workspace ('..'); give a path inside it")
    if _GLOB_CHARS & set(value) or "\\" in value:
        raise ValueError(f"{value!r} is a pattern; exclude takes plain paths, not globs")
    return str(path)


class Mount(Table):
    """How the workspace is shown; ``exclude`` only matters to the private trees (copy, overlay).

    Each excluded path (``.venv``, ``node_modules``: plain paths inside the workspace, no globs)
    is kept out of the private copy and bound read-only from the host at the same place instead,
    so the jail can use it but not change it, and the changeset lists it as untracked. A path
    missing from the workspace is skipped. ``ro`` and ``rw`` bind the workspace itself: nothing
    is copied there, so they ignore it. ``environment`` and ``environment_cache``: see
    :mod:`sandbox.mounts.envdirs`; ``download_cache``: :mod:`sandbox.downloads`.
    """

    strategy: MountStrategy = "rw"
    exclude: tuple[Annotated[str, AfterValidator(_workspace_entry)], ...] = ()
    # Environment, not work (sandbox.mounts.envdirs): a bare name matches at any depth, a path from the top.
    # Copied like the rest; in a changeset one consent group each, applied only when asked.
    environment: tuple[Annotated[str, AfterValidator(_workspace_entry)], ...] = ()
    environment_cache: CacheMode = "off"  # "project": reuse them across copy runs, keyed by the lock files
    # "project": installers' download caches kept per workspace in the data dir, bound into the jail
    # (sandbox.downloads); any mount strategy, never the host's home.
    download_cache: CacheMode = "off"
    # Review only (sandbox.changesummary): gitignore-style globs of changes that are noise, summed
    # up in one line instead of listed; they are kept and applied like the rest.
    ignore: tuple[Annotated[str, Field(min_length=1)], ...] = ()


def _egress_pattern(pattern: str) -> str:
    from sandbox.network.policy import parse_rule

    try:
        parse_rule(pattern)
    except InvalidArgument as exc:
        raise ValueError(exc.message) from None
    return pattern


EgressPattern = Annotated[str, AfterValidator(_egress_pattern)]


def _index_spec(spec: str) -> str:
    from sandbox.network import indexes

    try:
        indexes.resolve([spec])
    except InvalidArgument as exc:
        raise ValueError(exc.message) from None
    return spec


IndexSpec = Annotated[str, AfterValidator(_index_spec)]


_SECRET_SOURCE = re.compile(r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:.+|keyring:[^/]+/.+)$")
_SECRET_AS = re.compile(r"^(bearer|basic|env-placeholder|aws-sigv4|header:[!#$%&'*+.^_`|~0-9A-Za-z-]+)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _secret_source(value: str) -> str:
    if not _SECRET_SOURCE.match(value):
        raise ValueError(f"{value!r}: a secret comes 'from' 'env:VAR', 'file:PATH' or 'keyring:SERVICE/USER'")
    return value


class Secret(Table):
    """``[secrets.NAME]``: a credential the jail never reads (:mod:`sandbox.network.secrets`).

    The jail gets a placeholder in ``env`` (default: NAME) and, for git, a credential helper that
    returns it; the egress proxy puts the real value (read ``from`` the host when the session opens)
    only into requests to ``hosts``, only where ``as`` says: ``bearer`` (``Authorization: Bearer``),
    ``basic`` (the password of ``Authorization: Basic``), ``header:NAME``, ``env-placeholder`` (any
    request header), ``aws-sigv4`` (the request is signed again with it as the secret access key
    of ``access_key_id``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    from_: Annotated[str, AfterValidator(_secret_source)] = Field(alias="from")
    hosts: tuple[EgressPattern, ...] = Field(min_length=1)
    as_: Annotated[str, Field(pattern=_SECRET_AS.pattern)] = Field("bearer", alias="as")
    env: Annotated[str, Field(pattern=_ENV_NAME.pattern)] | None = None
    username: Annotated[str, Field(min_length=1, pattern=r"^[^:\s]+$")] = "x-access-token"
    access_key_id: Annotated[str, Field(pattern=r"^[A-Z0-9]{8,128}$")] | None = None

    @model_validator(mode="after")
    def _signing_needs_a_key_id(self) -> Secret:
        if (self.as_ == "aws-sigv4") != (self.access_key_id is not None):
            raise ValueError("access_key_id goes with as = 'aws-sigv4', and aws-sigv4 needs it")
        return self


_RULE_PRESET = Literal["read-only"]


class RequestRule(Table):
    """``[[network.requests]]``: what requests to ``hosts`` may do (:mod:`sandbox.network.reqrules`);
    the proxy terminates TLS to those hosts to read them. ``allow``: ``"METHODS /path*"`` rules;
    ``preset = "read-only"``: GET, HEAD and OPTIONS anywhere; ``git_fetch``: git fetches from any
    repository; ``git_push``: repositories one may push to (globs); ``git_refs``: the refs a push
    may change (default: any)."""

    hosts: tuple[EgressPattern, ...] = Field(min_length=1)
    allow: tuple[Annotated[str, Field(min_length=1)], ...] = ()
    preset: _RULE_PRESET | None = None
    git_fetch: bool = False
    git_push: tuple[Annotated[str, Field(min_length=1)], ...] = ()
    git_refs: tuple[Annotated[str, Field(min_length=1)], ...] = ()

    @model_validator(mode="after")
    def _rules_parse(self) -> RequestRule:
        from sandbox.network.reqrules import RequestRules

        RequestRules.parse(self.allow, self.preset, self.git_fetch, self.git_push, self.git_refs)
        return self


class Network(Table):
    """``none``: a private loopback only. ``host``: the host's network. ``allowlist``: no route
    out but the host-side filtering proxy (:mod:`sandbox.network`), which lets through only what
    ``allow`` names and ``deny`` does not: ``host``, ``*.host`` (subdomains only), ``host:port``,
    an IP literal or a CIDR; a pattern without a port means 80 and 443. ``ask``: a destination
    no rule names is put to the session's approver instead of refused.

    ``indexes``: package indexes by name (``pypi``, ``npm``, ``crates``, ``go``) or ``NAME=URL`` for a
    mirror (:mod:`sandbox.network.indexes`); their hosts join ``allow`` and a mirror's variables
    (``PIP_INDEX_URL`` ...) the jail's ``env.set`` when the profile is validated, so every backend
    and every report sees the same allowlist. They need ``mode = "allowlist"``."""

    mode: NetworkMode = "none"
    allow: tuple[EgressPattern, ...] = ()
    deny: tuple[EgressPattern, ...] = ()
    indexes: tuple[IndexSpec, ...] = ()
    ask: bool = False
    transparent: bool = False  # root, bwrap: programs that ignore the proxy variables are filtered too
    requests: tuple[RequestRule, ...] = ()

    @model_validator(mode="after")
    def _transparent_needs_an_allowlist(self) -> Network:
        for key, used in (("transparent", self.transparent), ("indexes", self.indexes), ("requests", self.requests)):
            if used and self.mode != "allowlist":
                raise ValueError(f"network.{key} needs network.mode = 'allowlist', not {self.mode!r}")
        return self


class Limits(Table):
    memory: MemorySize | None = parse_size("1GiB")
    pids: int | None = Field(256, ge=8)
    cpu_time_s: int | None = Field(300, ge=1)
    cpus: float | None = Field(None, ge=0.01)  # Docker's smallest CPU quota
    file_size: PositiveSize | None = parse_size("1GiB")
    tmp_size: PositiveSize | None = parse_size("256MiB")
    nofile: int | None = Field(1024, ge=16)
    capture_bytes: Size = Field(parse_size("1MiB"), ge=1024)
    # What a server streams to its client while a call runs (sandbox.live): per stream, and both.
    live_stream_bytes: Size = Field(parse_size("1MiB"), ge=1024)
    live_total_bytes: Size = Field(parse_size("1MiB"), ge=1024)
    # What the data directory keeps of copy/overlay sessions' changes, all kept changesets together
    # (sandbox.changes): a keep that would pass it is refused (TOOL_FAILED, reason ENOSPC).
    kept_changes: PositiveSize = parse_size("2GiB")
    # What the data directory keeps of session snapshots (sandbox.snapshots): at most ``snapshots``
    # a workspace and ``snapshot_bytes`` of layers a user; one past either is refused (CONFLICT).
    snapshots: int = Field(32, ge=1)
    snapshot_bytes: PositiveSize = parse_size("2GiB")
    # While a call runs, the free space the host filesystems it writes (copy tree, overlay upper dir,
    # scratch, a rw workspace) keep; below it the call is killed with TOOL_FAILED (ENOSPC), see
    # sandbox.diskguard. Unset: 1 GiB or 5% of the filesystem, whichever is smaller.
    disk_reserve: PositiveSize | None = None
    # What one call may take of those filesystems (the drop of their free space while it runs; other
    # writers to the same disk count too, hence off unless set).
    disk_write: PositiveSize | None = None

    def in_force(self) -> dict[str, int | float | None]:
        """The limits a call runs under (``None``: not limited), as ``--json`` reports them."""
        # bounds the host keeps, not the jail's
        host_side = {"kept_changes", "snapshots", "snapshot_bytes", "disk_reserve", "disk_write"}
        return self.model_dump(exclude={"capture_bytes", "live_stream_bytes", "live_total_bytes", *host_side})


class Timeouts(Table):
    """Wall-clock seconds per call: ``default_s`` unless the caller asks for up to ``max_s``."""

    default_s: float = Field(60, ge=1, le=MAX_TIMEOUT_S)
    max_s: float = Field(3600, ge=1, le=MAX_TIMEOUT_S)
    kill_grace_s: float = Field(0.5, ge=0, le=10)


class Env(Table):
    """What the jail sees of the caller's environment, beyond the built-in allowlist (LANG, TERM ...).

    ``allow`` is the pass-through list: variables copied from the caller's environment when set
    (``GIT_AUTHOR_NAME`` ...); ``set`` gives fixed values; ``files`` binds files of the caller's
    home read-only at the same place in the jail's home (``~/.gitconfig``): a missing one is
    skipped, a secret refused; ``workspace_path`` lists workspace directories put first on PATH
    when they exist (``[]`` turns that off). See :mod:`sandbox.backends.environment`.
    """

    allow: tuple[Annotated[str, AfterValidator(envrules.passable_name)], ...] = ()
    set: dict[str, str] = Field(default_factory=dict)
    files: tuple[Annotated[str, AfterValidator(envrules.home_file)], ...] = ()
    workspace_path: tuple[Annotated[str, AfterValidator(envrules.workspace_dir)], ...] = (
        ".venv/bin",
        "node_modules/.bin",
    )


_NUMERIC_USER = re.compile(r"(\d+)(?::(\d+))?")


def _not_root(user: str) -> str:
    """``docker.user``: a numeric ``uid[:gid]``, never uid 0 (the backend's ``non-root`` guarantee
    holds for every profile, so no profile may run a container's commands as root)."""
    found = _NUMERIC_USER.fullmatch(user)
    if found is None:
        raise ValueError(f"docker.user must be a numeric uid:gid, got {user!r}")
    if int(found[1]) == 0:
        raise ValueError(
            f"docker.user {user!r} would run commands as root; the docker backend never does (its non-root "
            "guarantee): give another uid, and install what root must in the image (sandbox image build)"
        )
    return user


class Docker(Table):
    """The Docker backend's settings, and which engine it talks to.

    ``host``: the engine's address, ``tcp://host:2376``, ``ssh://user@host`` or
    ``unix:///path/docker.sock``; unset, the SDK's environment decides (``DOCKER_HOST``,
    ``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH``, as ``docker.from_env`` reads them), and the TLS
    settings below must be unset too. ``tls_ca``, ``tls_cert``, ``tls_key``: PEM files (the CA that
    signed the engine's certificate; our client certificate and its key, both or neither), for a
    ``tcp://`` host only; ``tls_verify`` (default: on whenever ``tls_ca`` is given) checks the
    engine's certificate against ``tls_ca``. A TLS setting on a ``tcp://`` host makes the
    connection TLS; a ``tcp://`` host without any is plain HTTP (Docker's port 2375, unencrypted).

    ``remote``: whether the engine sees this host's files. ``auto`` (the default): a ``tcp://`` or
    ``ssh://`` engine is remote, a ``unix://`` one local; ``true`` says a unix socket leads
    elsewhere (a forwarded socket, a VM's engine). A remote engine gets the workspace through the
    archive API only: ``copy`` mounts (copy-in and copy-out as tar streams), ``rw``, ``ro`` and
    ``overlay`` refused, the warm agent's calls over the attach stream.

    ``ca_certificates``: whose CA certificates the jail trusts. ``image`` (the default): the
    image's own store. ``host``: the bundle this host trusts (bubblewrap's jails see it in the
    host's /etc), bound read-only over the image's ``/etc/ssl/certs/ca-certificates.crt`` and named
    by ``SSL_CERT_FILE`` and the other clients' variables, so an allowlisted download verifies as it
    does on the host (a company's CA, a mirror's). ``ca_bundle``: that bundle, a PEM file of
    certificates only (default: the first of the distributions' usual paths that exists).

    ``runtime``: the OCI runtime the engine runs the jail's containers with, by the name the engine
    registered it under (``docker info``: Runtimes); unset, the engine's default (runc, or Podman's
    crun). ``runsc`` is gVisor (:mod:`sandbox.backends.docker.gvisor`): the commands' system calls
    are served by its user-space kernel, not the host's (the ``kernel-isolated`` guarantee). A name
    the engine does not know is refused, never run on the default runtime instead.
    """

    image: str | None = None
    lifecycle: Lifecycle = "session"
    user: Annotated[str, AfterValidator(_not_root)] = "1000:1000"
    host: str | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_verify: bool | None = None
    remote: Literal["auto"] | bool = "auto"
    ca_certificates: Literal["image", "host"] = "image"
    ca_bundle: Path | None = None
    runtime: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")] | None = None

    @model_validator(mode="after")
    def _engine(self) -> Docker:
        scheme = (self.host or "").partition("://")[0]
        if self.host is not None and scheme not in {"tcp", "ssh", "unix"}:
            raise ValueError(f"docker.host {self.host!r}: give tcp://host:port, ssh://user@host or unix:///path")
        tls = [n for n in ("tls_ca", "tls_cert", "tls_key", "tls_verify") if getattr(self, n) is not None]
        if tls and scheme != "tcp":
            raise ValueError(f"{', '.join(tls)} need a tcp:// docker.host (the environment's engine takes DOCKER_*)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("docker.tls_cert and docker.tls_key go together: give both or neither")
        if self.tls_verify and self.tls_ca is None:
            raise ValueError("docker.tls_verify needs docker.tls_ca, the CA that signed the engine's certificate")
        if self.ca_bundle is not None and self.ca_certificates != "host":
            raise ValueError('docker.ca_bundle is the host\'s bundle: it needs docker.ca_certificates = "host"')
        if self.ca_bundle is not None and not self.ca_bundle.is_absolute():
            raise ValueError(f"docker.ca_bundle {str(self.ca_bundle)!r}: give an absolute path")
        return self


class Bwrap(Table):
    """The bubblewrap backend's settings.

    ``lifecycle``: ``session`` (the default) keeps one jail per session whose PID 1 is the agent
    of :mod:`sandbox._jailside.agent`: a call costs a fork in the jail, and what one call leaves in
    ``/tmp``, the jail's home or the workspace is there for the next (each call's processes
    still die with it). See :mod:`sandbox.backends.bwrap_warm`. ``call`` starts a fresh
    ``bwrap`` (namespaces, mounts) for every call: nothing of one call is seen by the next.
    ``sandbox run`` makes one call, so it always takes a fresh jail.
    """

    lifecycle: Lifecycle = "session"


class Winjob(Table):
    """The Windows job-object backend's settings.

    ``shell``: what the Bash tool's command runs in, an id of the shell catalogue
    (:mod:`sandbox.shells`, ``sandbox shells``): ``cmd`` (on every Windows and under Wine, the
    fastest to start, ``/d`` keeps the registry's AutoRun out), ``windows-powershell`` (no profile,
    non-interactive) or ``git-bash`` (Git for Windows' bash, refused with SHELL_NOT_FOUND where it
    is not installed: never another shell in its place); ``powershell`` and ``bash`` are their
    earlier spellings. Unset: the user's default (``sandbox shells default ID``), else ``cmd``.
    """

    shell: Literal["cmd", "windows-powershell", "git-bash", "powershell", "bash"] | None = None
