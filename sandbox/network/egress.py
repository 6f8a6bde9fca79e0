"""A jail's egress under ``network.mode = "allowlist"``: the proxy it reaches, how it reaches it.

The jail keeps its empty network namespace. :class:`Egress` runs the filtering proxy
(:class:`~sandbox.network.proxy.EgressProxy`) on a thread of its own, listening on a unix
socket in a directory of its own (``0700``, the user's: no other local user reaches the proxy;
:meth:`Egress.admit` opens it to a container's command user and no one else) that the backend
binds into the jail at :data:`JAIL_DIR`. Each
command of the jail is started beside the jail-side forwarder (:mod:`sandbox._jailside.netfwd`),
which listens on the jail's loopback at :data:`PORT` and relays to that socket; the proxy
variables point there. A tool that ignores them finds no route: nothing gets out another way.

Every refused connection is a :class:`~sandbox.network.denial.Denial`, kept in order, so a call
can say which were its own (:meth:`Egress.mark`, :meth:`Egress.denials_since`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox import _jailside
from sandbox.errors import BackendUnavailable, InvalidArgument, map_errors
from sandbox.network import netns
from sandbox.network.places import JAIL_DIR, NO_PROXY, PORT, SOCKET
from sandbox.network.policy import allowlist

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from sandbox.network.broker import Broker
    from sandbox.network.denial import Denial
    from sandbox.network.proxy import EgressProxy, ProxyThread
    from sandbox.profile import Profile
    from sandbox.profile_tables import Network, Secret
    from sandbox.vocabulary import Answer

log = logging.getLogger(__name__)

FORWARDER_COPY = "pass"
"""How the forwarder moves a connection: ``pass`` hands it to the proxy (one relay, the proxy's);
``splice`` relays it itself (two relays). ``bench/bench_network.py --forwarder`` compares them."""


@cache
def _forwarder() -> str:
    return _jailside.program("netfwd")


def proxy_env(port: int = PORT) -> dict[str, str]:
    """The variables that lead HTTP clients, pip, git, npm and curl to the forwarder (or, for a jail
    with no network namespace, to the proxy's own loopback ``port``).

    The proxy tells protocols apart by their first byte, so one port serves HTTP, CONNECT and
    SOCKS5 (``socks5h``: names are resolved by the proxy, never in the jail).
    """
    http = f"http://127.0.0.1:{port}"
    env = {"http_proxy": http, "https_proxy": http, "all_proxy": f"socks5h://127.0.0.1:{port}", "no_proxy": NO_PROXY}
    return {**env, **{name.upper(): value for name, value in env.items()}}


def for_profile(profile: Profile) -> Network:
    """The profile's network section with the trusted domains, the secrets' hosts, the request
    rules' hosts and the user's own list (:mod:`~sandbox.network.userlist`) merged into ``allow``
    (and that list's ``deny`` into ``deny``): what the egress proxy enforces and what a result reports."""
    from sandbox.network.userlist import UserNetwork

    network = profile.network
    brokered = [p for secret in profile.secrets.values() for p in secret.hosts]
    brokered += [p for rule in network.requests for p in rule.hosts]
    user = UserNetwork().load() if network.mode == "allowlist" else {"allow": (), "deny": ()}
    merged = allowlist(network.allow, (*profile.policy.trusted.domains, *brokered, *user["allow"]))
    denied = tuple(dict.fromkeys((*network.deny, *user["deny"])))
    if merged == network.allow and denied == network.deny:
        return network
    return network.model_copy(update={"allow": merged, "deny": denied})


def trust_env(paths: dict[str, Path]) -> dict[str, str]:
    """The variables that make the jail's tools trust the session's CA (its files at :data:`JAIL_DIR`):
    OpenSSL and Go (``SSL_CERT_FILE``), curl, requests, pip, boto, Node (``NODE_EXTRA_CA_CERTS``, which
    adds to Node's own roots) and Java (a trust store of its own, through ``JAVA_TOOL_OPTIONS``)."""
    from sandbox.network.ca import JAVA_STORE_PASSWORD

    bundle, ca, java = (f"{JAIL_DIR}/{paths[role].name}" for role in ("bundle", "ca", "java"))
    env = dict.fromkeys(("SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "AWS_CA_BUNDLE"), bundle)
    env["NODE_EXTRA_CA_CERTS"] = ca
    env["JAVA_TOOL_OPTIONS"] = (
        f"-Djavax.net.ssl.trustStore={java} -Djavax.net.ssl.trustStoreType=PKCS12"
        f" -Djavax.net.ssl.trustStorePassword={JAVA_STORE_PASSWORD}"
    )
    return env


class Egress:
    """The proxy of one jail: :meth:`start` it, :meth:`wrap` each command, :meth:`close` it."""

    def __init__(self, network: Network) -> None:
        self.network = network
        self.broker: Broker | None = None
        self._env: dict[str, str] = proxy_env()
        self.socket_dir: Path | None = None
        self.listeners: list[Callable[[Denial], None]] = []  # told of each denial, on a worker thread
        self._thread: ProxyThread | None = None
        self._ports: netns.Ports | None = None
        self.tcp_port: int | None = None  # where a jail with no network namespace reaches the proxy
        # How the jail's forwarder moves a connection (FORWARDER_COPY): a jail whose sockets are not
        # the host's (gVisor's Sentry) cannot hand one to the proxy, and relays it ("plain") instead.
        self.forwarder_copy = FORWARDER_COPY
        # A jail whose relay to the proxy listens at PORT for its whole life (the microVM's,
        # sandbox._jailside.vmnet): its commands need no forwarder beside them.
        self.resident = False

    @classmethod
    def start(
        cls,
        network: Network,
        ask_timeout: float = 130.0,
        secrets: Mapping[str, Secret] | None = None,
        *,
        tcp: bool = False,
    ) -> Egress:
        """Start the proxy for ``network`` (its ``allow``, ``deny``, ``ask`` and request rules) and
        ``secrets`` (the profile's), or raise BACKEND_UNAVAILABLE when it cannot listen (and
        INVALID_ARGUMENT when a secret cannot be read). ``ask_timeout``: the proxy's own bound on a
        question to the approver (:meth:`ask_with`), which should outlast the approver's.

        ``tcp``: also listen on a port of this host's loopback, for a jail that shares the host's
        network and may connect to that port only (Landlock's): it then needs no forwarder."""
        from sandbox.network.broker import Broker
        from sandbox.network.policy import EgressPolicy
        from sandbox.network.proxy import EgressProxy
        from sandbox.network.resolve import CachedResolver, resolver_from_env
        from sandbox.network.upstream import upstream_from_env

        egress = cls(network)
        egress.broker = Broker.build(secrets or {}, network.requests)
        with map_errors("cannot start the egress proxy", BackendUnavailable):
            # A short path of its own: a unix socket's path must fit in 108 bytes, and a container
            # binds the directory, so nothing else may be in it.
            # mkdtemp makes it 0700 and ours, and the socket is bound inside it: no moment when another
            # user could connect (a bind then a chmod of the socket itself would leave one).
            egress.socket_dir = Path(tempfile.mkdtemp(prefix="sbx-net-"))
            try:
                policy = EgressPolicy.from_patterns(network.allow, network.deny, ask=network.ask)
                resolver = CachedResolver(resolver_from_env())
                where = (netns.HOST_IP, 0) if network.transparent else None
                proxy = EgressProxy(
                    policy,
                    unix_path=egress.socket_dir / SOCKET,
                    resolver=resolver,
                    upstream=upstream_from_env(),
                    on_denial=egress._denied,
                    ask_timeout=ask_timeout,
                    transparent_http=where,
                    transparent_tls=where,
                    broker=egress.broker,
                    tcp=("127.0.0.1", 0) if tcp else None,
                )
                if egress.broker is not None:
                    egress._brokered(egress.broker, egress.socket_dir)
                egress._thread = proxy.serve_in_thread()
                if tcp and (bound := proxy.tcp_address) is not None:
                    egress.tcp_port = bound[1]
                    egress._env.update(proxy_env(bound[1]))
                if network.transparent:
                    egress._start_transparent(egress._thread, proxy)
            except BaseException:
                egress.close()
                raise
        return egress

    def _brokered(self, broker: Broker, folder: Path) -> None:
        """The session CA's files beside the socket (what the jail trusts), and the jail's variables."""
        from sandbox.network.broker import TRUST_ENV
        from sandbox.network.secrets import jail_env

        extra = os.environ.get(TRUST_ENV, "").strip()
        with map_errors(f"cannot read {TRUST_ENV}", InvalidArgument):
            more = Path(extra).read_bytes() if extra else b""
        trust = broker.ca.trust_files(folder, more)
        self._env = {
            **proxy_env(),
            **trust_env(trust),
            **jail_env(broker.secrets, f"{JAIL_DIR}/{trust['bundle'].name}"),
        }

    def reconfigure(self, network: Network, secrets: Mapping[str, Secret]) -> None:
        """Change the allowlist, the request rules and the secrets from the next connection on
        (between calls: a connection open keeps what it was opened under). A secret unchanged keeps
        its placeholder; the session CA's files are rewritten where the jail reads them."""
        from sandbox.network.broker import Broker
        from sandbox.network.policy import EgressPolicy

        if self._thread is None or self.socket_dir is None:
            raise BackendUnavailable("the jail's egress proxy has stopped; open a new jail (session)")
        policy = EgressPolicy.from_patterns(network.allow, network.deny, ask=network.ask)
        broker = Broker.build(secrets, network.requests, keep=self.broker)
        proxy = self._thread.proxy
        proxy.dialer.policy = policy
        proxy.rebroker(broker)
        self.network, self.broker = network, broker
        if broker is not None:
            self._brokered(broker, self.socket_dir)
        else:
            self._env = proxy_env()

    @contextlib.contextmanager
    def narrowed(self, patterns: Sequence[str] | None) -> Iterator[None]:
        """While the block runs, connections must also be allowed by ``patterns`` (a call's own,
        narrower allowlist: it can take away, never add); ``None``: no narrowing."""
        if patterns is None or self._thread is None:
            yield
            return
        from sandbox.network.policy import EgressPolicy

        narrower = EgressPolicy.from_patterns(patterns, ())
        dialer = self._thread.proxy.dialer
        dialer.narrowed.append(narrower)
        try:
            yield
        finally:
            dialer.narrowed.remove(narrower)

    def on_grant(self, listener: Callable[[str, int], None]) -> None:
        """Tell ``listener`` of each destination an approver allowed for the session (on the proxy's thread)."""
        if self._thread is not None:
            self._thread.proxy.dialer.on_grant = listener

    def env(self) -> dict[str, str]:
        """The variables of each command that goes out through the proxy: the proxy's, and with a
        broker the CA's and the secrets' placeholders (never a value)."""
        return dict(self._env)

    def _start_transparent(self, thread: ProxyThread, proxy: EgressProxy) -> None:
        """The filtering DNS server beside the proxy (its loop, its policy, its denials), and the
        ports the jail's rules send TCP 80, 443 and DNS to."""
        from sandbox.network.dnsfilter import FilteringDns

        problem = netns.available()
        if problem is not None:
            raise BackendUnavailable(f"no transparent network here: {problem}")
        dns = thread.run_beside(FilteringDns.beside(proxy, bind=(netns.HOST_IP, 0)))
        http, tls, resolver = proxy.transparent_http_address, proxy.transparent_tls_address, dns.address
        assert http is not None and tls is not None and resolver is not None  # all asked for and running
        self._ports = netns.Ports(http=http[1], tls=tls[1], dns=resolver[1])

    def admit(self, uid: int, gid: int) -> None:
        """Let a jail whose commands run as ``uid:gid`` (a container's user) reach the proxy's socket.

        Our own uid needs nothing. As root, the directory and the socket stay root's and get the
        jail's group, ``0710`` and ``0660``: that group's members, and no one else, can connect
        (the jail's uid cannot replace the socket). An ordinary user cannot give a file to another
        group: the directory is then opened to everyone (``0711``, the socket ``0666``), logged.
        """
        folder = self.socket_dir
        if folder is None or uid == os.geteuid():
            return
        sock = folder / SOCKET
        if os.geteuid() == 0:
            os.chown(folder, -1, gid)
            os.chown(sock, -1, gid)
            folder.chmod(0o710)
            sock.chmod(0o660)
            return
        log.warning("the egress proxy's socket is open to every local user: the jail runs as %d, not as us", uid)
        folder.chmod(0o711)
        sock.chmod(0o666)

    @property
    def transparent(self) -> bool:
        return self.network.transparent

    def attach(self, pid: int) -> None:
        """A transparent jail's call (or container), held before its command runs: its way out."""
        if self._ports is None or not self.alive:
            raise BackendUnavailable("the jail's transparent network is not running")
        netns.attach(pid, self._ports)

    @property
    def denials(self) -> list[Denial]:
        return self._thread.denials if self._thread is not None else []

    def mark(self) -> int:
        """Where the denials stand now: :meth:`denials_since` gives those after it."""
        return len(self.denials)

    def denials_since(self, mark: int) -> list[Denial]:
        return list(self.denials[mark:])

    def wrap(self, argv: Sequence[str], python: str) -> list[str]:
        """``argv`` started beside the forwarder, which is listening before the command runs.

        ``python`` is the jail's interpreter by its absolute path (:attr:`Jail.python
        <sandbox.backends.base.Jail.python>`): by name, the jail's PATH would find the workspace's
        ``.venv/bin/python3`` first. A jail that reaches the proxy's loopback port itself
        (:attr:`tcp_port`), or keeps a relay of its own listening at :data:`PORT` (:attr:`resident`),
        runs ``argv`` as it is."""
        if self.tcp_port is not None or self.resident:
            return list(argv)
        listen = [f"127.0.0.1:{PORT}", f"[::1]:{PORT}"]
        return [
            python,
            "-I",
            "-S",
            "-c",
            _forwarder(),
            *(arg for address in listen for arg in ("--listen", address)),
            "--to",
            f"{JAIL_DIR}/{SOCKET}",
            "--copy",
            self.forwarder_copy,
            "--",
            *argv,
        ]

    def summary(self, denials: Sequence[Denial]) -> dict[str, Any]:
        """The ``network`` of a result: the mode, the allow list and these denials."""
        return summary(self.network, denials)

    async def _denied(self, denial: Denial) -> None:
        import anyio.to_thread  # here: bwrap's argv reads this module's paths on the quick path

        for listener in list(self.listeners):
            try:
                await anyio.to_thread.run_sync(listener, denial)
            except Exception:  # a listener's failure must not break the proxy's refusal
                log.exception("a network denial listener failed")

    def ask_with(self, approver: Callable[[str, int], Answer]) -> None:
        """Put destinations no rule names (``ask = true``) to ``approver``, a blocking callable
        run on a worker thread of the proxy; without one, they are refused (``ask-unavailable``)."""
        if self._thread is None:
            return
        import anyio.to_thread

        async def ask(host: str, port: int) -> Answer:
            return await anyio.to_thread.run_sync(approver, host, port, abandon_on_cancel=True)

        self._thread.proxy.approver = ask

    @property
    def alive(self) -> bool:
        return self._thread is not None

    def stop(self) -> None:
        """Stop the proxy: every relay ends, and a connection from the jail is refused; idempotent."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.close()  # the DNS server beside it too

    def close(self) -> None:
        """Stop the proxy and remove its socket directory; idempotent."""
        try:
            self.stop()
        finally:
            folder, self.socket_dir = self.socket_dir, None
            if folder is not None:
                with contextlib.suppress(OSError):
                    shutil.rmtree(folder)


def summary(network: Network, denials: Sequence[Denial] = ()) -> dict[str, Any]:
    """``{mode, allow, deny, ask, denials: [{host, port, reason, rule, message, line}]}`` for a result
    (``line``: the one line a model reads)."""
    return {
        "mode": network.mode,
        "allow": list(network.allow),
        "deny": list(network.deny),
        "ask": network.ask,
        "denials": [
            {
                "host": d.host,
                "port": d.port,
                "reason": d.reason,
                "rule": d.rule,
                "message": d.message,
                **({"method": d.method, "path": d.path} if d.method is not None else {}),
                "line": d.line(),
            }
            for d in denials
        ],
    }
