"""robots.txt Crawl-delay and sitemaps, end to end against a real server."""

from __future__ import annotations

import gzip

import pyarrow.parquet as pq

from conftest import crawlctl, summary_of
from crawld.ratecheck import max_in_window, rate_violations
from crawld.sitesrv import SiteServer, SyntheticSite


def _crawl(srv, tmp_path, redis_server, crawl_id, *seeds, extra=()):
    return summary_of(crawlctl("run", *seeds, "--crawl-id", crawl_id, "--shards", "2",
                               "--proxy", srv.url, "--redis-url", redis_server.url, "--out", str(tmp_path),
                               "--json", *extra))


def test_crawl_delay_slows_a_host_below_the_crawl_rate(tmp_path, redis_server, rds):
    files = {("www.slowpoke.org", "/robots.txt"): (200, b"User-agent: *\nCrawl-delay: 0.5\n", "text/plain")}
    synthetic = {"www.slowpoke.org": SyntheticSite(pages=6), "www.speedy.org": SyntheticSite(pages=6)}
    with SiteServer(("127.0.0.1", 0), synthetic=synthetic, files=files) as srv:
        summary = _crawl(srv, tmp_path, redis_server, "delay", "http://www.slowpoke.org/", "http://www.speedy.org/",
                         extra=("--max-rps-per-host", "20"))
        hits = srv.hits()
    assert summary["rows"] == 14
    slow = sorted(h.t for h in hits if h.host == "www.slowpoke.org")
    fast = sorted(h.t for h in hits if h.host == "www.speedy.org")
    # 2 requests/s, not 20, by the promise's own definition: crawld.ratecheck's
    # 1 s and 10 s windows (not single gaps, which the way of each request
    # to the server may shorten on a loaded machine)
    assert len(slow) == 8 and rate_violations({"slowpoke.org": slow}, 2.0) == {}, slow
    assert max_in_window(fast, 1.0) > 3  # the other host kept the crawl's rate


def test_crawl_delay_never_speeds_a_host_up(tmp_path, redis_server, rds):
    files = {("www.eager.org", "/robots.txt"): (200, b"User-agent: *\nCrawl-delay: 0.01\n", "text/plain")}
    with SiteServer(("127.0.0.1", 0), synthetic={"www.eager.org": SyntheticSite(pages=5)}, files=files) as srv:
        _crawl(srv, tmp_path, redis_server, "nofaster", "http://www.eager.org/", extra=("--max-rps-per-host", "4"))
        ts = sorted(h.t for h in srv.hits())
    # the crawl's 4 requests/s held (crawld.ratecheck's 1 s and 10 s windows,
    # the promise's definition), not Crawl-delay's 100/s: 7 requests (robots.txt
    # and 6 pages) take at least 1.5 s
    assert len(ts) == 7 and rate_violations({"eager.org": ts}, 4.0) == {}
    assert ts[-1] - ts[0] >= 1.4


def _urlset(host: str, paths: list[str]) -> bytes:
    urls = "".join(f"<url><loc>http://{host}{p}</loc></url>" for p in paths)
    return f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'.encode()


def test_sitemaps_from_robots_and_sitemap_xml_are_seeded(tmp_path, redis_server, rds):
    host = "www.mapped-site.com"
    index = (f'<?xml version="1.0"?><sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
             f"<sitemap><loc>http://{host}/sm-pages.xml.gz</loc></sitemap></sitemapindex>").encode()
    files = {
        (host, "/robots.txt"): (200, f"User-agent: *\nSitemap: http://{host}/sm-index.xml\n".encode(), "text/plain"),
        (host, "/sm-index.xml"): (200, index, "application/xml"),
        (host, "/sm-pages.xml.gz"): (200, gzip.compress(_urlset(host, ["/orphan-a.html", "/p/3.html"])
                                                        + b""), "application/gzip"),
        (host, "/sitemap.xml"): (200, _urlset(host, ["/orphan-b.html"]) .replace(
            b"</urlset>", f"<url><loc>http://elsewhere.example.net/x</loc></url></urlset>".encode()),
            "application/xml"),
        (host, "/orphan-a.html"): (200, b"<title>A</title>", "text/html"),
        (host, "/orphan-b.html"): (200, b"<title>B</title>", "text/html"),
    }
    with SiteServer(("127.0.0.1", 0), synthetic={host: SyntheticSite(pages=2, extra_links=0)}, files=files) as srv:
        _crawl(srv, tmp_path, redis_server, "maps", f"http://{host}/", extra=("--sitemaps", "--max-rps-per-host", "50"))
        paths = {h.path for h in srv.hits()}
    art = next(tmp_path.rglob("maps.parquet"))
    rows = {r["url"]: r for r in pq.read_table(art).to_pylist()}
    # orphans reachable only through the sitemaps were fetched
    assert {"/orphan-a.html", "/orphan-b.html", "/sm-index.xml", "/sm-pages.xml.gz", "/sitemap.xml"} <= paths
    assert rows[f"http://{host}/orphan-a.html"]["title"] == "A"
    index_row = rows[f"http://{host}/sm-index.xml"]
    assert index_row["outcome"] == "fetched" and index_row["outlinks"] == [f"http://{host}/sm-pages.xml.gz"]
    # a sitemap URL outside the crawl's scope is recorded, not fetched
    assert rows["http://elsewhere.example.net/x"]["outcome"] == "skipped"
    assert rows["http://elsewhere.example.net/x"]["error"] == "out_of_scope"


def test_without_the_setting_sitemaps_are_not_fetched(tmp_path, redis_server, rds):
    host = "www.unmapped-site.com"
    files = {(host, "/robots.txt"): (200, f"Sitemap: http://{host}/sm.xml\n".encode(), "text/plain"),
             (host, "/sm.xml"): (200, _urlset(host, ["/hidden.html"]), "application/xml")}
    with SiteServer(("127.0.0.1", 0), synthetic={host: SyntheticSite(pages=2)}, files=files) as srv:
        _crawl(srv, tmp_path, redis_server, "nomaps", f"http://{host}/")
        paths = {h.path for h in srv.hits()}
    assert "/sm.xml" not in paths and "/sitemap.xml" not in paths and "/hidden.html" not in paths
