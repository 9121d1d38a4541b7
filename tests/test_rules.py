"""Tables for the pure politeness and safety rules: robots.txt states,
host outcomes and retries, Retry-After, the address policy, robots
directives, link modes, traps and sitemap parsing."""

from __future__ import annotations

import gzip
import random
import time
import zlib
from email.utils import formatdate

import pytest

from crawld.config import CrawlConfig
from crawld.fetcher import FetchResult, parse_retry_after
from crawld.links import LinkPlanner, origin_of, robots_directives
from crawld.netpolicy import AddressPolicy
from crawld.outcomes import DEFER, RECORD, RETRY, disposition, host_report
from crawld.robots import ALLOW_ALL, RULES, UNREACHABLE, RobotsPolicy, RobotsRecord, agent_token, classify
from crawld.scope import Router, trap_reason, variant_key
from crawld.sitemaps import MAX_GZIP_MEMBERS, MAX_NESTING, MAX_UNCOMPRESSED, MAX_URLS, parse_sitemap

CFG = CrawlConfig.from_dict({"crawl_id": "t", "seeds": ["http://www.example.com/"], "max_depth": 2,
                             "max_retry_after_s": 60, "max_attempts": 3})


@pytest.mark.parametrize("status,kind,state", [
    (200, None, RULES), (204, None, RULES), (301, None, ALLOW_ALL), (404, None, ALLOW_ALL),
    (401, None, ALLOW_ALL), (403, None, ALLOW_ALL), (429, None, ALLOW_ALL), (500, None, UNREACHABLE),
    (503, None, UNREACHABLE), (None, "timeout", UNREACHABLE), (None, "connect", UNREACHABLE),
    (None, "deadline", UNREACHABLE), (None, "redirects", ALLOW_ALL),
])
def test_robots_state_follows_rfc_9309(status, kind, state):
    assert classify(status, kind) == state


def test_robots_policy_rules_delay_and_sitemaps():
    body = ("User-agent: *\nDisallow: /private\nCrawl-delay: 3\nSitemap: http://x.com/sm.xml\n\n"
            "User-agent: crawld\nDisallow: /no-crawld\nRequest-rate: 1/10\n")
    pol = RobotsPolicy(RobotsRecord(time.time(), 200, body), "crawld")
    assert pol.allowed("http://x.com/private/x")  # the crawld group wins over *
    assert not pol.allowed("http://x.com/no-crawld")
    assert pol.crawl_delay_s == 10.0  # from Request-rate 1/10
    assert pol.sitemaps == ["http://x.com/sm.xml"]
    other = RobotsPolicy(RobotsRecord(time.time(), 200, body), "otherbot")
    assert not other.allowed("http://x.com/private/x") and other.crawl_delay_s == 3.0


def test_robots_policy_unreachable_allows_nothing_and_expires_sooner():
    now = time.time()
    down = RobotsPolicy(RobotsRecord(now - 100, 503), "crawld")
    assert not down.allowed("http://x.com/") and down.state == UNREACHABLE
    assert not down.fresh(now, ttl_s=86400, retry_s=60) and down.fresh(now, ttl_s=86400, retry_s=600)
    gone = RobotsPolicy(RobotsRecord(now - 100, 404), "crawld")
    assert gone.allowed("http://x.com/anything") and gone.fresh(now, 86400, 60)


def test_garbage_robots_txt_is_an_empty_rule_set():
    pol = RobotsPolicy(RobotsRecord(time.time(), 200, "\x00\xff<html>not robots</html>\n" * 100), "crawld")
    assert pol.state == RULES and pol.allowed("http://x.com/a")


@pytest.mark.parametrize("ua,token", [("crawld/0.1.0", "crawld"), ("crawld/0.1 (+https://ops.example)", "crawld"),
                                      ("MyAuditBot", "MyAuditBot"), ("  ", "*")])
def test_agent_token(ua, token):
    assert agent_token(ua) == token


def _res(status=None, kind=None, headers=None, retryable=False, truncated=False, unsent=False):
    return FetchResult(url="http://x.com/", started_at=0.0, status=status, headers=headers or {},
                       error=f"{kind}: x" if kind else None, error_kind=kind, retryable=retryable,
                       truncated=truncated, unsent=unsent)


@pytest.mark.parametrize("res,code", [
    (_res(200), "o"), (_res(404), "o"), (_res(301), "o"), (_res(500), "f"), (_res(502), "f"),
    # 429 and 503 mean "slower", not "broken" (RFC 6585 section 4, RFC 9110 section 15.6.4)
    (_res(429), "a"), (_res(503), "a"), (_res(429, headers={"retry-after": "5"}), "r"),
    (_res(503, headers={"retry-after": "7"}), "r"), (_res(503, headers={"retry-after": "9999"}), "p"),
    (_res(503, headers={"retry-after": "soon"}), "a"), (_res(kind="connect", retryable=True), "f"),
    (_res(kind="timeout", retryable=True), "f"), (_res(kind="invalid_url"), None), (_res(kind="blocked"), None),
])
def test_host_report(res, code):
    rep = host_report("x.com", res, CFG, random.Random(1))
    assert (rep.code if rep else None) == code
    if code in ("r", "p"):
        assert rep.value == float(res.headers["retry-after"])
    if code == "f":
        assert 0 <= rep.value < 1


REFUSED = _res(kind="connect", retryable=True, unsent=True)   # the request never left
RESET = _res(kind="connect", retryable=True)                  # it left, the answer did not come


@pytest.mark.parametrize("res,attempts,deferrals,action", [
    # 429 and 503 put the URL back without spending an attempt...
    (_res(503), 1, 0, DEFER), (_res(503), 3, 0, DEFER), (_res(429), 3, 10, DEFER),
    # ... up to max_deferrals times; then they count as attempts
    (_res(429), 1, 50, RETRY), (_res(429), 3, 50, RECORD),
    # a connection that could not be made carried no request: deferred too
    (REFUSED, 3, 0, DEFER), (REFUSED, 3, 50, RECORD),
    # other failures worth another try spend an attempt
    (RESET, 1, 0, RETRY), (RESET, 3, 0, RECORD), (_res(500), 2, 0, RETRY), (_res(500), 3, 0, RECORD),
    (_res(kind="timeout", retryable=True), 1, 0, RETRY),
    # final answers are recorded
    (_res(404), 1, 0, RECORD), (_res(200), 1, 0, RECORD), (_res(kind="invalid_url"), 1, 0, RECORD),
])
def test_disposition(res, attempts, deferrals, action):
    assert disposition(res, attempts, deferrals, CFG) == action


def test_retry_after_seconds_and_http_date():
    now = time.time()
    assert parse_retry_after("120") == 120.0
    assert abs(parse_retry_after(formatdate(now + 30, usegmt=True), now) - 30) <= 1
    assert parse_retry_after(formatdate(now - 30, usegmt=True), now) == 0.0
    assert parse_retry_after("next tuesday") is None and parse_retry_after(None) is None
    assert parse_retry_after("-5") is None


@pytest.mark.parametrize("ip,loop,priv,blocked", [
    ("169.254.169.254", True, True, "link-local"), ("169.254.0.1", True, True, "link-local"),
    ("fe80::1", True, True, "link-local"), ("fd00:ec2::254", True, True, "metadata"),
    ("100.100.100.200", True, True, "metadata"), ("224.0.0.1", True, True, "multicast"),
    ("ff02::1", True, True, "multicast"), ("0.0.0.0", True, True, "this-network"),
    ("255.255.255.255", True, True, "broadcast"), ("::ffff:169.254.169.254", True, True, "link-local"),
    ("127.0.0.1", False, True, "loopback"), ("::1", False, True, "loopback"), ("127.0.0.1", True, False, None),
    ("10.1.2.3", True, False, "private"), ("192.168.1.1", True, False, "private"), ("172.16.5.4", True, False, "private"),
    ("fd12:3456::1", True, False, "private"), ("100.64.0.1", True, False, "private"), ("10.1.2.3", False, True, None),
    ("93.184.216.34", False, False, None), ("2606:4700::1111", False, False, None),
])
def test_address_policy(ip, loop, priv, blocked):
    reason = AddressPolicy(loop, priv).check_ip(ip)
    assert (reason is None) == (blocked is None), reason
    if blocked:
        assert blocked in reason


@pytest.mark.parametrize("host,blocked", [
    ("metadata.google.internal", True), ("localhost", True), ("api.localhost", True), ("[::1]", True),
    ("www.example.com", False), ("169.254.169.254", True),
])
def test_address_policy_on_hosts(host, blocked):
    assert (AddressPolicy().check_host(host) is not None) is blocked


@pytest.mark.parametrize("meta,xrt,expect", [
    ("noindex, nofollow", None, {"noindex", "nofollow"}), ("NOFOLLOW", None, {"nofollow"}),
    (None, "nofollow", {"nofollow"}), (None, "none", {"none", "noindex", "nofollow"}),
    (None, "googlebot: nofollow", set()), (None, "crawld: noindex", {"noindex"}),
    ("all", "noarchive", {"all", "noarchive"}),
])
def test_robots_directives(meta, xrt, expect):
    assert robots_directives(meta, xrt, "crawld") == expect


# X-Robots-Tag, one list item per header line as received, for the agent
# "crawld".  Google Search Central ("Using the X-Robots-Tag HTTP header"):
# a line "may optionally specify a user agent before the rules"; "rules
# specified without a user agent are valid for all crawlers"; MDN's
# X-Robots-Tag reference: a <bot-name>: applies to the rules after it, so
# one line may scope rules to several agents in turn.
XRT_LINES = [
    # an unscoped line applies whether it comes before or after scoped ones
    (["otherbot: noindex", "nofollow"], {"nofollow"}),
    (["nofollow", "otherbot: noindex"], {"nofollow"}),
    (["otherbot: noindex", "crawld: nofollow"], {"nofollow"}),
    # one line: the agent scopes every rule after it up to the next agent
    (["otherbot: noindex, nofollow"], set()),
    (["googlebot: noindex, otherbot: nofollow"], set()),
    (["googlebot: noindex, crawld: nofollow"], {"nofollow"}),
    (["crawld: noindex, otherbot: nofollow"], {"noindex"}),
    (["noindex, otherbot: nofollow"], {"noindex"}),
    (["BadBot: noindex, nofollow, crawld: nofollow"], {"nofollow"}),
    # names are case-insensitive; * is every agent
    (["CRAWLD: NoFollow"], {"nofollow"}),
    (["*: noindex"], {"noindex"}),
    # valued rules are not user agents, and an RFC 822 date keeps its comma
    (["max-snippet: 20, nofollow"], {"max-snippet: 20", "nofollow"}),
    (["max-image-preview:large"], {"max-image-preview: large"}),
    (["unavailable_after: Wed, 03 Dec 2025 13:09:53 GMT, nofollow"],
     {"unavailable_after: wed, 03 dec 2025 13:09:53 gmt", "nofollow"}),
    (["otherbot: unavailable_after: 25 Jun 2010 15:00:00 PST", "noarchive"], {"noarchive"}),
    (["crawld: max-video-preview: -1"], {"max-video-preview: -1"}),
    # each line starts unscoped
    (["crawld: noindex", "otherbot: nofollow"], {"noindex"}),
    (["otherbot: noindex", "noarchive, crawld: none"], {"noarchive", "none", "noindex", "nofollow"}),
    ([], set()), ([""], set()), (["crawld:"], set()),
]


@pytest.mark.parametrize("lines,expect", XRT_LINES, ids=[" | ".join(map(repr, c[0])) or "no-line" for c in XRT_LINES])
def test_x_robots_tag_lines(lines, expect):
    assert robots_directives(None, lines, "crawld") == expect


def test_link_modes_in_priority_order():
    blocked = {"http://www.example.com": False}
    planner = LinkPlanner(CFG, Router(CFG), lambda origin, url: blocked.get(origin) if "/private" in url else None)
    assert planner.mode("http://other.org/x", 1) == "out_of_scope"
    assert planner.mode("http://www.example.com/deep", 3) == "over_depth"
    assert planner.mode("http://www.example.com/x", 1, nofollow=True) == "nofollow"
    assert planner.mode("http://www.example.com/" + "a/" * 5, 1) == "path_loop"
    assert planner.mode("http://www.example.com/" + "x" * 3000, 1) == "url_too_long"
    assert planner.mode("http://www.example.com/private/x", 1) == "robots_disallowed"
    assert planner.mode("http://blog.example.com/x", 2) == ""


def test_sitemaps_nest_to_a_fixed_level():
    planner = LinkPlanner(CFG, Router(CFG), lambda o, u: None)

    def mode(url, level):
        return planner.plan(url, url, level, "http://www.example.com/robots.txt", kind="sitemap")[2].mode
    assert [mode(f"http://www.example.com/sm/{n}.xml", n) for n in range(MAX_NESTING + 3)] == \
        [""] * (MAX_NESTING + 1) + ["sitemap_too_deep"] * 2
    assert mode("http://other.org/sm.xml", 0) == "out_of_scope"
    assert mode("http://other.org/sm.xml", MAX_NESTING + 1) == "out_of_scope"


def test_pages_links_and_dedup_keys():
    planner = LinkPlanner(CFG, Router(CFG), lambda o, u: None)
    outlinks, pushes = planner.page_links(
        "http://www.example.com/a/", "http://www.example.com/a/",
        ["b.html", "b.html#x", "mailto:x@y.z", "javascript:void(0)", "//cdn.other.net/lib.js", "../c?q=1&utm_source=z",
         "http://www.example.com/nf"], {"http://www.example.com/nf"}, depth=0, nofollow_all=False)
    assert outlinks == ["http://www.example.com/a/b.html", "http://cdn.other.net/lib.js",
                        "http://www.example.com/c?q=1", "http://www.example.com/nf"]
    modes = {item.payload.decode().split('"c":"')[1].split('"')[0]: item.mode for _, _, item in pushes}
    assert modes == {"http://www.example.com/a/b.html": "", "http://cdn.other.net/lib.js": "out_of_scope",
                     "http://www.example.com/c?q=1": "", "http://www.example.com/nf": "nofollow"}
    vkeys = {item.vkey for _, _, item in pushes if item.mode == ""}
    assert vkeys == {"", "www.example.com/c"}
    planner.remember(key for _, key, _ in pushes)
    _, again = planner.page_links("http://www.example.com/a/", "http://www.example.com/a/", ["b.html"], set(), 0, False)
    assert again == []


def test_traps_and_variant_keys():
    assert trap_reason("http://x.com/a/b/c/d", 2048, 3) is None
    assert trap_reason("http://x.com/a/a/a/a", 2048, 3) == "path_loop"
    assert trap_reason("http://x.com/cal?d=" + "1" * 100, 64, 3) == "url_too_long"
    assert variant_key("http://x.com/cal?d=1") == "x.com/cal" and variant_key("http://x.com/cal") == ""
    assert origin_of("https://x.com:8443/a/b?c") == "https://x.com:8443"


def _urlset(n: int) -> bytes:
    locs = "".join(f"<url><loc>http://x.com/{i}</loc></url>" for i in range(n))
    return f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{locs}</urlset>'.encode()


def test_sitemap_parsing():
    sm = parse_sitemap(_urlset(3))
    assert sm.kind == "urlset" and sm.locs == ["http://x.com/0", "http://x.com/1", "http://x.com/2"]
    idx = parse_sitemap(b"<sitemapindex><sitemap><loc> http://x.com/a.xml </loc></sitemap></sitemapindex>")
    assert idx.kind == "sitemapindex" and idx.locs == ["http://x.com/a.xml"]
    assert parse_sitemap(gzip.compress(_urlset(2))).locs == ["http://x.com/0", "http://x.com/1"]
    assert parse_sitemap(b"<html><body>not a sitemap</body></html>").kind is None
    assert parse_sitemap(b"\x1f\x8bgarbage").error.startswith("bad gzip")
    cut = parse_sitemap(_urlset(5)[:-40])
    assert cut.kind == "urlset" and cut.error and len(cut.locs) >= 3


def test_sitemap_limits_and_bombs():
    assert len(parse_sitemap(_urlset(MAX_URLS + 10)).locs) == MAX_URLS
    # a gzip bomb decompresses to at most MAX_UNCOMPRESSED bytes
    bomb = zlib.compressobj(9, zlib.DEFLATED, 31)
    data = bomb.compress(b"<urlset>" + b" " * (MAX_UNCOMPRESSED * 4)) + bomb.flush()
    assert len(data) < 1_000_000
    res = parse_sitemap(data)
    assert res.kind == "urlset" and res.locs == []
    laughs = (b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
              + b"".join(b'<!ENTITY lol%d "%s">' % (i, b"&lol%d;" % (i - 1) * 10 if i > 1 else b"&lol;" * 10)
                         for i in range(1, 10))
              + b']><urlset><url><loc>&lol9;</loc></url></urlset>')
    res = parse_sitemap(laughs)
    assert res.locs == [] and res.error


# text sitemaps (sitemaps.org, "Text file"): UTF-8, one fully specified URL a
# line, possibly gzip-compressed: (body, kind, locs, error substring or None)
TEXT_SITEMAPS = [
    (b"http://x.com/a\nhttp://x.com/b\n", "text", ["http://x.com/a", "http://x.com/b"], None),
    (b"https://x.com/a\r\nHTTP://x.com/B\r\n", "text", ["https://x.com/a", "HTTP://x.com/B"], None),
    (b"\xef\xbb\xbf  http://x.com/bom\n\n\n  http://x.com/spaced  \n", "text",
     ["http://x.com/bom", "http://x.com/spaced"], None),
    (b"http://x.com/last-line-without-newline", "text", ["http://x.com/last-line-without-newline"], None),
    ("http://x.com/caf\u00e9\n".encode(), "text", ["http://x.com/caf\u00e9"], None),
    (b"http://x.com/a\n/relative\nftp://x.com/f\nnot a url\n", "text", ["http://x.com/a"],
     "3 lines not an absolute http(s) URL"),
    (b"Not Found", "text", [], "1 line not an absolute http(s) URL"),
    (gzip.compress(b"http://x.com/gz\n", mtime=0), "text", ["http://x.com/gz"], None),
    (b"", None, [], "empty"), (b" \n\t", None, [], "empty"),
    # XML is told apart by its first character
    (b"\n\n  " + _urlset(1), "urlset", ["http://x.com/0"], None),
    (b"\xef\xbb\xbf" + _urlset(1), "urlset", ["http://x.com/0"], None),
]


@pytest.mark.parametrize("body,kind,locs,error", TEXT_SITEMAPS, ids=[f"{i}-{c[1]}" for i, c in enumerate(TEXT_SITEMAPS)])
def test_text_sitemaps(body, kind, locs, error):
    sm = parse_sitemap(body)
    assert (sm.kind, sm.locs) == (kind, locs)
    assert (sm.error is None) if error is None else (error in (sm.error or ""))


def test_text_sitemap_limits():
    many = b"".join(b"http://x.com/%d\n" % i for i in range(MAX_URLS + 10))
    assert len(parse_sitemap(many).locs) == MAX_URLS
    # cut at MAX_UNCOMPRESSED: the last line, maybe part of a URL, is left out
    bomb = zlib.compressobj(9, zlib.DEFLATED, 31)
    line = b"http://x.com/" + b"p" * 100 + b"\n"
    data = bomb.compress(line * (MAX_UNCOMPRESSED // len(line) + 100)) + bomb.flush()
    sm = parse_sitemap(data)
    assert sm.kind == "text" and len(sm.locs) == min(MAX_URLS, MAX_UNCOMPRESSED // len(line))
    assert all(u == line.strip().decode() for u in sm.locs)


def _members(*parts: bytes) -> bytes:
    return b"".join(gzip.compress(p) for p in parts)


def test_multi_member_gzip_is_read_to_the_end():
    # RFC 1952 section 2.2: a gzip file is a series of members (cat a.gz b.gz)
    xml = _members(b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">',
                   b"<url><loc>http://x.com/1</loc></url>", b"", b"<url><loc>http://x.com/2</loc></url></urlset>")
    assert parse_sitemap(xml).locs == ["http://x.com/1", "http://x.com/2"]
    assert parse_sitemap(xml).error is None
    text = _members(b"http://x.com/a\n", b"http://x.com/b\n")
    assert parse_sitemap(text).locs == ["http://x.com/a", "http://x.com/b"]
    # trailing bytes that start no member are ignored; a broken later member
    # or a file ending inside a member keeps what came before
    assert parse_sitemap(text + b"\0" * 8).locs == ["http://x.com/a", "http://x.com/b"]
    assert parse_sitemap(text + b"\x1f\x8b not gzip").locs == ["http://x.com/a", "http://x.com/b"]
    assert parse_sitemap(text + gzip.compress(b"http://x.com/c\n")[:-8]).locs[:2] == ["http://x.com/a", "http://x.com/b"]


def test_multi_member_gzip_bomb_is_bounded_in_total():
    # members of 20 MiB of spaces each (~20 KiB on the wire): the bound holds
    # over their sum, so the URL in the member past MAX_UNCOMPRESSED is never read
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    spaces = c.compress(b" " * (20 << 20)) + c.flush()
    data = (gzip.compress(b"<urlset><url><loc>http://x.com/early</loc></url>") + spaces
            + gzip.compress(b"<url><loc>http://x.com/within</loc></url>") + spaces + spaces
            + gzip.compress(b"<url><loc>http://x.com/beyond</loc></url></urlset>"))
    assert len(data) < 200_000
    sm = parse_sitemap(data)
    assert sm.kind == "urlset" and sm.locs == ["http://x.com/early", "http://x.com/within"]
    assert "over 52428800 bytes" in sm.error


def test_many_gzip_members_are_cut_at_a_count():
    # 500,000 empty members (10 MB): read up to MAX_GZIP_MEMBERS, in linear time
    data = gzip.compress(b"http://x.com/first\n") + gzip.compress(b"") * 500_000 + gzip.compress(b"http://x.com/late\n")
    t0 = time.process_time()
    sm = parse_sitemap(data)
    assert time.process_time() - t0 < 5
    assert sm.locs == ["http://x.com/first"] and f"over {MAX_GZIP_MEMBERS} gzip members" in sm.error
