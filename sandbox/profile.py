"""Profiles: what a jail may do, loaded from TOML and validated by pydantic.

A profile names a backend, a mount strategy, network, limits, timeouts, the guarantees it
requires and its policy settings. Errors name the file, the key and the problem, or the flag
that set a value (:meth:`Profile.override`). Sizes are binary whatever the spelling, as Docker
reads them; zero, fractions of a byte and memory below :data:`MIN_MEMORY` are refused. No
setting, in the file or from a flag, may void a guarantee the profile requires (``net-none``
with ``network.mode = "host"``): that is refused, never silently weakened.
"""

from __future__ import annotations

import importlib.resources
import re
import tomllib
from fractions import Fraction
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from sandbox import envrules
from sandbox.errors import InvalidArgument
from sandbox.vocabulary import (
    GUARANTEE_DESCRIPTIONS,
    BackendChoice,
    CacheMode,
    ClassifierMode,
    Guarantee,
    Lifecycle,
    MediumRisk,
    MountStrategy,
    NetworkMode,
    OperatingMode,
    PermissionMode,
    ProjectTrust,
    Unattended,
)

if TYPE_CHECKING:
    from collections.abc import Mapping


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


class _Model(BaseModel):
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


class Mount(_Model):
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


class Network(_Model):
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

    @model_validator(mode="after")
    def _transparent_needs_an_allowlist(self) -> Network:
        for key, used in (("transparent", self.transparent), ("indexes", self.indexes)):
            if used and self.mode != "allowlist":
                raise ValueError(f"network.{key} needs network.mode = 'allowlist', not {self.mode!r}")
        return self


def _with_indexes(data: Any) -> Any:
    """A profile's raw data with its indexes' hosts added to ``network.allow`` and their mirror
    variables to ``env.set`` (a spec that does not resolve is left to the field's own validator,
    which names the key, or the flag that gave it)."""
    from sandbox.network import indexes

    if not isinstance(data, dict):
        return data
    network, section = (_as_dict(data.get(key, {})) for key in ("network", "env"))
    specs = network.get("indexes") if isinstance(network, dict) else None
    if not specs or not isinstance(specs, list | tuple):
        return data
    hosts: list[str] = []
    env: dict[str, str] = {}
    for spec in specs:
        try:
            found = indexes.resolve([spec])
        except (InvalidArgument, AttributeError, TypeError):
            continue
        hosts.extend(found.hosts)
        env.update(found.env)
    given = network.get("allow", ())
    env_given = section.get("set", {}) if isinstance(section, dict) else None
    if not isinstance(given, list | tuple) or not isinstance(env_given, dict):
        return data  # the fields' own validators say what is wrong
    allow = list(dict.fromkeys([*given, *hosts]))
    env_set = {**env_given, **env}  # the index the flag named is the one pip must use
    return {**data, "network": {**network, "allow": allow}, "env": {**section, "set": env_set}}


def _as_dict(section: Any) -> Any:
    return section.model_dump() if isinstance(section, BaseModel) else section


class Limits(_Model):
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
    # While a call runs, the free space the host filesystems it writes (copy tree, overlay upper dir,
    # scratch, a rw workspace) keep; below it the call is killed with TOOL_FAILED (ENOSPC), see
    # sandbox.diskguard. Unset: 1 GiB or 5% of the filesystem, whichever is smaller.
    disk_reserve: PositiveSize | None = None
    # What one call may take of those filesystems (the drop of their free space while it runs; other
    # writers to the same disk count too, hence off unless set).
    disk_write: PositiveSize | None = None

    def in_force(self) -> dict[str, int | float | None]:
        """The limits a call runs under (``None``: not limited), as ``--json`` reports them."""
        host_side = {"kept_changes", "disk_reserve", "disk_write"}  # bounds the host keeps, not the jail's
        return self.model_dump(exclude={"capture_bytes", "live_stream_bytes", "live_total_bytes", *host_side})


class Timeouts(_Model):
    """Wall-clock seconds per call: ``default_s`` unless the caller asks for up to ``max_s``."""

    default_s: float = Field(60, ge=1, le=MAX_TIMEOUT_S)
    max_s: float = Field(3600, ge=1, le=MAX_TIMEOUT_S)
    kill_grace_s: float = Field(0.5, ge=0, le=10)


class Env(_Model):
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


class Docker(_Model):
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


class Bwrap(_Model):
    """The bubblewrap backend's settings.

    ``lifecycle``: ``session`` (the default) keeps one jail per session whose PID 1 is the agent
    of :mod:`sandbox._jailside.agent`: a call costs a fork in the jail, and what one call leaves in
    ``/tmp``, the jail's home or the workspace is there for the next (each call's processes
    still die with it). See :mod:`sandbox.backends.bwrap_warm`. ``call`` starts a fresh
    ``bwrap`` (namespaces, mounts) for every call: nothing of one call is seen by the next.
    ``sandbox run`` makes one call, so it always takes a fresh jail.
    """

    lifecycle: Lifecycle = "session"


class Winjob(_Model):
    """The Windows job-object backend's settings.

    ``shell``: what the Bash tool's command runs in. ``cmd`` (the default: on every Windows and
    under Wine, the fastest to start, ``/d`` keeps the registry's AutoRun out); ``powershell``
    (Windows PowerShell, no profile, non-interactive); ``bash`` (Git for Windows' bash, refused
    with SHELL_NOT_FOUND where it is not installed: never another shell in its place).
    """

    shell: Literal["cmd", "powershell", "bash"] = "cmd"


class Exemptions(_Model):
    """Seed 004's ``allowExceptions``: what runs without a model call once the classifier is on
    (``policy.classifier`` ``rules`` or ``auto``); with it off, the permission mode decides as before."""

    in_project_writes: bool = True  # Write, Edit (and Bash redirects) inside the workspace
    read_only_commands: bool = True  # ls, cat, git status … (the built-in exempt.read-only)
    declared_dependencies: bool = True  # npm ci, pip install -r requirements.txt, uv sync …
    read_only_web_fetch: bool = True  # a fetch tool's public http(s) URL; private addresses are judged


def _trusted_path(value: str) -> str:
    """A ``trusted.paths`` entry: a directory (``~/``, absolute, or relative to the workspace)."""
    text = value.strip()
    if not text or "\x00" in text:
        raise ValueError("a trusted path must name a directory")
    import posixpath

    home_as_root = "/~" + text[1:] if text.startswith("~") else text  # "~/.." names /home's level
    if posixpath.normpath(home_as_root) in ("/", "//", "/~"):
        raise ValueError(f"{value!r} would trust every write under / or a whole home; name a directory inside it")
    return text


class Trusted(_Model):
    """Seed 004's ``trusted`` (exempt from the classifier once it is on).

    ``paths``: writes (Write, Edit, a Bash redirect) whose canonical target lies in one of these
    directories (``~/`` at the home, a relative one in the workspace; each resolved through its
    symlinks, and the target too, so a link out of a trusted directory is judged where it lands).
    The sandbox state, protected paths and the deny layer still apply, and the jail persists writes
    only in the workspace and the scratch directory: a trusted directory elsewhere cannot be written.
    ``domains``: egress patterns (``host``, ``*.host``, ``host:port``, an address or a CIDR), a
    fetch tool's URL admitted by one is exempt, and the ``allowlist`` network mode allows them too
    (:func:`sandbox.network.egress.for_profile`). ``git_remotes``: a remote's name or URL; a plain
    push to one is exempt, a forced or deleting one is still judged.
    """

    paths: tuple[Annotated[str, AfterValidator(_trusted_path)], ...] = ()
    domains: tuple[EgressPattern, ...] = ()
    git_remotes: tuple[str, ...] = ()


class Policy(_Model):
    """Permission-layer settings; the policy package reads them (see sandbox/policy)."""

    mode: PermissionMode | None = None
    operating_mode: OperatingMode = "agent"
    unattended: Unattended = "deny"
    approval_timeout_s: float = Field(120, gt=0, le=3600)
    deny_read: tuple[str, ...] = ()
    deny_write: tuple[str, ...] = ()
    confirm_write: tuple[str, ...] = ()
    remove_rules: tuple[str, ...] = ()
    rules: tuple[dict[str, Any], ...] = ()
    # Seed 003 §6: a medium-risk plugin tool (low-risk network or metadata) in agent mode.
    medium_risk: MediumRisk = "confirm"
    # Seed 004's askTools: tools (built-in names or plugin tools' exposed names) always confirmed,
    # never covered by an allow-session grant nor by auto mode; a deny still wins.
    ask_tools: tuple[str, ...] = ()
    # Seed 000 §10's defaultProjectTrust: a project with a policy file and no stored decision.
    default_project_trust: ProjectTrust = "never"
    # Seed 004's classifier layer (sandbox.policy.classifier). None: the user's global setting
    # (``sandbox policy classifier``), else "off".
    classifier: ClassifierMode | None = None
    ask_on_block: bool = True  # a block is asked with the model's reason (False: refused silently)
    classifier_timeout_s: float = Field(30, gt=0, le=600)
    # The built-in client (CLI, MCP, a library session without a callable): an OpenAI-compatible
    # chat-completions endpoint, its model, and the environment variable holding its API key.
    classifier_endpoint: str | None = None
    classifier_model: str | None = None
    classifier_key_env: str | None = None
    exemptions: Exemptions = Exemptions()
    trusted: Trusted = Trusted()


class Profile(_Model):
    name: str = "custom"
    description: str = ""
    backend: BackendChoice = "auto"
    requires: tuple[Guarantee, ...] = ()
    mount: Mount = Mount()
    network: Network = Network()
    limits: Limits = Limits()
    timeouts: Timeouts = Timeouts()
    env: Env = Env()
    docker: Docker = Docker()
    bwrap: Bwrap = Bwrap()
    winjob: Winjob = Winjob()
    policy: Policy = Policy()
    source: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _fold_indexes(cls, data: Any) -> Any:
        return _with_indexes(data)

    @model_validator(mode="after")
    def _check(self) -> Profile:
        if self.timeouts.default_s > self.timeouts.max_s:
            raise ValueError("timeouts.default_s is larger than timeouts.max_s")
        return self

    def with_overrides(self, **changes: Any) -> Profile:
        """A copy with dotted-key overrides (``{"limits.memory": "2GiB"}``), validated again."""
        return self.override(changes)

    def override(self, changes: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> Profile:
        """``with_overrides`` where ``labels`` names who set a key (``{"limits.pids": "--pids"}``):
        errors in those values are blamed on the flag, not on the profile's file."""
        data = self.model_dump()
        for key, value in changes.items():
            if value is None:
                continue
            *parents, leaf = key.split(".")
            node = data
            for part in parents:
                node = node[part]
            node[leaf] = value
        given = {key: labels[key] for key in changes if labels and key in labels and changes[key] is not None}
        return _validate(data, self.source or "<overrides>", given)


# Which setting would silently void a required guarantee, and the values the guarantee allows
# there (none listed: any limit, but a limit).
_NEEDED: dict[Guarantee, tuple[str, tuple[str, ...]]] = {
    "net-none": ("network.mode", ("none",)),
    "net-confined": ("network.mode", ("none", "allowlist")),
    "memory-limit": ("limits.memory", ()),
    "pids-limit": ("limits.pids", ()),
    "cpu-limit": ("limits.cpu_time_s", ()),
    "fsize-limit": ("limits.file_size", ()),
    "tmp-size-limit": ("limits.tmp_size", ()),
}


# Where a flag asked for what the profile forbids, the profile that gives it (issue 32: a user of
# `untrusted` who needs a package index is told where one is allowed).
_WAY: dict[Guarantee, str] = {
    "net-none": ": to install packages or reach hosts, --profile untrusted-deps --allow-index pypi (npm, crates, "
    "go, NAME=URL) or --allow-host HOST",
}


def _setting(profile: Profile, key: str) -> Any:
    node: Any = profile
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _contradiction(profile: Profile) -> tuple[Guarantee, str] | None:
    """The first (guarantee, key) pair where the profile's own settings void what it requires."""
    for guarantee in profile.requires:
        if guarantee not in _NEEDED:
            continue
        key, needed = _NEEDED[guarantee]
        value = _setting(profile, key)
        if (value not in needed) if needed else value is None:
            return guarantee, key
    return None


def _refuse_contradiction(profile: Profile, source: str, labels: Mapping[str, str]) -> None:
    found = _contradiction(profile)
    if found is None:
        return
    guarantee, key = found
    value = _setting(profile, key)
    why = f"{guarantee} ({GUARANTEE_DESCRIPTIONS.get(guarantee, guarantee)}), which profile {profile.name!r} requires"
    if key in labels:
        message = f"{labels[key]} {value} contradicts {why}; choose a profile that does not require it"
        message += _WAY.get(guarantee, "")
    else:
        message = f"invalid profile {source}: {key} = {value!r} contradicts {why}"
    raise InvalidArgument(
        message, guarantee=guarantee, key=key, flag=labels.get(key), profile=profile.name, file=source
    )


def _problem(err: Any) -> str:
    msg = str(err["msg"])
    return msg.removeprefix("Value error, ")


def _flag(loc: tuple[int | str, ...], labels: Mapping[str, str]) -> str | None:
    """The flag that set an error's key; an item of a list is blamed on the flag that gave the list."""
    return labels.get(".".join(str(p) for p in loc if not isinstance(p, int)))


def _format_error(exc: ValidationError, source: str, labels: Mapping[str, str]) -> str:
    keyed, flagged = [], []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        flag = _flag(err["loc"], labels)
        if flag is not None:
            given = f", got {err['input']!r}" if isinstance(err.get("input"), int | float | str) else ""
            flagged.append(f"{flag}: {_problem(err)}{given} (sets {key})")
        else:
            keyed.append(f"{key}: {_problem(err)}")
    parts = ([f"invalid profile {source}: " + "; ".join(keyed)] if keyed else []) + flagged
    return "; ".join(parts)


def _validate(data: dict[str, Any], source: str, labels: Mapping[str, str] | None = None) -> Profile:
    labels = labels or {}
    try:
        profile = Profile.model_validate({**data, "source": source})
    except ValidationError as exc:
        errors = []
        for e in exc.errors():
            key, flag = ".".join(map(str, e["loc"])), _flag(e["loc"], labels)
            errors.append({"key": key, "problem": _problem(e), **({"flag": flag} if flag is not None else {})})
        raise InvalidArgument(_format_error(exc, source, labels), file=source, errors=errors) from exc
    _refuse_contradiction(profile, source, labels)
    return profile


def load_file(path: Path) -> Profile:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidArgument(f"cannot read profile {path}: {exc.strerror}", file=str(path)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"invalid profile {path}: {exc}", file=str(path)) from exc
    data.setdefault("name", path.stem)
    return _validate(data, str(path))


def available() -> dict[str, Path]:
    """The shipped profiles: package data (``sandbox/profiles``, a link to ``profiles/`` in a checkout)."""
    shipped = importlib.resources.files("sandbox") / "profiles"
    return {
        Path(p.name).stem: Path(str(p))
        for p in sorted(shipped.iterdir(), key=lambda e: e.name)
        if p.name.endswith(".toml")
    }


def load(name_or_path: str | None = None) -> Profile:
    """A shipped profile by name, or a TOML file by path; ``None`` is ``default``."""
    ref = name_or_path or "default"
    shipped = available()
    if ref in shipped:
        return load_file(shipped[ref])
    path = Path(ref)
    if path.suffix == ".toml" or path.exists():
        return load_file(path)
    raise InvalidArgument(f"unknown profile {ref!r}; shipped profiles: {', '.join(shipped) or 'none'}", profile=ref)
