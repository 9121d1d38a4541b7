"""Politeness measured on the server's side.

A synthetic web of six registered domains, each with two host names that
link to each other and across domains, crawled by several worker processes
at ``max_rps_per_host=4``.  From the server's own timestamps, per registered
domain: no 1 s sliding window holds more than ceil(R)+1 requests and no 10 s
window more than 10R+ceil(R)+1 (DESIGN.md promise 2).
"""

from __future__ import annotations

from conftest import summary_of
from sitegraph import group_hits

from crawld.ratecheck import rate_violations

from crawld.sharding import politeness_key, shard_of
from crawld.sitesrv import SiteServer, SyntheticSite

RPS = 4.0
DOMAINS = [f"d{i}-polite.com" for i in range(6)]
HOSTS = [f"{sub}.{d}" for d in DOMAINS for sub in ("www", "blog")]


def test_no_registered_domain_exceeds_its_rate(tmp_path, redis_server, rds, run_crawlctl):
    synthetic = {h: SyntheticSite(pages=14, peers=[p for p in HOSTS if p != h], extra_links=2) for h in HOSTS}
    with SiteServer(("127.0.0.1", 0), synthetic=synthetic) as srv:
        proc = run_crawlctl("run", *(f"http://{h}/" for h in HOSTS[:2]), *(f"--allow-domain={d}" for d in DOMAINS),
                            "--crawl-id", "polite", "--shards", "3", "--workers", "8",
                            "--max-rps-per-host", str(RPS), "--max-inflight-per-host", "4",
                            "--proxy", srv.url, "--redis-url", redis_server.url, "--out", str(tmp_path), "--json")
        hits = srv.hits()
    summary = summary_of(proc)
    expected = len(HOSTS) * (14 + 1)
    assert summary["rows"] == expected
    # every page once, plus one robots.txt per host; robots.txt requests are
    # charged against the rate like any other
    assert len(hits) == expected + len(HOSTS)
    assert sum(1 for h in hits if h.path == "/robots.txt") == len(HOSTS)
    by_domain = group_hits(hits, politeness_key)
    assert set(by_domain) == set(DOMAINS)
    # the shards really were shared: domains live on more than one shard
    assert len({shard_of(d, 3) for d in DOMAINS}) > 1
    bad = rate_violations(by_domain, RPS)
    assert not bad, f"rate exceeded (max in 1 s, max in 10 s) per domain: {bad}"
    # and the limiter is not idle: each domain ran near its rate
    for d, ts in by_domain.items():
        span = max(ts) - min(ts)
        assert span >= (len(ts) - 1) / RPS * 0.95 - 0.05, f"{d}: {len(ts)} requests in {span:.2f}s"


def test_window_checker_flags_bursts_and_passes_even_spacing():
    even = [i / RPS for i in range(40)]
    assert rate_violations({"a": even}, RPS) == {}
    burst = even[:8] + [even[8] + 0.001 * k for k in range(3)] + even[9:]
    assert "a" in rate_violations({"a": burst}, RPS)
