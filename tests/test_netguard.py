"""The connect-time address guard of direct (non-proxy) connections: a host
NAME resolving to a forbidden address is refused when connecting, so DNS
cannot smuggle in what the URL check would have refused."""

from __future__ import annotations

import socket

import pytest

from crawld.config import CrawlConfig
from crawld.fetcher import fetch, make_session
from crawld.sitesrv import SiteServer, SyntheticSite


def _loopback_name() -> str:
    for name in ("localhost", "ip6-localhost"):
        try:
            if socket.getaddrinfo(name, 80, 0, socket.SOCK_STREAM):
                return name
        except socket.gaierror:
            continue
    pytest.fail("no host name resolves to loopback on this machine")


@pytest.mark.parametrize("allow", [False, True])
def test_names_resolving_to_loopback_obey_the_policy(allow):
    name = _loopback_name()
    with SiteServer(("127.0.0.1", 0), synthetic={name: SyntheticSite(pages=1)}) as srv:
        port = srv.server_address[1]
        cfg = CrawlConfig.from_dict({"crawl_id": "g", "allow_loopback": allow, "connect_timeout_s": 2,
                                     "read_timeout_s": 2, "fetch_deadline_s": 5})
        session = make_session(cfg, 2)
        session.trust_env = False  # no proxy from the environment: a direct connection
        res = fetch(session, f"http://{name}:{port}/", cfg)
        hits = srv.hits()
    if allow:
        assert res.status == 200 and len(hits) == 1
    else:
        assert res.status is None and res.error_kind == "blocked" and not res.retryable
        assert res.error.startswith("address_blocked:") and "loopback" in res.error
        assert hits == []
