"""Secrets brokered at the egress proxy: the jail holds a placeholder, the proxy the value.

A profile's ``[secrets.NAME]`` (:class:`~sandbox.profile_tables.Secret`) is read on the host when a
session's proxy starts (:func:`read_value`: an environment variable, a file, the keyring) and
never leaves the proxy's process: the jail gets a random placeholder of the session in its
environment and, for git, a credential helper (or an extra header) that hands the placeholder out
(:meth:`Brokered.jail_env`). The proxy, which terminates TLS for the secret's hosts
(:mod:`~sandbox.network.broker`), puts the value in place of the placeholder only in a request
to one of those hosts and only in the declared position.

A value is kept as ``bytes`` of the proxy's memory and appears in no message, log or denial;
:meth:`Brokered.masks` are the forms of it the proxy wrote into requests, which it masks in the
responses of the hosts that received them.
"""

from __future__ import annotations

import base64
import os
import secrets as random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.errors import InvalidArgument
from sandbox.network.policy import EgressPolicy

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sandbox.profile_tables import Secret

PLACEHOLDER_PREFIX = "SBX_PLACEHOLDER_"
"""Every placeholder starts so: random, per session, in the characters any header or variable takes."""
MAX_VALUE = 16 * 1024
"""A secret's value past this is refused when read (a token or a key, not a file's contents)."""
MIN_VALUE = 8
"""A secret's value shorter than this is refused: responses are masked wherever it appears."""


def read_value(name: str, source: str, environ: Mapping[str, str] | None = None) -> str:
    """The value ``source`` names (``env:VAR``, ``file:PATH``, ``keyring:SERVICE/USER``), stripped of
    its line end; INVALID_ARGUMENT naming the secret (never the value) when it cannot be read."""
    kind, _, where = source.partition(":")
    if kind == "env":
        value = (os.environ if environ is None else environ).get(where)
        if value is None:
            raise InvalidArgument(f"secret {name}: the variable {where} is not set where the session opens")
    elif kind == "file":
        try:
            value = Path(where).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidArgument(f"secret {name}: cannot read {where}: {exc}") from None
    elif kind == "keyring":
        value = _keyring(name, where)
    else:
        raise InvalidArgument(f"secret {name}: unknown source {kind!r} (env:, file: or keyring:)")
    value = value.rstrip("\r\n")
    if not value:
        raise InvalidArgument(f"secret {name}: {source} is empty")
    if len(value) > MAX_VALUE or any(c in value for c in "\r\n\0"):
        raise InvalidArgument(f"secret {name}: {source} is not a one-line credential")
    if len(value) < MIN_VALUE:
        raise InvalidArgument(
            f"secret {name}: {source} is shorter than {MIN_VALUE} characters: too short to be a credential,"
            " and responses are searched for it (a short value would match by chance)"
        )
    return value


def _keyring(name: str, where: str) -> str:
    service, _, user = where.partition("/")
    try:
        import keyring  # type: ignore[import-not-found,unused-ignore]  # optional: the user's own keyring
    except ImportError:
        raise InvalidArgument(
            f"secret {name}: keyring:{where} needs the 'keyring' package beside the sandbox (pip install keyring)"
        ) from None
    try:
        value = keyring.get_password(service, user)
    except Exception as exc:  # every backend raises its own
        raise InvalidArgument(f"secret {name}: the keyring failed: {exc}") from None
    if value is None:
        raise InvalidArgument(f"secret {name}: the keyring holds nothing for {service}/{user}")
    return str(value)


def placeholder() -> str:
    return PLACEHOLDER_PREFIX + random.token_hex(16)


@dataclass(frozen=True)
class Brokered:
    """One secret of a session: its spec, its value (never shown) and its placeholder."""

    name: str
    spec: Secret
    value: str = field(repr=False)
    placeholder: str
    hosts: EgressPolicy = field(repr=False)

    @classmethod
    def read(cls, name: str, spec: Secret, environ: Mapping[str, str] | None = None) -> Brokered:
        hosts = EgressPolicy.from_patterns(spec.hosts, ())
        return cls(name, spec, read_value(name, spec.from_, environ), placeholder(), hosts)

    @property
    def kind(self) -> str:
        return self.spec.as_

    @property
    def variable(self) -> str:
        return self.spec.env or self.name

    def serves(self, host: str, port: int) -> bool:
        """Whether the value may go to ``host:port`` (the secret's ``hosts``, in the allowlist's syntax)."""
        return self.hosts.decide(host, port).allowed is True

    def masks(self, username: str | None = None) -> list[bytes]:
        """The forms of the value a request to the secret's hosts carried, to mask in their responses."""
        forms = [self.value.encode()]
        if username is not None:
            forms.append(base64.b64encode(f"{username}:{self.value}".encode()))
        return forms

    def jail_env(self) -> dict[str, str]:
        """What the jail sees: the placeholder in its variable (and the key id of a signing secret)."""
        env = {self.variable: self.placeholder}
        if self.kind == "aws-sigv4" and self.spec.access_key_id is not None:
            env["AWS_ACCESS_KEY_ID"] = self.spec.access_key_id
        return env


def jail_env(brokered: list[Brokered], ca_bundle: str | None) -> dict[str, str]:
    """The jail's variables for these secrets: placeholders, git's credentials for each secret's
    hosts (a helper answering the placeholder for ``basic``, an extra header for ``bearer``), and
    git's trust in the session's CA."""
    env: dict[str, str] = {}
    config: list[tuple[str, str]] = []
    for secret in brokered:
        env.update(secret.jail_env())
        for host in _git_hosts(secret):
            if secret.kind == "basic":
                helper = (
                    f"!f() {{ test \"$1\" = get && printf 'username=%s\\npassword=%s\\n'"
                    f" '{secret.spec.username}' '{secret.placeholder}'; }}; f"
                )
                config += [(f"credential.https://{host}.helper", ""), (f"credential.https://{host}.helper", helper)]
            elif secret.kind == "bearer":
                config.append((f"http.https://{host}/.extraHeader", f"Authorization: Bearer {secret.placeholder}"))
    if ca_bundle is not None:
        config.append(("http.sslCAInfo", ca_bundle))
    if config:
        env["GIT_CONFIG_COUNT"] = str(len(config))
        for index, (key, value) in enumerate(config):
            env[f"GIT_CONFIG_KEY_{index}"], env[f"GIT_CONFIG_VALUE_{index}"] = key, value
    return env


def _git_hosts(secret: Brokered) -> list[str]:
    """The literal hosts of a secret, as git's URL-scoped config names them (``*.x`` has no such form)."""
    hosts = []
    for pattern in secret.spec.hosts:
        if "*" in pattern or "/" in pattern:
            continue
        hosts.append(pattern.rsplit(":", 1)[0] if pattern.count(":") == 1 and pattern.endswith(":443") else pattern)
    return hosts


def check_unique(brokered: list[Brokered]) -> None:
    """Two secrets may not claim one variable (the jail could hold only one placeholder)."""
    seen: dict[str, str] = {}
    for secret in brokered:
        other = seen.setdefault(secret.variable, secret.name)
        if other != secret.name:
            raise InvalidArgument(f"secrets {other} and {secret.name} both set the jail's variable {secret.variable}")
