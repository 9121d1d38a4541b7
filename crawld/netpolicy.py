"""Which network addresses a crawler may fetch from (SSRF protection).

Never fetched, whatever the config: link-local (169.254.0.0/16, fe80::/10,
where the cloud metadata services live: 169.254.169.254, fd00:ec2::254),
multicast, "this network" (0.0.0.0/8), reserved (240.0.0.0/4), broadcast,
Alibaba Cloud's 100.100.100.200 and the metadata host names of the big
clouds.  Loopback and private ranges (RFC 1918, RFC 4193 unique local,
RFC 6598 shared CGNAT space) only when the crawl's config allows them.

Two checks use these rules:

* :func:`check_host` on the host of every URL before it is fetched (IP
  literals, ``localhost`` and metadata names) — enough behind an HTTP
  proxy, which does the name resolution;
* :func:`guard_session` for direct connections: the address a host name
  resolves to is checked at connect time, so DNS rebinding cannot slip a
  forbidden address in after the URL check.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import NewConnectionError

from .errors import exception_chain

_NET = ipaddress.ip_network

#: never fetched (link-local holds the cloud metadata endpoints)
ALWAYS_BLOCKED = (
    (_NET("169.254.0.0/16"), "link-local"),
    (_NET("fe80::/10"), "link-local"),
    (_NET("fd00:ec2::254/128"), "cloud metadata"),
    (_NET("100.100.100.200/32"), "cloud metadata"),
    (_NET("224.0.0.0/4"), "multicast"),
    (_NET("ff00::/8"), "multicast"),
    (_NET("0.0.0.0/8"), "this-network"),
    (_NET("240.0.0.0/4"), "reserved"),
    (_NET("::/128"), "unspecified"),
)
LOOPBACK = (_NET("127.0.0.0/8"), _NET("::1/128"))
PRIVATE = (_NET("10.0.0.0/8"), _NET("172.16.0.0/12"), _NET("192.168.0.0/16"), _NET("fc00::/7"),
           _NET("100.64.0.0/10"))
#: host names of cloud metadata services
METADATA_NAMES = frozenset({"metadata.google.internal", "metadata.goog", "metadata", "instance-data",
                            "instance-data.ec2.internal"})


@dataclass(frozen=True)
class AddressPolicy:
    """What a crawl may reach: loopback and private ranges are opt-in."""

    allow_loopback: bool = False
    allow_private: bool = False

    def check_ip(self, ip: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
        """None if ``ip`` may be fetched, else why not (one line)."""
        addr = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if addr.version == 4 and addr == ipaddress.IPv4Address("255.255.255.255"):
            return f"{addr} is broadcast"
        for net, what in ALWAYS_BLOCKED:
            if addr.version == net.version and addr in net:
                return f"{addr} is {what} ({net})"
        for net in LOOPBACK:
            if addr.version == net.version and addr in net and not self.allow_loopback:
                return f"{addr} is loopback ({net}); allow_loopback is off"
        for net in PRIVATE:
            if addr.version == net.version and addr in net and not self.allow_private:
                return f"{addr} is private ({net}); allow_private_networks is off"
        return None

    def check_host(self, host: str) -> str | None:
        """None if a URL's host may be fetched as far as can be told without
        resolving it, else why not."""
        h = host.strip("[]").rstrip(".").lower()
        try:
            return self.check_ip(h)
        except ValueError:
            pass
        if h in METADATA_NAMES:
            return f"{h} is a cloud metadata host"
        if (h == "localhost" or h.endswith(".localhost")) and not self.allow_loopback:
            return f"{h} is loopback; allow_loopback is off"
        return None


class BlockedAddress(NewConnectionError):
    """A connection refused by the address policy (not retryable)."""


def is_blocked_address(exc: BaseException) -> BlockedAddress | None:
    """The :class:`BlockedAddress` behind a requests exception, if any."""
    for e in exception_chain(exc):
        if isinstance(e, BlockedAddress):
            return e
    return None


def _guarded_conn(base: type, policy: AddressPolicy) -> type:
    class Guarded(base):  # type: ignore[misc, valid-type]
        def _new_conn(self):
            try:
                infos = socket.getaddrinfo(self._dns_host, self.port, 0, socket.SOCK_STREAM)
            except socket.gaierror:
                return super()._new_conn()  # let urllib3 report the DNS failure
            reasons = [policy.check_ip(info[4][0]) for info in infos]
            allowed = [info[4][0] for info, r in zip(infos, reasons) if r is None]
            if not allowed:
                raise BlockedAddress(self, f"address_blocked: {self._dns_host} resolves to {reasons[0]}")
            name = self._dns_host
            last: Exception | None = None
            try:
                for addr in dict.fromkeys(allowed):  # each checked address in turn, as create_connection does
                    self._dns_host = addr  # Host and SNI keep the name
                    try:
                        return super()._new_conn()
                    except NewConnectionError as exc:
                        last = exc
            finally:
                self._dns_host = name
            assert last is not None
            raise last
    return Guarded


class _GuardedAdapter(HTTPAdapter):
    def __init__(self, policy: AddressPolicy, **kw):
        self._policy = policy
        super().__init__(**kw)

    def init_poolmanager(self, *args, **kw):
        super().init_poolmanager(*args, **kw)
        http_pool = type("GuardedHTTPPool", (HTTPConnectionPool,),
                         {"ConnectionCls": _guarded_conn(HTTPConnection, self._policy)})
        https_pool = type("GuardedHTTPSPool", (HTTPSConnectionPool,),
                          {"ConnectionCls": _guarded_conn(HTTPSConnection, self._policy)})
        self.poolmanager.pool_classes_by_scheme = {"http": http_pool, "https": https_pool}


def guard_session(session: requests.Session, policy: AddressPolicy, **adapter_kw) -> None:
    """Mount adapters on ``session`` whose direct connections obey
    ``policy``.  (Connections to a proxy are not checked: the operator chose
    the proxy, and the proxy resolves the names.)"""
    for scheme in ("http://", "https://"):
        session.mount(scheme, _GuardedAdapter(policy, **adapter_kw))
