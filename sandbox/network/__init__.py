"""Network egress by allowlist (``network.mode = "allowlist"``).

- :mod:`~sandbox.network.policy` -- :class:`EgressPolicy`: destinations judged by name and by
  address (the DNS-rebinding defence).
- :mod:`~sandbox.network.resolve` -- name resolution the proxy does itself (the system's, or a
  DNS server named by ``SANDBOX_NET_RESOLVER``).
- :mod:`~sandbox.network.proxy` -- :class:`EgressProxy`: HTTP CONNECT, plain HTTP and SOCKS5 on a
  unix socket, no TLS interception; its listeners, caps and life (:class:`ProxyThread` on a thread
  of its own). Below it, one concept each:

  - :mod:`~sandbox.network.clients` -- the client protocols, told apart by the first byte;
    :mod:`~sandbox.network.http` (requests judged one by one), :mod:`~sandbox.network.socks`,
    :mod:`~sandbox.network.tls` (a ClientHello's SNI);
  - :mod:`~sandbox.network.transparent` -- connections a jail's DNAT redirected (transparent mode);
  - :mod:`~sandbox.network.dial` -- a destination judged (policy, approver, addresses) and connected
    to; :mod:`~sandbox.network.upstream` when the host goes out through a proxy of its own;
  - :mod:`~sandbox.network.conn` -- a connection while it is set up; :mod:`~sandbox.network.relay`
    -- its bytes once it is;
  - :mod:`~sandbox.network.denial` -- every refusal a :class:`Denial`, every connection a
    :class:`Connected`;
  - :mod:`~sandbox.network.service` -- the :class:`Service` life and listening sockets the proxy
    and the filtering DNS server share.
- :mod:`~sandbox.network.dnsfilter` -- the filtering DNS server of transparent mode.
- :mod:`~sandbox.network.netns` -- the jail's network namespace in transparent mode.
- :mod:`~sandbox.network.egress` -- one jail's proxy and how its commands reach it.
- :mod:`~sandbox.network.indexes` -- package indexes by name (``--allow-index pypi``).
- :mod:`~sandbox.network.hint` -- the line that says a jail without network made an install fail.

Nothing is imported here: a profile's validation reads only the policy module.
"""
