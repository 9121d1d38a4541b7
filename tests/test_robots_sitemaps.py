"""robots.txt Crawl-delay and sitemaps, end to end against a real server."""

from __future__ import annotations

import gzip
import zlib

import pyarrow.parquet as pq

from conftest import crawlctl, summary_of
from crawld.ratecheck import max_in_window, rate_violations
from crawld.sitemaps import MAX_NESTING
from crawld.sitesrv import SiteServer, SyntheticSite
from hostile import HostileServer, html, page, respond, response, send


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


# -- text sitemaps, multi-member gzip, nested indexes (through the hostile server) --
MAZE = "www.sitemap-maze.com"
MAZE_LAST = 8  # the server's chain of nested indexes ends here (a 404 after)


def _index_of(*locs: str) -> bytes:
    items = "".join(f"<sitemap><loc>{loc}</loc></sitemap>" for loc in locs)
    return (f'<?xml version="1.0"?><sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            f"{items}</sitemapindex>").encode()


def _nested_index(conn, req):
    # /nest/N.xml lists /nest/N+1.xml, as a server inventing indexes forever does
    n = int(req.path.rsplit("/", 1)[1].split(".")[0])
    if n > MAZE_LAST:
        return send(conn, response(404, "gone", content_type="text/plain"))
    send(conn, response(200, _index_of(f"http://{MAZE}/nest/{n + 1}.xml"), content_type="application/xml"))


def test_text_multi_member_and_nested_sitemaps(tmp_path, redis_server, rds):
    """sitemaps.org text sitemaps (plain and .txt.gz) are read; a gzip file of
    several members is read to its end, a gzip bomb of several members only
    to MAX_UNCOMPRESSED in all; nested indexes stop at MAX_NESTING, the
    sitemap below recorded (skipped sitemap_too_deep), never requested."""
    site = f"http://{MAZE}"
    robots = "User-agent: *\n" + "".join(f"Sitemap: {site}{p}\n" for p in (
        "/maps/urls.txt", "/maps/more.txt.gz", "/maps/multi.xml.gz", "/maps/bomb.xml.gz", "/nest/0.xml"))
    multi = (gzip.compress(b'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">')
             + gzip.compress(f"<url><loc>{site}/m/1</loc></url>".encode())
             + gzip.compress(f"<url><loc>{site}/m/2</loc></url></urlset>".encode()))
    # a gzip bomb of several members, 60 MiB of spaces in all (~60 KB sent):
    # read up to MAX_UNCOMPRESSED in total, the URL after that never seen
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    spaces = c.compress(b" " * (20 << 20)) + c.flush()
    bomb = (gzip.compress(f'<urlset><url><loc>{site}/b/early</loc></url>'.encode()) + spaces * 3
            + gzip.compress(f"<url><loc>{site}/b/late</loc></url></urlset>".encode()))
    srv = HostileServer()
    srv.route(MAZE, "/maps/bomb.xml.gz", respond(200, bomb, content_type="application/gzip"))
    srv.route(MAZE, "/robots.txt", respond(200, robots, content_type="text/plain"))
    srv.route(MAZE, "/", page("maze", []))
    srv.route(MAZE, "/maps/urls.txt", respond(200, f"{site}/t/a\n\n{site}/t/b\r\n/not-absolute\n", content_type="text/plain"))
    srv.route(MAZE, "/maps/more.txt.gz", respond(200, gzip.compress(f"{site}/t/gz\n".encode()),
                                                 content_type="application/gzip"))
    srv.route(MAZE, "/maps/multi.xml.gz", respond(200, multi, content_type="application/gzip"))
    srv.route_prefix(MAZE, "/nest/", _nested_index)
    for prefix in ("/t/", "/m/", "/b/"):
        srv.route_prefix(MAZE, prefix, lambda conn, req: send(conn, response(200, html(req.path, []))))
    with srv:
        summary_of(crawlctl("run", f"{site}/", "--crawl-id", "maze", "--shards", "2", "--sitemaps",
                            "--max-rps-per-host", "50", "--proxy", srv.url, "--redis-url", redis_server.url,
                            "--out", str(tmp_path), "--json", env={"NO_PROXY": "", "no_proxy": ""}))
    rows = {r["canonical_url"]: r for r in pq.read_table(next(tmp_path.rglob("maze.parquet"))).to_pylist()}
    fetched = {u for u, r in rows.items() if r["outcome"] == "fetched" and r["status"] == 200}
    none = {"outcome": None, "error": None, "outlinks": None, "depth": None, "referrer": None}
    row = lambda path: rows.get(f"{site}{path}", none)  # noqa: E731
    problems = []

    def expect(what: str, ok: bool) -> None:
        if not ok:
            problems.append(what)
    # text sitemaps, plain and gzip: their URLs were fetched
    expect("text sitemap URLs fetched", {f"{site}/t/a", f"{site}/t/b", f"{site}/t/gz"} <= fetched)
    expect("text sitemap row", row("/maps/urls.txt")["outlinks"] == [f"{site}/t/a", f"{site}/t/b"]
           and row("/maps/urls.txt")["error"] == "sitemap: 1 line not an absolute http(s) URL")
    expect(".txt.gz row", row("/maps/more.txt.gz")["outlinks"] == [f"{site}/t/gz"]
           and row("/maps/more.txt.gz")["error"] is None)
    # every member of the multi-member gzip file
    expect("multi-member row", row("/maps/multi.xml.gz")["outlinks"] == [f"{site}/m/1", f"{site}/m/2"]
           and row("/maps/multi.xml.gz")["error"] is None)
    expect("multi-member URLs fetched", {f"{site}/m/1", f"{site}/m/2"} <= fetched)
    expect("gzip bomb cut", row("/maps/bomb.xml.gz")["outlinks"] == [f"{site}/b/early"]
           and (row("/maps/bomb.xml.gz")["error"] or "").startswith("sitemap: cut short: over 52428800 bytes")
           and f"{site}/b/early" in fetched and f"{site}/b/late" not in rows)
    # nested indexes: levels 0..MAX_NESTING fetched once each, the next one
    # recorded without a request, none deeper
    for n in range(MAX_NESTING + 1):
        expect(f"index at level {n} fetched", (row(f"/nest/{n}.xml")["outcome"], row(f"/nest/{n}.xml")["depth"])
               == ("fetched", n) and srv.count(MAZE, f"/nest/{n}.xml") == 1)
    deep = row(f"/nest/{MAX_NESTING + 1}.xml")
    expect("index below MAX_NESTING recorded", (deep["outcome"], deep["error"], deep["depth"], deep["referrer"])
           == ("skipped", "sitemap_too_deep", MAX_NESTING + 1, f"{site}/nest/{MAX_NESTING}.xml"))
    expect("no request below MAX_NESTING",
           not any(hit.path.startswith(f"/nest/{MAX_NESTING + 1}") for hit in srv.hits()))
    expect("no row deeper", f"{site}/nest/{MAX_NESTING + 2}.xml" not in rows)
    expect("server behaviours ran cleanly", not srv.errors)
    assert not problems, problems


def test_a_robots_txt_cut_at_500_kib_is_known_as_cut_and_read_to_its_last_line(rds):
    from crawld.config import CrawlConfig
    from crawld.fetcher import fetch, make_session
    from crawld.robots import MAX_ROBOTS_BYTES, RobotsCache, RobotsFetch, RobotsRecord

    host = "www.big-robots.org"
    body = b"User-agent: *\nDisallow: /tmp\n" + b"# padding\n" * (MAX_ROBOTS_BYTES // 10) + b"Disallow: /private\n"
    cfg = CrawlConfig.from_dict({"crawl_id": "t", "seeds": [f"http://{host}/"]})
    cuts = []
    with SiteServer(("127.0.0.1", 0), files={(host, "/robots.txt"): (200, body, "text/plain")}) as srv:
        session = make_session(cfg, 1, proxy=srv.url)

        def fetch_body(origin, via=()):
            res = fetch(session, origin + "/robots.txt", cfg, max_bytes=MAX_ROBOTS_BYTES)
            return RobotsFetch(res.status, res.body.decode("utf-8", errors="replace"), res.error, res.error_kind,
                               cut=res.truncated)
        cache = RobotsCache(rds, lambda o: "robots-test", "crawld", 3600, 60, fetch_body,
                            lambda o: "robots-lock:" + o, on_cut=lambda o, got: cuts.append(o))
        pol, fetched = cache.fetch(f"http://{host}")
        session.close()
    assert fetched and pol.cut and cuts == [f"http://{host}"]
    # the rules before the cut apply, the line after it is gone
    assert not pol.allowed(f"http://{host}/tmp/x") and pol.allowed(f"http://{host}/private")
    stored = RobotsRecord.from_json(rds.hget("robots-test", f"http://{host}"))
    assert stored.cut and len(stored.body.encode()) == MAX_ROBOTS_BYTES
    cache._local.clear()
    assert cache.cached(f"http://{host}").cut


def test_a_robots_txt_that_origins_redirect_to_is_fetched_once(tmp_path, redis_server):
    """The bare domain's robots.txt redirects to www's, which answers slowly:
    both origins' fetches are under way at once, yet www's file is requested
    once (the redirect waits for www's own fetch), and a loop between two
    origins ends at once as "unavailable" (allow)."""
    from hostile import HostileServer, page, redirect, respond

    bare, www = "robots-once.com", "www.robots-once.com"
    a, b = "loop-a.robots-once.org", "loop-b.robots-once.org"

    def slow_rules(conn, req):
        req.sleep(1.0)
        respond(200, "User-agent: *\nDisallow: /private\n", content_type="text/plain")(conn, req)

    srv = HostileServer()
    srv.route(bare, "/robots.txt", redirect(f"http://{www}/robots.txt", 301))
    srv.route(bare, "/", page("bare", ["/private/x"]))
    srv.route(www, "/robots.txt", slow_rules)
    srv.route(www, "/", page("www", ["/private/y"]))
    srv.route(a, "/robots.txt", redirect(f"http://{b}/robots.txt", 301))
    srv.route(b, "/robots.txt", redirect(f"http://{a}/robots.txt", 301))
    srv.route(a, "/", page("a", []))
    srv.route(b, "/", page("b", []))
    with srv:
        summary = summary_of(crawlctl("run", f"http://{bare}/", f"http://{www}/", f"http://{a}/", f"http://{b}/",
                                      "--allow-domain", "robots-once.org", "--crawl-id", "once", "--shards", "2",
                                      "--max-rps-per-host", "20", "--proxy", srv.url, "--redis-url", redis_server.url,
                                      "--out", str(tmp_path), "--json"))
        assert srv.count(www, "/robots.txt") == 1
        assert srv.count(bare, "/robots.txt") == 1
        # the loop: each origin's robots.txt asked for once, then allow
        assert srv.count(a, "/robots.txt") + srv.count(b, "/robots.txt") <= 3
        assert not srv.saw(bare, "/private/x") and not srv.saw(www, "/private/y")
    rows = {r["url"]: r for r in pq.read_table(summary["artifact"]).to_pylist()}
    assert rows[f"http://{a}/"]["status"] == 200 and rows[f"http://{b}/"]["status"] == 200
    assert rows[f"http://{bare}/private/x"]["error"] == "robots_disallowed"
