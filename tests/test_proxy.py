"""Proxy support: ``--proxy``, ``CRAWLD_PROXY`` or the standard HTTP_PROXY
variable route every request through the proxy (absolute-form targets)."""

from __future__ import annotations

import pytest

from conftest import crawlctl, summary_of
from crawld.sitesrv import SiteServer, SyntheticSite


@pytest.mark.parametrize("how", ["flag", "CRAWLD_PROXY", "HTTP_PROXY", "http_proxy"])
def test_requests_go_through_the_proxy(how, tmp_path, redis_server, rds):
    with SiteServer(("127.0.0.1", 0), synthetic={"www.proxied-site.com": SyntheticSite(pages=5)}) as srv:
        args = ["run", "http://www.proxied-site.com/", "--crawl-id", f"px-{how.lower()}", "--shards", "1",
                "--max-rps-per-host", "100", "--redis-url", redis_server.url, "--out", str(tmp_path), "--json"]
        env = {"NO_PROXY": "", "no_proxy": ""}
        if how == "flag":
            args += ["--proxy", srv.url]
        else:
            env[how] = srv.url
        summary = summary_of(crawlctl(*args, env=env))
        hits = srv.hits()
    assert summary["rows"] == 6 and summary["statuses"] == {"2xx": 6}
    assert {h.host for h in hits} == {"www.proxied-site.com"} and len(hits) == 6 + 1  # + robots.txt
