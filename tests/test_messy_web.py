"""Exactly polite on a messy many-site web, with no extra flags (DESIGN.md
promises 2 and 4): bare domains redirect to ``www.`` (robots.txt too, and
through chains of redirects), robots.txt forbids part of each site, one site
answers 429 above 1 request/s.  Measured on the server's side, from its own
log: no registered domain above 2 requests/s in any 1 s or 10 s window
(crawld.ratecheck, the promise's definition), robots.txt fetched once per
host, nothing forbidden fetched, every reachable page fetched once with 200,
and the crawl not much slower than the lower bound no polite crawler can
beat (see tests/messyweb.py and bench/messy_web.py for the big version)."""

from __future__ import annotations

from collections import Counter

import pyarrow.parquet as pq

from conftest import summary_of
from sitegraph import group_hits

import messyweb
from crawld.ratecheck import rate_violations
from crawld.sharding import politeness_key
from crawld.sitesrv import SiteServer

RPS = 2.0


def test_a_many_site_crawl_is_exactly_polite_and_complete(tmp_path, redis_server, run_crawlctl):
    web = messyweb.build(30, pages=10)
    with SiteServer(("127.0.0.1", 0), **web.server_kwargs()) as srv:
        summary = summary_of(run_crawlctl("run", *web.seeds, "--crawl-id", "messy", "--shards", "4",
                                          "--max-rps-per-host", str(RPS), "--proxy", srv.url,
                                          "--redis-url", redis_server.url, "--out", str(tmp_path), "--json"))
        hits = srv.hits()
    by_domain = group_hits(hits, politeness_key)
    assert set(by_domain) == set(web.domains)
    # promise 2, as the server logs it
    assert rate_violations(by_domain, RPS) == {}
    # robots.txt once per host (the bare host's answer is www's: no second fetch)
    robots = Counter(h.host for h in hits if h.path == "/robots.txt")
    assert robots and max(robots.values()) == 1, robots.most_common(3)
    # nothing robots.txt forbids, no page twice
    for h in hits:
        if h.path.startswith("/private/"):
            assert not web.has_robots(politeness_key(h.host)), h
    pages = Counter((h.host, h.path) for h in hits if h.status == 200 and not h.path.startswith("/robots"))
    assert max(pages.values()) == 1, pages.most_common(3)
    # every reachable page fetched, 200 in the artifact
    assert set(pages) == web.expected_pages()
    rows = pq.read_table(summary["artifact"], columns=["url", "status", "outcome", "error"]).to_pylist()
    fetched = {r["url"] for r in rows if r["status"] == 200}
    assert {f"http://{h}{p}" for h, p in web.expected_pages()} <= fetched
    blocked = [r for r in rows if r["outcome"] == "blocked"]
    assert blocked and all(r["error"] == "robots_disallowed" for r in blocked)
    # the 429 site: every page, with few 429s (the rate adapted: crawld.politeness)
    limited = [h for h in hits if politeness_key(h.host) == web.limited]
    n429 = sum(1 for h in limited if h.status == 429)
    assert n429 <= 3, [(round(h.t - limited[0].t, 2), h.path, h.status) for h in limited]
    # and near the lower bound (the slowest domain's requests at its rate)
    span = max(h.t for h in hits) - min(h.t for h in hits)
    assert web.lower_bound(RPS) / span >= 0.85, (web.lower_bound(RPS), span)
