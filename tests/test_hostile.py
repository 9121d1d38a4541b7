"""The hostile web: one crawl through :class:`hostile.HostileServer` (the
crawler's HTTP proxy) over a site whose index links to every case, and a
table of what each case's row must say.

Every case is a :class:`Case`: an id, the URL under test, the behaviours it
needs on the server, how the index reaches it, and the expected row
(``outcome``, ``status``, ``error`` prefix or substring and whatever else
matters).  Its ``doc`` is the one-line statement of the expected row.  The
crawl runs once for the module (``crawled``); each case is then one test.

Cases are spread over several registered domains (made-up names with real
public suffixes) so that failures and Retry-After holds of one host do not
slow or park the others.  URLs blocked or skipped must never reach the
server.
"""

from __future__ import annotations

import json
import os
import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

import pyarrow.parquet as pq
import pytest

from conftest import crawlctl
from crawld.config import DEFAULT_STRIP_PARAMS
from crawld.urls import canonicalize, compile_strip
from hostile import (HostileServer, drip, endless, head, hold, html, http_date, page, raw, redirect, reset,
                     reset_after, respond, response, send, sequence, then_drip)

# -- settings of the crawl --------------------------------------------------------
MAX_BODY = 65536
MAX_DEPTH = 4
SETTINGS = {
    "fetch_deadline_s": 3, "read_timeout_s": 1.5, "connect_timeout_s": 1, "max_body_bytes": MAX_BODY,
    "backoff_base_s": 0.1, "backoff_max_s": 0.5, "max_redirects": 3, "max_query_variants": 5,
    "robots_retry_s": 0.5, "host_max_failures": 100, "host_give_up_s": 3, "max_path_repeats": 3,
}

# -- hosts (one registered domain per kind of trouble) ----------------------------
MAIN = "www.hostile-main.com"        # the index, HTML, links, redirects, traps, files
WIRE = "wire.hostile-wire.org"       # malformed and broken responses
SLOW = "slow.hostile-slow.io"        # slow and stalled responses
BOMB = "bomb.hostile-bomb.net"       # compression bombs and oversized bodies
ROBO = "hostile-robots.org"          # robots.txt cases, one origin (subdomain) each
R500 = "www.hostile-r500.net"        # robots.txt answers 500
RTIME = "www.hostile-rtimeout.net"   # robots.txt never answers
T429 = "www.hostile-429.de"          # 429 with Retry-After seconds
T503 = "www.hostile-503.co.uk"       # 503 with Retry-After HTTP-date
T500 = "www.hostile-500.fr"          # 5xx that keep failing
PARK = "www.hostile-park.be"         # Retry-After beyond max_retry_after_s
PEER = "landing.hostile-peer.org"    # target of cross-host redirects and links
IDN_U = "bücher-hostile.com"         # an IDN host ...
IDN = "xn--bcher-hostile-wob.com"    # ... and its punycode
OUTSIDE = "www.outside-hostile.info"  # not in scope
ALLOWED = ["hostile-wire.org", "hostile-slow.io", "hostile-bomb.net", ROBO, "hostile-r500.net",
           "hostile-rtimeout.net", "hostile-429.de", "hostile-503.co.uk", "hostile-500.fr", "hostile-park.be",
           "hostile-peer.org", IDN]
M = f"http://{MAIN}"

# IP-literal seeds (behind a proxy only IP literals can be checked): they are
# in scope, and their fetch must be refused by the address policy
META4 = "http://169.254.169.254/latest/meta-data/"
META6 = "http://[fd00:ec2::254]/"
PRIVATE = "http://10.1.2.3/admin"
LOOPBACK = "http://127.0.0.1:{port}/"  # the hostile server itself; no --allow-loopback

UA_TOKEN = "crawld"


# -- behaviours of this suite ------------------------------------------------------
def retry_after_date(status: int, delay_s: float):
    """``status`` with ``Retry-After`` an HTTP-date ``delay_s`` from now."""
    def behaviour(conn, req):
        send(conn, response(status, "busy", content_type="text/plain",
                            headers=[("Retry-After", http_date(time.time() + delay_s))]))
    return behaviour


_bombs: dict[str, bytes] = {}


def bomb(kind: str, decoded_mib: int = 128) -> bytes:
    """``decoded_mib`` MiB of HTML (a title, then spaces) compressed as
    ``gzip`` or ``deflate`` (zlib format): small on the wire, huge decoded."""
    if kind not in _bombs:
        c = zlib.compressobj(9, zlib.DEFLATED, 31 if kind == "gzip" else 15)
        parts = [c.compress(b"<!doctype html><html><head><title>bomb</title></head><body>")]
        block = b" " * (1 << 20)
        parts += [c.compress(block) for _ in range(decoded_mib)]
        parts.append(c.flush())
        _bombs[kind] = b"".join(parts)
    return _bombs[kind]


def bomb_behaviour(kind: str):
    def behaviour(conn, req):
        body = bomb(kind)
        send(conn, head(200, content_length=len(body), headers=[("Content-Encoding", kind)]) + body)
    return behaviour


def cp1252(s: str) -> bytes:
    return s.encode("cp1252")


# -- the table -------------------------------------------------------------------
@dataclass
class Case:
    """One hostile case.

    ``url`` is the URL under test (its row is found by ``canonical``,
    default ``url``; ``{port}`` is the server's port); ``routes`` the
    behaviours it needs, ``{(host, path): behaviour}`` (``prefix`` routes
    serve every path under a prefix); ``link`` is the href the index page
    carries for it (default ``url``; None: reached otherwise); ``expect``
    the row's fields (see :func:`check_row`); ``check(row, crawl)`` an extra
    check; ``doc`` the expected row in one line.
    """

    id: str
    url: str
    doc: str
    expect: dict[str, Any]
    routes: dict[tuple[str, str], Callable] = field(default_factory=dict)
    prefix: dict[tuple[str, str], Callable] = field(default_factory=dict)
    link: str | None = ""
    canonical: str | None = None
    check: Callable | None = None


CASES: list[Case] = []


def case(id: str, url: str, doc: str, routes=None, prefix=None, link: str | None = "", canonical=None,
         check=None, **expect) -> None:
    CASES.append(Case(id, url, doc, expect, routes or {}, prefix or {}, link, canonical, check))


def child_page(title: str):
    return page(title, [])


# ---- plain HTML, status codes ------------------------------------------------------
case("html-control", f"{M}/html/plain",
     "a plain page: fetched 200, text/html (mime only), title, outlinks resolved",
     routes={(MAIN, "/html/plain"): respond(200, html("Plain page", ["child"]),
                                            content_type="Text/HTML; Charset=UTF-8"),
             (MAIN, "/html/child"): child_page("child")},
     outcome="fetched", status=200, error=None, content_type="text/html", title="Plain page",
     outlinks=[f"{M}/html/child"], truncated=False, attempt=1, depth=1, referrer=f"{M}/")
case("status-404", f"{M}/html/missing",
     "404: fetched with status 404, no error, not retried",
     routes={(MAIN, "/html/missing"): respond(404, "<title>nope</title>")},
     outcome="fetched", status=404, error=None, attempt=1, requests=1)
case("status-410", f"{M}/html/gone",
     "410: fetched with status 410, not retried",
     routes={(MAIN, "/html/gone"): respond(410, "gone", content_type="text/plain")},
     outcome="fetched", status=410, attempt=1, requests=1)
case("empty-200", f"{M}/html/empty",
     "200 with an empty body: fetched, content_length 0, no title, no outlinks",
     routes={(MAIN, "/html/empty"): respond(200, b"")},
     outcome="fetched", status=200, content_length=0, title=None, outlinks=[], error=None)
case("no-content-type", f"{M}/html/untyped",
     "200 without Content-Type: fetched, content_type null",
     routes={(MAIN, "/html/untyped"): respond(200, html("untyped", []), content_type=None)},
     outcome="fetched", status=200, content_type=None)
case("title-huge", f"{M}/html/huge-title",
     "a 50 KB <title>: fetched (not truncated), title cut to 2000 characters",
     routes={(MAIN, "/html/huge-title"): respond(200, "<html><head><title>" + "T" * 50_000 + "</title></head></html>")},
     outcome="fetched", status=200, truncated=False, check=lambda row, c: row["title"] == "T" * 2000)
case("deep-nesting", f"{M}/html/nested",
     "10000 nested unclosed <div>s (50 KB, under the cap): fetched, title and the innermost link found",
     routes={(MAIN, "/html/nested"): respond(200, "<html><head><title>nested</title></head><body>" + "<div>" * 10000
                                             + '<a href="/html/innermost">x</a></body></html>'),
             (MAIN, "/html/innermost"): child_page("innermost")},
     outcome="fetched", status=200, title="nested", outlinks_has=[f"{M}/html/innermost"])
case("fragments-dedup", f"{M}/html/fragments",
     "links differing only by #fragment and fragment-only links: one outlink",
     routes={(MAIN, "/html/fragments"): page("fragments", ["/html/frag#a", "/html/frag#b", "#top", "/html/frag"]),
             (MAIN, "/html/frag"): child_page("frag")},
     outcome="fetched", outlinks=[f"{M}/html/frag"])
case("userinfo-link", f"{M}/html/creds",
     "a link with user:password@: fetched without the credentials, which appear in no row",
     routes={(MAIN, "/html/creds-page"): page("creds", ["http://user:s3cret@www.hostile-main.com/html/creds"]),
             (MAIN, "/html/creds"): child_page("creds target")},
     link="/html/creds-page", outcome="fetched", status=200, referrer=f"{M}/html/creds-page",
     check=lambda row, c: not any("s3cret" in json.dumps(r, default=str) for r in c.rows))
case("canonical-link", f"{M}/html/canonical",
     "<link rel=canonical> relative: canonical_link recorded absolute",
     routes={(MAIN, "/html/canonical"): page("canon", head_extra='<link rel="canonical" href="/html/the-canonical">')},
     outcome="fetched", canonical_link=f"{M}/html/the-canonical")
case("xhtml", f"{M}/html/xhtml",
     "application/xhtml+xml is parsed as HTML: title and outlinks",
     routes={(MAIN, "/html/xhtml"): respond(200, html("xhtml page", ["/html/child"]), content_type="application/xhtml+xml"),
             },
     outcome="fetched", content_type="application/xhtml+xml", title="xhtml page", outlinks=[f"{M}/html/child"])

# ---- encodings -----------------------------------------------------------------
case("enc-cp1252-undeclared", f"{M}/enc/cp1252",
     "windows-1252 bytes, no charset anywhere: decoded as windows-1252 (HTML standard fallback)",
     routes={(MAIN, "/enc/cp1252"): respond(200, cp1252("<html><head><title>Café – naïve “quotes”</title></head>"
                                                        "<body><p>Ça coûte 5 €</p></body></html>"),
                                            content_type="text/html")},
     outcome="fetched", status=200, title="Café – naïve “quotes”")
case("enc-meta-cp1252", f"{M}/enc/meta-cp1252",
     "windows-1252 bytes declared only by <meta charset>: decoded right",
     routes={(MAIN, "/enc/meta-cp1252"): respond(200, cp1252('<html><head><meta charset="windows-1252">'
                                                             "<title>Café – crème</title></head></html>"),
                                                 content_type="text/html")},
     outcome="fetched", title="Café – crème")
case("enc-wrong-declared-utf8", f"{M}/enc/lying-utf8",
     "header says utf-8, bytes are windows-1252: fetched, bad bytes become U+FFFD, later links still found",
     routes={(MAIN, "/enc/lying-utf8"): respond(200, cp1252("<html><head><title>Café</title></head><body>"
                                                            '<a href="/enc/after-lie">x</a></body></html>'),
                                                content_type="text/html; charset=utf-8"),
             (MAIN, "/enc/after-lie"): child_page("after")},
     outcome="fetched", status=200, title="Caf\ufffd", outlinks_has=[f"{M}/enc/after-lie"])
case("enc-wrong-declared-latin1", f"{M}/enc/lying-latin1",
     "header says iso-8859-1, bytes are UTF-8: the transport charset wins (windows-1252 mojibake)",
     routes={(MAIN, "/enc/lying-latin1"): respond(200, "<html><head><title>Café</title></head></html>".encode(),
                                                  content_type="text/html; charset=iso-8859-1")},
     outcome="fetched", title="CafÃ©")
case("enc-unknown-label", f"{M}/enc/bogus-label",
     "an unknown charset label in the header is ignored: <meta charset=utf-8> decodes the page",
     routes={(MAIN, "/enc/bogus-label"): respond(200, '<html><head><meta charset="utf-8"><title>Café ü</title></head></html>'
                                                 .encode(), content_type="text/html; charset=x-no-such-charset-42")},
     outcome="fetched", content_type="text/html", title="Café ü")
case("enc-invalid-utf8", f"{M}/enc/invalid-utf8",
     "invalid UTF-8 sequences: fetched, U+FFFD in the title, links after them found",
     routes={(MAIN, "/enc/invalid-utf8"): respond(200, b"<html><head><title>bad \xff\xfe\xc3( bytes</title></head><body>"
                                                  b'\xed\xa0\x80<a href="/enc/after-invalid">x</a></body></html>',
                                                  content_type="text/html; charset=utf-8"),
             (MAIN, "/enc/after-invalid"): child_page("after")},
     outcome="fetched", title_contains=["bad ", "\ufffd", " bytes"], outlinks_has=[f"{M}/enc/after-invalid"])
case("enc-nul-bytes", f"{M}/enc/nul",
     "NUL bytes in the markup: fetched, title and link found",
     routes={(MAIN, "/enc/nul"): respond(200, b"<html><head><title>nul\x00title</title></head><body>\x00\x00"
                                         b'<a href="/enc/after-nul">x</a>\x00</body></html>'),
             (MAIN, "/enc/after-nul"): child_page("after")},
     outcome="fetched", title_contains=["nul", "title"], outlinks_has=[f"{M}/enc/after-nul"])

_UTF16 = "\ufeff<html><head><title>UTF-16 ü</title></head><body><a href=\"/enc/after-utf16\">x</a></body></html>"
case("enc-utf16-bom", f"{M}/enc/utf16",
     "UTF-16LE with a BOM and no charset: the BOM decides, title and links read",
     routes={(MAIN, "/enc/utf16"): respond(200, _UTF16.encode("utf-16-le"), content_type="text/html"),
             (MAIN, "/enc/after-utf16"): child_page("after")},
     outcome="fetched", title="UTF-16 ü", outlinks=[f"{M}/enc/after-utf16"])
case("enc-bom-beats-header", f"{M}/enc/bom-vs-header",
     "a UTF-8 BOM beats a header charset=iso-8859-1 (HTML standard): title decoded as UTF-8",
     routes={(MAIN, "/enc/bom-vs-header"): respond(200, b"\xef\xbb\xbf" + "<html><head><title>Café</title></head></html>"
                                                   .encode(), content_type="text/html; charset=iso-8859-1")},
     outcome="fetched", title="Café")

# ---- links ---------------------------------------------------------------------
case("base-href", f"{M}/links/base",
     "<base href> changes resolution: relative links resolve against it, not the page URL",
     routes={(MAIN, "/links/base"): page("base", ["target", "../up"], head_extra='<base href="/based/dir/">'),
             (MAIN, "/based/dir/target"): child_page("based")},
     outcome="fetched", outlinks=[f"{M}/based/dir/target", f"{M}/based/up"],
     outlinks_lacks=[f"{M}/links/target", f"{M}/up"])
case("base-href-target", f"{M}/based/dir/target",
     "the link resolved by <base href> is fetched at depth 2",
     link=None, outcome="fetched", status=200, depth=2, referrer=f"{M}/links/base")
_WS_HREFS = ["\t /ws/a\tb\nc.html \n", "\x01\x1f/ws/ctl.html", "/ws/sp ace.html", "/ws/back\\slash.html",
             "  \r\n/ws/lead-trail.html\r\n  "]
case("href-whitespace", f"{M}/ws/page",
     "tabs, newlines, spaces, C0 controls and backslashes in href: cleaned as WHATWG URL parsing does",
     routes={(MAIN, "/ws/page"): respond(200, "<html><head><title>ws</title></head><body>"
                                         + "".join(f'<a href="{h}">x</a>' for h in _WS_HREFS) + "</body></html>")},
     prefix={(MAIN, "/ws/"): child_page("ws child")},
     outcome="fetched",
     outlinks=[f"{M}/ws/abc.html", f"{M}/ws/ctl.html", f"{M}/ws/sp%20ace.html", f"{M}/ws/back/slash.html",
               f"{M}/ws/lead-trail.html"])
case("href-whitespace-target", f"{M}/ws/abc.html",
     "the href with a tab and a newline inside is fetched as /ws/abc.html",
     link=None, outcome="fetched", status=200, referrer=f"{M}/ws/page")
case("scheme-links", f"{M}/links/schemes",
     "javascript:, mailto:, data:, tel:, vbscript:, ftp: and fragment-only hrefs: not followed, not outlinks",
     routes={(MAIN, "/links/schemes"): page("schemes", [
         "javascript:alert(1)", " JavaScript:void(0)", "mailto:someone@hostile-main.com", "data:text/html,<a href=x>",
         "tel:+15551234567", "vbscript:msgbox(1)", "ftp://ftp.hostile-main.com/file", "#only-a-fragment",
         "java\tscript:alert(2)", "/links/real"]),
             (MAIN, "/links/real"): child_page("real")},
     outcome="fetched", outlinks=[f"{M}/links/real"],
     check=lambda row, c: not any(re.search(r"(?i)javascript|vbscript|mailto|tel:|data:|msgbox|\+1555", h.path)
                                  or h.host.startswith("ftp.") for h in c.hits))
case("dot-segments-above-root", f"{M}/links/dots/page",
     "../ segments climbing above the root stop at the root (RFC 3986 5.2.4)",
     routes={(MAIN, "/links/dots/page"): page("dots", ["../../../../../html/dots-target", "./././same"])},
     outcome="fetched", outlinks=[f"{M}/html/dots-target", f"{M}/links/dots/same"])
case("link-normalisation", f"{M}/links/normalize",
     "scheme/host case, default port, fragment, query order and tracking parameters normalised in outlinks",
     routes={(MAIN, "/links/normalize"): page("normalize", [
         "HTTP://WWW.Hostile-Main.COM:80/html/Norm?b=2&a=1#frag", "/html/track?utm_source=news&id=7&gclid=abc"])},
     outcome="fetched", outlinks=[f"{M}/html/Norm?a=1&b=2", f"{M}/html/track?id=7"])
case("protocol-relative", f"{M}/links/protorel",
     "a //host/path link takes the page's scheme: outlink http://landing.hostile-peer.org/proto-rel",
     routes={(MAIN, "/links/protorel"): page("protorel", ["//landing.hostile-peer.org/proto-rel"])},
     outcome="fetched", outlinks=[f"http://{PEER}/proto-rel"])
case("protocol-relative-target", f"http://{PEER}/proto-rel",
     "the protocol-relative target gets its own fetched row on its host",
     routes={(PEER, "/proto-rel"): child_page("proto-rel")},
     link=None, outcome="fetched", status=200, host=PEER, referrer=f"{M}/links/protorel", requests=1)
case("idn-link", f"{M}/links/idn",
     "a link to an IDN host: outlink in punycode",
     routes={(MAIN, "/links/idn"): page("idn", [f"http://{IDN_U}/idn-page"])},
     outcome="fetched", outlinks=[f"http://{IDN}/idn-page"])
case("idn-target", f"http://{IDN}/idn-page",
     "the IDN host is fetched as punycode: host and canonical_url xn--, the server saw xn--",
     routes={(IDN, "/idn-page"): child_page("idn")},
     link=None, outcome="fetched", status=200, host=IDN, requests=1)
# WHATWG URL Standard: what a browser would request
_INVALID = "http://www..hostile-main.com/x"
case("invalid-url-empty-label", _INVALID,
     "an http link whose host has an empty label, on two pages: one row skipped invalid_url (empty label), "
     "on the pages' host, in both pages' outlinks, never requested",
     routes={(MAIN, "/links/invalid-a"): page("invalid a", [_INVALID + "#one", "/links/invalid-b"]),
             (MAIN, "/links/invalid-b"): page("invalid b", [_INVALID])},
     link="/links/invalid-a", outcome="skipped", error_prefix="invalid_url:", error_contains="empty label",
     status=None, host=MAIN, depth=2, referrer=f"{M}/links/invalid-a",
     check=lambda row, c: row["url"] == _INVALID and _INVALID in c.row(f"{M}/links/invalid-a")["outlinks"]
     and _INVALID in c.row(f"{M}/links/invalid-b")["outlinks"])
case("invalid-url-port", f"{M}:99999/p",
     "a link with port 99999: skipped invalid_url (over 65535), never requested",
     outcome="skipped", error_prefix="invalid_url:", error_contains="65535", host=MAIN, referrer=f"{M}/")
case("invalid-url-ipv4", "http://0xffffffff1/",
     "a link to http://0xffffffff1/ (an IPv4 number out of range): skipped invalid_url (invalid IPv4 address)",
     outcome="skipped", error_prefix="invalid_url:", error_contains="IPv4", host=MAIN)
case("ssrf-hex-loopback-link", "http://127.0.0.1/hex-loopback",
     "a link to http://0x7f000001/... is 127.0.0.1: blocked address_blocked (loopback), never requested",
     link="http://0x7f000001/hex-loopback", outcome="blocked", error_prefix="address_blocked:",
     error_contains="loopback", host="127.0.0.1")
case("uts46-link", f"http://{PEER}/uts46-page",
     "a link to a host with full-width letters, a zero-width space and an ideographic full stop: fetched at "
     "the mapped host (UTS #46), url and host ASCII",
     routes={(PEER, "/uts46-page"): child_page("uts46")},
     link="http://ｌａｎｄ\u200bing\u3002hostile-peer.org/uts46-page", outcome="fetched", status=200, host=PEER,
     requests=1, check=lambda row, c: row["url"] == f"http://{PEER}/uts46-page")
case("trailing-dot-host", f"http://{PEER}/trailing-dot",
     "links to landing.hostile-peer.org./trailing-dot and to it without the dot: one outlink, one row, "
     "one request, to the host without the dot",
     routes={(MAIN, "/links/trailing-dot"): page("dot", [f"http://{PEER}./trailing-dot", f"http://{PEER}/trailing-dot"]),
             (PEER, "/trailing-dot"): child_page("dot")},
     link="/links/trailing-dot", outcome="fetched", status=200, host=PEER, requests=1,
     check=lambda row, c: row["url"] == f"http://{PEER}/trailing-dot"
     and c.row(f"{M}/links/trailing-dot")["outlinks"] == [f"http://{PEER}/trailing-dot"]
     and not c.srv.saw(PEER + ".", "/trailing-dot"))
case("nofollow-rel", f"{M}/nf/rel-child",
     "rel=nofollow link: row skipped/nofollow, never requested (its rel-less sibling is fetched)",
     routes={(MAIN, "/nf/rel"): respond(200, '<html><head><title>rel</title></head><body>'
                                        '<a rel="external NoFollow" href="/nf/rel-child">x</a>'
                                        '<a href="/nf/rel-sibling">y</a></body></html>'),
             (MAIN, "/nf/rel-child"): child_page("must not be fetched"),
             (MAIN, "/nf/rel-sibling"): child_page("sibling")},
     link="/nf/rel", outcome="skipped", error="nofollow", status=None, depth=2, referrer=f"{M}/nf/rel",
     check=lambda row, c: c.row(f"{M}/nf/rel-sibling")["outcome"] == "fetched"
     and f"{M}/nf/rel-child" in c.row(f"{M}/nf/rel")["outlinks"])
case("meta-robots-nofollow", f"{M}/nf/meta",
     "<meta name=robots content='NoIndex, NoFollow'>: meta_robots recorded normalised, links skipped/nofollow",
     routes={(MAIN, "/nf/meta"): page("meta nofollow", ["/nf/meta-child"],
                                      head_extra='<meta name="ROBOTS" content="NoIndex, NoFollow">'),
             (MAIN, "/nf/meta-child"): child_page("must not be fetched")},
     outcome="fetched", meta_robots="noindex,nofollow", outlinks=[f"{M}/nf/meta-child"],
     check=lambda row, c: c.row(f"{M}/nf/meta-child")["outcome"] == "skipped"
     and c.row(f"{M}/nf/meta-child")["error"] == "nofollow" and not c.srv.saw(MAIN, "/nf/meta-child"))
case("meta-robots-none", f"{M}/nf/none-child",
     "<meta name=robots content=none> means nofollow: the link is skipped/nofollow",
     routes={(MAIN, "/nf/none"): page("none", ["/nf/none-child"], head_extra='<meta name="robots" content="none">'),
             (MAIN, "/nf/none-child"): child_page("must not be fetched")},
     link="/nf/none", outcome="skipped", error="nofollow",
     check=lambda row, c: c.row(f"{M}/nf/none")["meta_robots"] == "none")
case("x-robots-tag-nofollow", f"{M}/nf/xrt",
     "X-Robots-Tag: nofollow header: x_robots_tag recorded, links skipped/nofollow",
     routes={(MAIN, "/nf/xrt"): page("xrt", ["/nf/xrt-child"], headers=[("X-Robots-Tag", "nofollow")]),
             (MAIN, "/nf/xrt-child"): child_page("must not be fetched")},
     outcome="fetched", x_robots_tag="nofollow", meta_robots=None,
     check=lambda row, c: c.row(f"{M}/nf/xrt-child")["error"] == "nofollow" and not c.srv.saw(MAIN, "/nf/xrt-child"))
case("x-robots-tag-our-agent", f"{M}/nf/xrt-ours-child",
     "X-Robots-Tag: 'crawld: noindex, nofollow' names our agent: the link is skipped/nofollow",
     routes={(MAIN, "/nf/xrt-ours"): page("xrt ours", ["/nf/xrt-ours-child"],
                                          headers=[("X-Robots-Tag", f"{UA_TOKEN}: noindex, nofollow")]),
             (MAIN, "/nf/xrt-ours-child"): child_page("must not be fetched")},
     link="/nf/xrt-ours", outcome="skipped", error="nofollow")
case("x-robots-tag-other-agent", f"{M}/nf/xrt-other-child",
     "X-Robots-Tag: 'otherbot: nofollow' is for another agent: the link is fetched",
     routes={(MAIN, "/nf/xrt-other"): page("xrt other", ["/nf/xrt-other-child"],
                                           headers=[("X-Robots-Tag", "otherbot: nofollow")]),
             (MAIN, "/nf/xrt-other-child"): child_page("other child")},
     link="/nf/xrt-other", outcome="fetched", status=200,
     check=lambda row, c: c.row(f"{M}/nf/xrt-other")["x_robots_tag"] == "otherbot: nofollow")
# X-Robots-Tag: every header line on its own (Google Search Central, "Using
# the X-Robots-Tag HTTP header": rules without a user agent are valid for
# all crawlers; a <user-agent>: prefix scopes the rules after it)
case("x-robots-tag-unscoped-line-after-scoped", f"{M}/nf/xrt-lines-child",
     "two X-Robots-Tag lines, 'otherbot: noindex' then 'nofollow': the unscoped nofollow applies, the link is "
     "skipped/nofollow, never requested",
     routes={(MAIN, "/nf/xrt-lines"): page("xrt lines", ["/nf/xrt-lines-child"],
                                           headers=[("X-Robots-Tag", "otherbot: noindex"), ("X-Robots-Tag", "nofollow")]),
             (MAIN, "/nf/xrt-lines-child"): child_page("must not be fetched")},
     link="/nf/xrt-lines", outcome="skipped", error="nofollow", status=None,
     check=lambda row, c: c.row(f"{M}/nf/xrt-lines")["x_robots_tag"] == "otherbot: noindex, nofollow"
     and c.row(f"{M}/nf/xrt-lines")["outcome"] == "fetched")
case("x-robots-tag-two-agents-one-line", f"{M}/nf/xrt-two-child",
     "X-Robots-Tag 'googlebot: noindex, crawld: nofollow' (one line, two agents): nofollow is ours, the link is "
     "skipped/nofollow",
     routes={(MAIN, "/nf/xrt-two"): page("xrt two", ["/nf/xrt-two-child"],
                                         headers=[("X-Robots-Tag", f"googlebot: noindex, {UA_TOKEN}: nofollow")]),
             (MAIN, "/nf/xrt-two-child"): child_page("must not be fetched")},
     link="/nf/xrt-two", outcome="skipped", error="nofollow")
case("x-robots-tag-ours-then-other", f"{M}/nf/xrt-mine-child",
     "X-Robots-Tag 'crawld: noindex, otherbot: nofollow': nofollow is otherbot's, the link is fetched",
     routes={(MAIN, "/nf/xrt-mine"): page("xrt mine", ["/nf/xrt-mine-child"],
                                          headers=[("X-Robots-Tag", f"{UA_TOKEN}: noindex, otherbot: nofollow")]),
             (MAIN, "/nf/xrt-mine-child"): child_page("mine child")},
     link="/nf/xrt-mine", outcome="fetched", status=200)

_NOSCRIPT_HEAD = ('<!doctype html><html><head><title>noscript pixel</title>'
                  '<noscript><img height="1" width="1" src="/px.gif"></noscript>'
                  '<meta name="robots" content="nofollow"><link rel="canonical" href="/nf/noscript-canonical">'
                  '</head><body><a href="/nf/noscript-child">x</a></body></html>')
case("noscript-pixel-then-meta-robots", f"{M}/nf/noscript",
     "a tracking-pixel <noscript><img> in <head> before <meta robots nofollow> and <link canonical>: both still read",
     routes={(MAIN, "/nf/noscript"): respond(200, _NOSCRIPT_HEAD)},
     outcome="fetched", title="noscript pixel", meta_robots="nofollow", canonical_link=f"{M}/nf/noscript-canonical")
case("noscript-pixel-then-meta-robots-child", f"{M}/nf/noscript-child",
     "the link of that nofollow page is skipped/nofollow, never requested",
     routes={(MAIN, "/nf/noscript-child"): child_page("must not be fetched")},
     link=None, outcome="skipped", error="nofollow")
case("meta-robots-noindex", f"{M}/nf/noindex",
     "<meta name=robots content=noindex>: recorded in meta_robots; links still followed",
     routes={(MAIN, "/nf/noindex"): page("noindex", ["/nf/noindex-child"], head_extra='<meta name="robots" content="noindex">'),
             (MAIN, "/nf/noindex-child"): child_page("followed")},
     outcome="fetched", meta_robots="noindex",
     check=lambda row, c: c.row(f"{M}/nf/noindex-child")["outcome"] == "fetched")

# ---- non-HTML --------------------------------------------------------------------
_PDF = b'%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n<a href="/files/from-pdf">x</a>\n%%EOF\n'
_PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(range(256)) * 8
_BIN = b'<html><head><title>not parsed</title></head><body><a href="/files/from-bin">x</a></body></html>' + bytes(500)
case("pdf", f"{M}/files/report.pdf",
     "application/pdf: fetched with content_type and length, not parsed (no title, no outlinks)",
     routes={(MAIN, "/files/report.pdf"): respond(200, _PDF, content_type="application/pdf")},
     outcome="fetched", status=200, content_type="application/pdf", content_length=len(_PDF), title=None, outlinks=[],
     check=lambda row, c: not c.srv.saw(MAIN, "/files/from-pdf"))
case("png", f"{M}/files/image.png",
     "image/png: fetched with content_type and length, not parsed",
     routes={(MAIN, "/files/image.png"): respond(200, _PNG, content_type="image/png")},
     outcome="fetched", status=200, content_type="image/png", content_length=len(_PNG), title=None, outlinks=[])
case("octet-stream", f"{M}/files/blob.bin",
     "application/octet-stream holding HTML: fetched, not parsed (no title, no outlinks)",
     routes={(MAIN, "/files/blob.bin"): respond(200, _BIN, content_type="application/octet-stream")},
     outcome="fetched", content_type="application/octet-stream", content_length=len(_BIN), title=None, outlinks=[],
     check=lambda row, c: not c.srv.saw(MAIN, "/files/from-bin"))

# ---- scope and traps -------------------------------------------------------------
case("out-of-scope", f"http://{OUTSIDE}/page",
     "a link to a registered domain not in scope: skipped/out_of_scope, never requested",
     outcome="skipped", error="out_of_scope", status=None, depth=1)
case("over-depth", f"{M}/deep/5",
     f"a chain of links deeper than --max-depth {MAX_DEPTH}: the URL at depth 5 is skipped/over_depth",
     prefix={(MAIN, "/deep/"): lambda conn, req: send(conn, response(200, html(
         "deep", [f"/deep/{int(req.path.rsplit('/', 1)[1]) + 1}"])))},
     link="/deep/1", outcome="skipped", error="over_depth", depth=5,
     check=lambda row, c: c.row(f"{M}/deep/4")["outcome"] == "fetched" and c.row(f"{M}/deep/4")["depth"] == 4)
_LONG = "/long/" + "x" * 2100
case("url-too-long", f"{M}{_LONG}",
     "a URL over max_url_length (2048): skipped/url_too_long, never requested",
     outcome="skipped", error="url_too_long")


def _calendar(conn, req):
    day = int(req.path.split("date=2026-01-", 1)[1][:2])
    links = [f"/cal?date=2026-01-{d:02d}" for d in range(day + 1, min(day + 4, 32))]
    send(conn, response(200, html(f"calendar {day}", links)))


def _check_calendar(row, c) -> bool:
    cal = [r for r in c.rows if r["canonical_url"].startswith(f"{M}/cal?")]
    fetched = [r for r in cal if r["outcome"] == "fetched"]
    skipped = [r for r in cal if r["outcome"] == "skipped"]
    served = {h.path for h in c.hits if h.host == MAIN and h.path.startswith("/cal?")}
    return (len(fetched) == 5 and len(skipped) >= 1 and len(cal) == len(fetched) + len(skipped)
            and all(r["error"] == "too_many_query_variants" for r in skipped) and len(served) == 5
            and all(c.srv.count(MAIN, p) == 1 for p in served))


case("calendar-trap", f"{M}/cal?date=2026-01-01",
     "a calendar linking to ever newer ?date=: 5 variants fetched (max_query_variants), the rest too_many_query_variants",
     routes={(MAIN, "/cal"): _calendar}, outcome="fetched", status=200, check=_check_calendar)


def _loop(conn, req):
    send(conn, response(200, html("loop", ["a/"])))


case("path-loop", f"{M}/loop/a/a/a/a/",
     "a relative link a/ on every page of /loop/a/...: the fourth repeat is skipped/path_loop, never requested",
     prefix={(MAIN, "/loop/"): _loop}, link="/loop/a/", outcome="skipped", error="path_loop",
     check=lambda row, c: c.row(f"{M}/loop/a/a/a/")["outcome"] == "fetched")

# ---- redirects -------------------------------------------------------------------
case("redirect-loop-a", f"{M}/r/loop-a",
     "A -> B -> A: A is a redirect to B",
     routes={(MAIN, "/r/loop-a"): redirect("/r/loop-b"), (MAIN, "/r/loop-b"): redirect(f"{M}/r/loop-a")},
     outcome="redirect", status=302, final_url=f"{M}/r/loop-b", error=None, requests=1)
case("redirect-loop-b", f"{M}/r/loop-b",
     "A -> B -> A: B ends as error redirect_loop, redirect_chain [A], A not requested again",
     link=None, outcome="error", status=302, error_prefix="redirect_loop:", redirect_chain=[f"{M}/r/loop-a"],
     requests=1)
case("self-redirect", f"{M}/r/self",
     "a redirect to itself: error redirect_loop, one request",
     routes={(MAIN, "/r/self"): redirect("/r/self", 301)},
     outcome="error", status=301, error_prefix="redirect_loop:", requests=1)
case("redirect-chain-over-max", f"{M}/r/chain/4",
     "a chain of redirects longer than max_redirects=3: the 4th hop is error too_many_redirects, the 5th never requested",
     prefix={(MAIN, "/r/chain/"): lambda conn, req: send(conn, response(
         307, b"", content_type=None, headers=[("Location", f"/r/chain/{int(req.path.rsplit('/', 1)[1]) + 1}")]))},
     link="/r/chain/1", outcome="error", status=307, error_prefix="too_many_redirects",
     redirect_chain=[f"{M}/r/chain/1", f"{M}/r/chain/2", f"{M}/r/chain/3"], final_url=f"{M}/r/chain/5",
     check=lambda row, c: not c.srv.saw(MAIN, "/r/chain/5") and c.row(f"{M}/r/chain/3")["outcome"] == "redirect")
case("redirect-relative", f"{M}/r/rel-target?x=1",
     "a relative Location (../rel-target?x=1) resolves against the redirecting URL; target fetched with its chain",
     routes={(MAIN, "/r/rel/start"): redirect("../rel-target?x=1", 303),
             (MAIN, "/r/rel-target"): child_page("rel target")},
     link="/r/rel/start", outcome="fetched", status=200, redirect_chain=[f"{M}/r/rel/start"], depth=1,
     check=lambda row, c: c.row(f"{M}/r/rel/start")["final_url"] == f"{M}/r/rel-target?x=1")
case("redirect-malformed-location", f"{M}/r/malformed",
     "Location 'http://[oops/': error bad_redirect naming the Location",
     routes={(MAIN, "/r/malformed"): redirect("http://[oops/")},
     outcome="error", status=302, error_prefix="bad_redirect:", error_contains="[oops")
case("redirect-without-location", f"{M}/r/nowhere",
     "302 without Location: fetched with status 302 and error redirect_without_location",
     routes={(MAIN, "/r/nowhere"): respond(302, "moved somewhere", content_type="text/plain")},
     outcome="fetched", status=302, error="redirect_without_location")
case("redirect-cross-host", f"http://{PEER}/from-main",
     "a redirect to another host: the target's row is on that host, redirect_chain names the source",
     routes={(MAIN, "/r/cross"): redirect(f"http://{PEER}/from-main", 301),
             (PEER, "/from-main"): child_page("landed")},
     link="/r/cross", outcome="fetched", status=200, host=PEER, redirect_chain=[f"{M}/r/cross"],
     check=lambda row, c: c.row(f"{M}/r/cross")["outcome"] == "redirect"
     and c.row(f"{M}/r/cross")["final_url"] == f"http://{PEER}/from-main")
case("redirect-protocol-relative", f"http://{PEER}/pr-redirect",
     "Location //landing.hostile-peer.org/pr-redirect takes the scheme of the redirecting URL: target fetched with its chain",
     routes={(MAIN, "/r/protorel"): redirect(f"//{PEER}/pr-redirect"), (PEER, "/pr-redirect"): child_page("pr")},
     link="/r/protorel", outcome="fetched", status=200, host=PEER, redirect_chain=[f"{M}/r/protorel"])
case("redirect-utf8-location", f"{M}/r/caf%C3%A9-landing",
     "a Location of raw UTF-8 bytes (/r/café-landing) is read as UTF-8, as browsers do: /r/caf%C3%A9-landing fetched",
     routes={(MAIN, "/r/utf8-location"): raw(b"HTTP/1.1 302 Found\r\nLocation: /r/caf\xc3\xa9-landing\r\n"
                                              b"Content-Length: 0\r\nConnection: close\r\n\r\n"),
             (MAIN, "/r/caf%C3%A9-landing"): child_page("café")},
     link="/r/utf8-location", outcome="fetched", status=200, redirect_chain=[f"{M}/r/utf8-location"])
case("redirect-latin1-location", f"{M}/r/caf%E9-landing",
     "a Location byte that is not UTF-8 (/r/caf\\xE9-landing) is percent-encoded as received: /r/caf%E9-landing fetched",
     routes={(MAIN, "/r/latin1-location"): raw(b"HTTP/1.1 302 Found\r\nLocation: /r/caf\xe9-landing\r\n"
                                                b"Content-Length: 0\r\nConnection: close\r\n\r\n"),
             (MAIN, "/r/caf%E9-landing"): child_page("latin-1")},
     link="/r/latin1-location", outcome="fetched", status=200, redirect_chain=[f"{M}/r/latin1-location"],
     requests=1, check=lambda row, c: row["url"] == f"{M}/r/caf%E9-landing"
     and c.row(f"{M}/r/latin1-location")["final_url"] == f"{M}/r/caf%E9-landing")
case("redirect-ftp", f"{M}/r/ftp",
     "a redirect to ftp: is not followed: error bad_redirect",
     routes={(MAIN, "/r/ftp"): redirect("ftp://ftp.hostile-main.com/pub/file.txt")},
     outcome="error", status=302, error_prefix="bad_redirect:", error_contains="ftp://")
case("redirect-javascript", f"{M}/r/js",
     "a redirect to javascript: is not followed: error bad_redirect",
     routes={(MAIN, "/r/js"): redirect("javascript:alert(document.domain)")},
     outcome="error", status=302, error_prefix="bad_redirect:", error_contains="javascript:")
case("redirect-out-of-scope", f"http://{OUTSIDE}/via-redirect",
     "a redirect out of scope: the target is skipped/out_of_scope with the chain, never requested",
     routes={(MAIN, "/r/outside"): redirect(f"http://{OUTSIDE}/via-redirect", 308)},
     link="/r/outside", outcome="skipped", error="out_of_scope", redirect_chain=[f"{M}/r/outside"])

# ---- meta refresh ------------------------------------------------------------------
# <meta http-equiv=refresh>, read as the HTML Standard's shared declarative
# refresh steps, is a redirect hop of its page (any delay; see crawld.rows)


def refresh_page(title: str, content: str, links=(), head_extra: str = ""):
    return page(title, list(links), head_extra=f'<meta http-equiv="refresh" content="{content}">' + head_extra)


case("meta-refresh-instant", f"{M}/mr/instant",
     "meta refresh 0;url='/mr/landing' (quoted): redirect to it, kind meta_refresh, delay 0, the page's own fields kept",
     routes={(MAIN, "/mr/instant"): refresh_page("moved", "0;url='/mr/landing'", ["/mr/landing", "/mr/instant-child"]),
             (MAIN, "/mr/landing"): child_page("landing"), (MAIN, "/mr/instant-child"): child_page("child")},
     outcome="redirect", status=200, final_url=f"{M}/mr/landing", redirect_kind="meta_refresh", refresh_delay_s=0,
     title="moved", error=None, outlinks=[f"{M}/mr/landing", f"{M}/mr/instant-child"], depth=1, requests=1)
case("meta-refresh-target", f"{M}/mr/landing",
     "the meta refresh target: fetched once, with the refreshing page in its redirect_chain, at the page's depth",
     link=None, outcome="fetched", status=200, redirect_chain=[f"{M}/mr/instant"], depth=1, referrer=f"{M}/",
     redirect_kind=None, requests=1)
case("meta-refresh-page-links-followed", f"{M}/mr/instant-child",
     "the links of a meta-refreshing page are still followed (depth + 1, referrer the page)",
     link=None, outcome="fetched", status=200, depth=2, referrer=f"{M}/mr/instant", redirect_chain=[])
case("meta-refresh-delayed-spaced", f"{M}/mr/delayed",
     "meta refresh '7 ;\\n URL = \"/mr/delayed-landing\"' (delay, newline, spaces, URL in capitals): redirect, delay 7",
     routes={(MAIN, "/mr/delayed"): refresh_page("delayed", "7 ;\n URL = &quot;/mr/delayed-landing&quot; later"),
             (MAIN, "/mr/delayed-landing"): child_page("delayed landing")},
     outcome="redirect", final_url=f"{M}/mr/delayed-landing", redirect_kind="meta_refresh", refresh_delay_s=7,
     check=lambda row, c: c.row(f"{M}/mr/delayed-landing")["redirect_chain"] == [f"{M}/mr/delayed"])
case("meta-refresh-no-url-keyword", f"http://{PEER}/mr-peer",
     "meta refresh '0; http://landing.hostile-peer.org/mr-peer' (no url=): the cross-host target is fetched with its chain",
     routes={(MAIN, "/mr/bare"): refresh_page("bare", f"0; http://{PEER}/mr-peer"),
             (PEER, "/mr-peer"): child_page("peer landing")},
     link="/mr/bare", outcome="fetched", status=200, host=PEER, redirect_chain=[f"{M}/mr/bare"],
     check=lambda row, c: c.row(f"{M}/mr/bare")["outcome"] == "redirect"
     and c.row(f"{M}/mr/bare")["final_url"] == f"http://{PEER}/mr-peer")
case("meta-refresh-base-href", f"{M}/mr/based/target",
     "meta refresh to a relative URL resolves against <base href>, as links do",
     routes={(MAIN, "/mr/base"): refresh_page("based", "0;url=target", head_extra='<base href="/mr/based/">'),
             (MAIN, "/mr/based/target"): child_page("based target")},
     link="/mr/base", outcome="fetched", status=200, redirect_chain=[f"{M}/mr/base"])
case("meta-refresh-reload", f"{M}/mr/reload",
     "meta refresh '30' (no URL: the page reloads itself): fetched, refresh_delay_s 30, not a redirect",
     routes={(MAIN, "/mr/reload"): refresh_page("reload", "30")},
     outcome="fetched", status=200, refresh_delay_s=30, redirect_kind=None, final_url=f"{M}/mr/reload", requests=1)
case("meta-refresh-to-itself", f"{M}/mr/self",
     "meta refresh to the page's own URL: a reload, fetched (not a redirect loop), one request",
     routes={(MAIN, "/mr/self"): refresh_page("self", "0; url=/mr/self#top")},
     outcome="fetched", status=200, refresh_delay_s=0, redirect_kind=None, error=None, requests=1)
case("meta-refresh-loop", f"{M}/mr/loop-b",
     "meta refresh A -> B -> A: B ends as error redirect_loop (kind meta_refresh), A requested once",
     routes={(MAIN, "/mr/loop-a"): refresh_page("loop a", "0;url=/mr/loop-b"),
             (MAIN, "/mr/loop-b"): refresh_page("loop b", "0;url=/mr/loop-a")},
     link="/mr/loop-a", outcome="error", status=200, error_prefix="redirect_loop:", redirect_kind="meta_refresh",
     redirect_chain=[f"{M}/mr/loop-a"], title="loop b", requests=1,
     check=lambda row, c: c.srv.count(MAIN, "/mr/loop-a") == 1)
case("meta-refresh-bad-url", f"{M}/mr/bad",
     "meta refresh to 'http://[oops/': error bad_redirect naming the meta refresh URL, the page's fields kept",
     routes={(MAIN, "/mr/bad"): refresh_page("bad refresh", "0;url=http://[oops/")},
     outcome="error", status=200, error_prefix="bad_redirect: meta refresh URL", error_contains="[oops",
     redirect_kind="meta_refresh", title="bad refresh")
case("meta-refresh-javascript", f"{M}/mr/js",
     "meta refresh to javascript: is no refresh (HTML Standard): fetched, no refresh recorded",
     routes={(MAIN, "/mr/js"): refresh_page("js refresh", "0;url=javascript:alert(1)")},
     outcome="fetched", status=200, refresh_delay_s=None, redirect_kind=None, error=None)
case("http-redirect-kind", f"{M}/r/kind",
     "a 301 with a Location: redirect row with redirect_kind http",
     routes={(MAIN, "/r/kind"): redirect("/r/kind-landing", 301), (MAIN, "/r/kind-landing"): child_page("kind")},
     outcome="redirect", status=301, redirect_kind="http", refresh_delay_s=None, final_url=f"{M}/r/kind-landing")

# ---- address policy (SSRF) -----------------------------------------------------------
case("ssrf-aws-metadata", META4,
     "seed http://169.254.169.254/...: blocked address_blocked (link-local), never requested",
     link=None, outcome="blocked", error_prefix="address_blocked:", error_contains="link-local", status=None)
case("ssrf-aws-metadata-ipv6", META6,
     "seed http://[fd00:ec2::254]/: blocked address_blocked (cloud metadata), never requested",
     link=None, outcome="blocked", error_prefix="address_blocked:", error_contains="metadata")
case("ssrf-loopback", LOOPBACK,
     "seed http://127.0.0.1:PORT/ without --allow-loopback: blocked address_blocked (loopback), never requested",
     link=None, outcome="blocked", error_prefix="address_blocked:", error_contains="loopback")
case("ssrf-private", PRIVATE,
     "seed http://10.1.2.3/admin: blocked address_blocked (private), never requested",
     link=None, outcome="blocked", error_prefix="address_blocked:", error_contains="private")
case("ssrf-link-to-metadata", "http://169.254.169.254/latest/user-data",
     "a link to the metadata address: blocked address_blocked, never requested",
     outcome="blocked", error_prefix="address_blocked:", depth=1, referrer=f"{M}/")
case("ssrf-redirect-to-metadata", "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
     "a redirect to the metadata address: blocked address_blocked with the chain, never requested",
     routes={(MAIN, "/r/metadata"): redirect("http://169.254.169.254/latest/meta-data/iam/security-credentials/")},
     link="/r/metadata", outcome="blocked", error_prefix="address_blocked:", redirect_chain=[f"{M}/r/metadata"])


def _no_decimal_ip(row, c) -> bool:
    return (row is None or row["outcome"] != "fetched") and not any(
        h.host in ("2852039166", "169.254.169.254") for h in c.hits)


case("ssrf-decimal-ip-link", "http://2852039166/latest/meta-data/",
     "a link to 169.254.169.254 spelt as one decimal number: never fetched (no row, or not fetched)",
     optional_row=True, check=_no_decimal_ip)

# ---- broken wire ------------------------------------------------------------------
W = f"http://{WIRE}"
_GAVE_UP = "gave up after 2 attempts"
case("garbage-not-http", f"{W}/garbage",
     "bytes that are not HTTP at all: error protocol, retried (2 requests), error notes the attempts",
     routes={(WIRE, "/garbage"): raw(b"SSH-2.0-OpenSSH_9.6\r\n\x00\x01\x02\xff garbage\r\n\r\n")},
     outcome="error", status=None, error_prefix="protocol:", error_contains=_GAVE_UP, attempt=2, requests=2)
case("bad-status-line", f"{W}/bad-status",
     "a malformed status line (HTTP/1.1 abc): error protocol, retried",
     routes={(WIRE, "/bad-status"): raw(b"HTTP/1.1 abc Whatever\r\nContent-Length: 0\r\n\r\n")},
     outcome="error", status=None, error_prefix="protocol:", error_contains=_GAVE_UP, requests=2)
case("huge-header-line", f"{W}/huge-header",
     "a 100 KiB header line: error protocol, no memory blow-up, retried",
     routes={(WIRE, "/huge-header"): raw(b"HTTP/1.1 200 OK\r\nX-Huge: " + b"h" * 100_000
                                          + b"\r\nContent-Length: 2\r\n\r\nok")},
     outcome="error", status=None, error_prefix="protocol:", error_contains=_GAVE_UP)
case("too-many-headers", f"{W}/many-headers",
     "500 header lines: error protocol, retried",
     routes={(WIRE, "/many-headers"): raw(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(500))
                                           + b"Content-Length: 2\r\n\r\nok")},
     outcome="error", status=None, error_prefix="protocol:")
case("malformed-header-line", f"{W}/odd-header",
     "a header line without a colon after the real headers: tolerated, fetched 200 with its title",
     routes={(WIRE, "/odd-header"): raw(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n"
                                         b"Content-Length: 38\r\nThis line has no colon\r\n\r\n"
                                         b"<html><title>odd header</title></html>")},
     outcome="fetched", status=200, title="odd header", error=None)
case("lf-only-line-endings", f"{W}/lf-only",
     "status line and headers ending in bare LF: tolerated, fetched 200",
     routes={(WIRE, "/lf-only"): raw(b"HTTP/1.1 200 OK\nContent-Type: text/html\nConnection: close\n"
                                      b"Content-Length: 35\n\n<html><title>lf only</title></html>")},
     outcome="fetched", status=200, title="lf only")
case("http10-no-length", f"{W}/http10",
     "HTTP/1.0 without Content-Length, body ends at close: fetched 200",
     routes={(WIRE, "/http10"): raw(b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n"
                                     b"<html><title>old school</title></html>")},
     outcome="fetched", status=200, title="old school", truncated=False, error=None)
case("status-599", f"{W}/status-599",
     "an unregistered status 599: fetched with status 599",
     routes={(WIRE, "/status-599"): respond(599, "odd", content_type="text/plain", reason="Network Connect Timeout")},
     outcome="fetched", status=599)
case("reset-mid-body", f"{W}/reset",
     "a TCP reset in the middle of the body: fetched, status 200, truncated, error protocol",
     routes={(WIRE, "/reset"): reset_after(head(200, content_length=20000) + b"<html><title>reset</title>" + b"x" * 5000)},
     outcome="fetched", status=200, truncated=True, error_prefix="protocol:")
case("short-body-close", f"{W}/short",
     "Content-Length 20000 but the connection closes after 5000 bytes: truncated, error protocol",
     routes={(WIRE, "/short"): raw(head(200, content_length=20000) + b"y" * 5000)},
     outcome="fetched", status=200, truncated=True, error_prefix="protocol:")
case("short-body-stall", f"{W}/short-stall",
     "Content-Length 20000, 5000 bytes sent, then silence: read timeout, truncated, error timeout",
     routes={(WIRE, "/short-stall"): raw(head(200, content_length=20000) + b"z" * 5000, then=hold)},
     outcome="fetched", status=200, truncated=True, error_prefix="timeout:")
case("bad-chunked", f"{W}/bad-chunked",
     "an invalid chunk size in a chunked body: truncated, error protocol",
     routes={(WIRE, "/bad-chunked"): raw(head(200, chunked=True) + b"10\r\n<html><title>ch\r\nzz-not-hex\r\nxxx\r\n")},
     outcome="fetched", status=200, truncated=True, error_prefix="protocol:")
case("bad-gzip", f"{W}/bad-gzip",
     "Content-Encoding: gzip over a body that is not gzip: truncated, error protocol",
     routes={(WIRE, "/bad-gzip"): raw(head(200, content_length=40, headers=[("Content-Encoding", "gzip")]) + b"n" * 40)},
     outcome="fetched", status=200, truncated=True, error_prefix="protocol:")
case("close-without-response", f"{W}/hangup",
     "the server reads the request and closes without a byte: error, retried, error notes the attempts",
     routes={(WIRE, "/hangup"): lambda conn, req: None},
     outcome="error", status=None, error_contains=["RemoteDisconnected", _GAVE_UP], requests=2)
case("reset-without-response", f"{W}/rst",
     "the server reads the request and resets the connection: error, retried",
     routes={(WIRE, "/rst"): lambda conn, req: reset(conn)},
     outcome="error", status=None, error_contains=_GAVE_UP, requests=2)

# ---- slow and stalled ----------------------------------------------------------------
S = f"http://{SLOW}"
case("slow-body-byte-per-second", f"{S}/drip-body",
     "headers at once, then one body byte a second: cut by fetch_deadline_s, status 200, truncated, error deadline",
     routes={(SLOW, "/drip-body"): then_drip(head(200, content_length=200) + b"<", b"x", 1.0)},
     outcome="fetched", status=200, truncated=True, error_prefix="deadline:", attempt=1,
     check=lambda row, c: 2500 <= row["response_ms"] <= 6000)
case("slow-headers-byte-per-second", f"{S}/drip-head",
     "the status line and headers one byte a second: error deadline, retried once, error notes the attempts",
     routes={(SLOW, "/drip-head"): drip(response(200, html("too late", [])), 1.0)},
     outcome="error", status=None, error_prefix="deadline:", error_contains=_GAVE_UP, attempt=2, requests=2)
case("never-answers", f"{S}/silent",
     "the server accepts and never answers: error timeout (read_timeout_s), retried",
     routes={(SLOW, "/silent"): hold},
     outcome="error", status=None, error_prefix="timeout:", error_contains=_GAVE_UP, requests=2)
case("trickle-forever", f"{S}/trickle",
     "a body that never ends, 16 bytes every 0.5 s: cut by the deadline, status 200, truncated",
     routes={(SLOW, "/trickle"): then_drip(head(200) + b"<html><title>trickle</title>", b"t" * 16, 0.5)},
     outcome="fetched", status=200, truncated=True, error_prefix="deadline:")
case("slow-but-in-time", f"{S}/patient",
     "a body in three parts 0.5 s apart (under every limit): fetched normally, not truncated",
     routes={(SLOW, "/patient"): drip(response(200, html("patient", [])), 0.5,
                                      chunk=len(response(200, html("patient", []))) // 3 + 1)},
     outcome="fetched", status=200, title="patient", truncated=False, error=None)

# ---- bodies too big ----------------------------------------------------------------------
B = f"http://{BOMB}"
case("body-over-cap", f"{B}/big",
     "a 300 KB body: fetched, truncated at max_body_bytes",
     routes={(BOMB, "/big"): respond(200, b"<html><title>big</title>" + b"b" * 300_000)},
     outcome="fetched", status=200, truncated=True, content_length=MAX_BODY, title="big",
     error=f"truncated: body over {MAX_BODY} bytes")
case("endless-body", f"{B}/endless",
     "a body with no length that never ends: truncated at max_body_bytes",
     routes={(BOMB, "/endless"): endless(head(200) + b"<html><title>endless</title>", b"e" * 16384)},
     outcome="fetched", status=200, truncated=True, content_length=MAX_BODY, error_prefix="truncated:")
case("endless-chunked", f"{B}/endless-chunked",
     "a chunked body that never ends: truncated at max_body_bytes",
     routes={(BOMB, "/endless-chunked"): endless(head(200, chunked=True), b"4000\r\n" + b"c" * 0x4000 + b"\r\n")},
     outcome="fetched", status=200, truncated=True, content_length=MAX_BODY, error_prefix="truncated:")
case("gzip-bomb", f"{B}/gzip-bomb",
     "Content-Encoding: gzip, ~130 KB on the wire, 128 MiB decoded: truncated at max_body_bytes",
     routes={(BOMB, "/gzip-bomb"): bomb_behaviour("gzip")},
     outcome="fetched", status=200, truncated=True, content_length=MAX_BODY, title="bomb", error_prefix="truncated:",
     check=lambda row, c: row["response_ms"] < 2000)  # decoding stopped at the cap
case("deflate-bomb", f"{B}/deflate-bomb",
     "Content-Encoding: deflate, ~130 KB on the wire, 128 MiB decoded: truncated at max_body_bytes",
     routes={(BOMB, "/deflate-bomb"): bomb_behaviour("deflate")},
     outcome="fetched", status=200, truncated=True, content_length=MAX_BODY, title="bomb", error_prefix="truncated:",
     check=lambda row, c: row["response_ms"] < 2000)  # decoding stopped at the cap

case("redirect-endless-body", f"{B}/r/endless-body",
     "a 302 with a Location and a body that never ends: a redirect row (the body is not read to its end), target fetched",
     routes={(BOMB, "/r/endless-body"): then_drip(head(302, headers=[("Location", "/r/endless-landing")]),
                                                  b"r" * 65536, 0.01),
             (BOMB, "/r/endless-landing"): child_page("landing")},
     outcome="redirect", status=302, final_url=f"{B}/r/endless-landing", attempt=1,
     check=lambda row, c: c.row(f"{B}/r/endless-landing")["outcome"] == "fetched")

# ---- robots.txt -------------------------------------------------------------------------
RDIS, RREDIR, RBIG, RAGENT, RGARB, R404 = (f"{p}.{ROBO}" for p in ("dis", "redir", "big", "agent", "garbage", "none"))
_BIG_ROBOTS = (b"User-agent: *\nDisallow: /early/\n" + b"# padding padding padding padding padding\n" * 14000
               + b"Disallow: /late/\n")
assert len(_BIG_ROBOTS) > 520 * 1024
case("robots-disallow", f"http://{RDIS}/private/secret",
     "robots.txt Disallow: /private/: blocked robots_disallowed, the server never saw it",
     routes={(RDIS, "/robots.txt"): respond(200, "User-agent: *\nDisallow: /private/\n", content_type="text/plain")},
     outcome="blocked", error="robots_disallowed", status=None)
case("robots-disallow-other-path", f"http://{RDIS}/public/ok",
     "same robots.txt, a path it does not disallow: fetched",
     routes={(RDIS, "/public/ok"): child_page("public")}, outcome="fetched", status=200)
case("robots-404", f"http://{R404}/page",
     "robots.txt 404: everything allowed, fetched",
     routes={(R404, "/page"): child_page("allowed")},
     outcome="fetched", status=200, check=lambda row, c: c.srv.count(R404, "/robots.txt") == 1)
case("robots-500", f"http://{R500}/page",
     "robots.txt 500: host disallowed and robots.txt retried with the host's backoff; given up after "
     "host_give_up_s=3: blocked, host_parked: robots_unreachable",
     routes={(R500, "/robots.txt"): respond(500, "oops", content_type="text/plain"),
             (R500, "/page"): child_page("must not be fetched")},
     outcome="blocked", error="host_parked: robots_unreachable: HTTP 500", status=None,
     check=lambda row, c: c.srv.count(R500, "/robots.txt") >= 2)
case("robots-timeout", f"http://{RTIME}/page",
     "robots.txt that never answers: retried, then given up: blocked, host_parked: robots_unreachable: timeout",
     routes={(RTIME, "/robots.txt"): hold, (RTIME, "/page"): child_page("must not be fetched")},
     outcome="blocked", error_prefix="host_parked: robots_unreachable: timeout:",
     check=lambda row, c: c.srv.count(RTIME, "/robots.txt") >= 2)
case("robots-redirect", f"http://{RREDIR}/secret/x",
     "robots.txt 301 to another path whose rules disallow /secret/: the redirect is followed, URL blocked",
     routes={(RREDIR, "/robots.txt"): redirect("/rules/robots-real.txt", 301),
             (RREDIR, "/rules/robots-real.txt"): respond(200, "User-agent: *\nDisallow: /secret/\n",
                                                         content_type="text/plain")},
     outcome="blocked", error="robots_disallowed",
     check=lambda row, c: c.srv.count(RREDIR, "/rules/robots-real.txt") == 1)
case("robots-redirect-allowed", f"http://{RREDIR}/open",
     "same redirected robots.txt, an allowed path: fetched",
     routes={(RREDIR, "/open"): child_page("open")}, outcome="fetched", status=200)
case("robots-oversize-early-rule", f"http://{RBIG}/early/x",
     "a 550 KiB robots.txt: a rule in its first 500 KiB applies (blocked)",
     routes={(RBIG, "/robots.txt"): respond(200, _BIG_ROBOTS, content_type="text/plain")},
     outcome="blocked", error="robots_disallowed")
case("robots-oversize-late-rule", f"http://{RBIG}/late/x",
     "a 550 KiB robots.txt: a rule after 500 KiB is ignored (fetched)",
     routes={(RBIG, "/late/x"): child_page("late")}, outcome="fetched", status=200)
case("robots-own-agent-group", f"http://{RAGENT}/mine/x",
     "robots.txt with a group for our agent token: that group applies (blocked), not the * group",
     routes={(RAGENT, "/robots.txt"): respond(200, f"User-agent: *\nDisallow: /\n\nUser-agent: {UA_TOKEN}\n"
                                                   "Disallow: /mine/\n", content_type="text/plain")},
     outcome="blocked", error="robots_disallowed")
case("robots-own-agent-group-allowed", f"http://{RAGENT}/theirs",
     "robots.txt whose * group disallows all but whose group for our agent allows /theirs: fetched",
     routes={(RAGENT, "/theirs"): child_page("theirs")}, outcome="fetched", status=200)
case("robots-garbage", f"http://{RGARB}/page",
     "a robots.txt of binary garbage: no rules, fetched",
     routes={(RGARB, "/robots.txt"): respond(200, bytes(range(256)) * 20, content_type="text/plain"),
             (RGARB, "/page"): child_page("garbage robots")},
     outcome="fetched", status=200)

# ---- retries ------------------------------------------------------------------------------


def _gap_at_least(host, path, seconds):
    def check(row, c):
        t = sorted(c.srv.times(host, path))
        assert len(t) == 2 and t[1] - t[0] >= seconds, f"{host}{path} requested at {t}"
        return True
    return check


case("retry-after-429-seconds", f"http://{T429}/limited",
     "429 with Retry-After: 1, then 200: fetched the second time, at least ~1 s after the 429; the 429 "
     "spent no attempt (it says 'slower', not 'broken')",
     routes={(T429, "/limited"): sequence(respond(429, "slow down", content_type="text/plain",
                                                  headers=[("Retry-After", "1")]), page("finally", []))},
     outcome="fetched", status=200, attempt=1, title="finally", error=None, requests=2,
     check=_gap_at_least(T429, "/limited", 0.9))
case("retry-after-503-date", f"http://{T503}/maintenance",
     "503 with Retry-After as an HTTP-date 2 s ahead, then 200: fetched the second time, ~1-2 s later, no "
     "attempt spent",
     routes={(T503, "/maintenance"): sequence(retry_after_date(503, 2.0), page("back", []))},
     outcome="fetched", status=200, attempt=1, title="back", requests=2,
     check=_gap_at_least(T503, "/maintenance", 0.9))
case("500-forever", f"http://{T500}/always-500",
     "500 every time: after max_attempts=2 the row has status 500 and an error noting the attempts",
     routes={(T500, "/always-500"): respond(500, "broken", content_type="text/plain")},
     outcome="fetched", status=500, attempt=2, error_contains=_GAVE_UP, requests=2)
case("503-then-ok", f"http://{T500}/flaky",
     "503 without Retry-After, then 200: the host slowed down, fetched the second time, no attempt spent",
     routes={(T500, "/flaky"): sequence(respond(503, "busy", content_type="text/plain"), page("ok now", []))},
     outcome="fetched", status=200, attempt=1, requests=2)
case("retry-after-too-long", f"http://{PARK}/park",
     "429 with Retry-After: 86400 (over max_retry_after_s): the host is parked, the URL skipped host_parked",
     routes={(PARK, "/park"): respond(429, "go away", content_type="text/plain", headers=[("Retry-After", "86400")])},
     outcome="skipped", error_prefix="host_parked:", error_contains="Retry-After", requests=1)


# -- running the crawl -----------------------------------------------------------------------
@dataclass
class Crawl:
    proc: Any
    summary: dict | None
    rows: list[dict]
    by_canon: dict[str, list[dict]]
    srv: HostileServer
    hits: list
    queue_depth: Any
    wall_s: float
    port: int

    def row(self, canonical: str) -> dict:
        rows = self.by_canon.get(canonical)
        assert rows, f"no row for {canonical}"
        return rows[0]


def _index_links(port: int) -> list[str]:
    links = []
    for c in CASES:
        if c.link is None:
            continue
        links.append(c.link or c.url.format(port=port))
    return links


@pytest.fixture(scope="module")
def crawled(redis_server, tmp_path_factory) -> Crawl:
    srv = HostileServer()
    port = srv.port
    for c in CASES:
        for (h, p), b in c.routes.items():
            srv.route(h, p, b)
        for (h, p), b in c.prefix.items():
            srv.route_prefix(h, p, b)
    srv.route(MAIN, "/", page("hostile index", _index_links(port)))
    out = tmp_path_factory.mktemp("hostile")
    crawl_id = f"hostile-{os.getpid()}"
    args = ["run", f"{M}/", META4, META6, LOOPBACK.format(port=port), PRIVATE,
            "--crawl-id", crawl_id, "--shards", "2", "--max-rps-per-host", "50", "--max-inflight-per-host", "8",
            "--max-depth", str(MAX_DEPTH), "--max-attempts", "2", "--proxy", srv.url,
            "--redis-url", redis_server.url, "--out", str(out), "--json", "-v", "--quiet"]
    for d in ALLOWED:
        args += ["--allow-domain", d]
    for k, v in SETTINGS.items():
        args += ["--set", f"{k}={v}"]
    bomb("gzip"), bomb("deflate")  # built before the clock starts
    t0 = time.monotonic()
    srv.start()
    try:
        proc = crawlctl(*args, env={"NO_PROXY": "", "no_proxy": ""}, timeout=240)
        wall = time.monotonic() - t0
        qd = crawlctl("queue-depth", "--crawl-id", crawl_id, "--redis-url", redis_server.url)
    finally:
        srv.stop()
    summary, rows = None, []
    if proc.returncode == 0:
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        rows = pq.read_table(summary["artifact"]).to_pylist()
    by_canon: dict[str, list[dict]] = {}
    for r in rows:
        by_canon.setdefault(r["canonical_url"], []).append(r)
    return Crawl(proc, summary, rows, by_canon, srv, srv.hits(), qd, wall, port)


# -- checks ---------------------------------------------------------------------------------
_FIELDS = ("outcome", "status", "error", "truncated", "content_type", "content_length", "final_url", "title",
           "meta_robots", "x_robots_tag", "canonical_link", "redirect_chain", "redirect_kind", "refresh_delay_s",
           "attempt", "depth", "host", "referrer")


def check_row(c: Case, crawl: Crawl) -> list[str]:
    """What is wrong with case ``c``'s row (empty when all is well)."""
    canonical = (c.canonical or c.url).format(port=crawl.port)
    rows = crawl.by_canon.get(canonical, [])
    exp = c.expect
    problems = []
    if len(rows) > 1:
        problems.append(f"{len(rows)} rows for one URL")
    row = rows[0] if rows else None
    if row is None and not exp.get("optional_row"):
        return [f"no row for {canonical}"]
    if row is not None:
        for f in _FIELDS:
            if f in exp and row[f] != exp[f]:
                problems.append(f"{f}={row[f]!r}, expected {exp[f]!r}")
        err = row["error"] or ""
        if "error_prefix" in exp and not err.startswith(exp["error_prefix"]):
            problems.append(f"error={row['error']!r}, expected it to start with {exp['error_prefix']!r}")
        for sub in _listify(exp.get("error_contains")):
            if sub not in err:
                problems.append(f"error={row['error']!r}, expected it to contain {sub!r}")
        for sub in _listify(exp.get("title_contains")):
            if sub not in (row["title"] or ""):
                problems.append(f"title={row['title']!r}, expected it to contain {sub!r}")
        if "outlinks" in exp and row["outlinks"] != exp["outlinks"]:
            problems.append(f"outlinks={row['outlinks']!r}, expected {exp['outlinks']!r}")
        for u in exp.get("outlinks_has", ()):
            if u not in row["outlinks"]:
                problems.append(f"outlinks lack {u!r}: {row['outlinks']!r}")
        for u in exp.get("outlinks_lacks", ()):
            if u in row["outlinks"]:
                problems.append(f"outlinks hold {u!r}")
        parts = urlsplit(canonical)
        host, path = parts.hostname or "", (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        parked = (row["error"] or "").startswith("host_parked:")  # parked by this URL's own answer
        if row["outcome"] in ("blocked", "skipped") and not parked and crawl.srv.saw(host, path):
            problems.append(f"the server received {host}{path} though the row is {row['outcome']}")
        if "requests" in exp and crawl.srv.count(host, path) != exp["requests"]:
            problems.append(f"server saw {crawl.srv.count(host, path)} request(s), expected {exp['requests']}")
    if c.check is not None:
        try:
            ok = c.check(row, crawl)
        except (AssertionError, KeyError, TypeError) as exc:
            ok, problems = False, problems + [f"check raised {type(exc).__name__}: {exc}"]
        if not ok:
            problems.append(f"extra check failed: {c.check.__name__ if hasattr(c.check, '__name__') else c.check}")
    return problems


def _listify(v) -> list:
    if v is None:
        return []
    return [v] if isinstance(v, str) else list(v)


def test_table_is_large_and_unique():
    assert len(CASES) >= 50
    assert len({c.id for c in CASES}) == len(CASES)
    assert len({c.url for c in CASES}) == len(CASES)


def test_crawl_completed_cleanly(crawled):
    """exit 0, no worker crash, the frontier drained, the server shut down
    cleanly and none of its behaviours failed."""
    p = crawled.proc
    assert p.returncode == 0, f"crawlctl exited {p.returncode}:\n{p.stderr[-4000:]}"
    for bad in ("process_failed", "child_exited", "child_crash_loop", "Traceback", "drain_timeout"):
        assert bad not in p.stderr, f"{bad} in the crawl's log:\n" + "\n".join(
            line for line in p.stderr.splitlines() if bad in line)[:4000]
    assert crawled.queue_depth.returncode == 0, crawled.queue_depth.stderr
    assert crawled.queue_depth.stdout.split()[:2] == ["total=0", "claimed=0"], crawled.queue_depth.stdout
    assert crawled.summary["dead_letters"] == 0
    assert crawled.summary["duplicates_dropped"] == 0
    assert not crawled.srv.errors, crawled.srv.errors
    assert not crawled.srv.leftover_threads, crawled.srv.leftover_threads


def test_forbidden_hosts_never_reached(crawled):
    """No request ever reached the server for an address-blocked or
    out-of-scope host, nor for a robots-blocked path."""
    hosts = {h.host for h in crawled.hits}
    for forbidden in ("169.254.169.254", "fd00:ec2::254", "127.0.0.1", "10.1.2.3", "2852039166", OUTSIDE):
        assert forbidden not in hosts
    assert not crawled.srv.saw(R500, "/page") and not crawled.srv.saw(RTIME, "/page")
    assert not any(h.host == RDIS and h.path.startswith("/private/") for h in crawled.hits)


def test_every_row_is_accounted_for(crawled):
    """One row per canonical URL, each with a known outcome; every request
    the server saw (robots.txt aside) has a fetched, redirect or error row."""
    assert crawled.rows and len(crawled.by_canon) == len(crawled.rows)
    assert {r["outcome"] for r in crawled.rows} <= {"fetched", "redirect", "error", "blocked", "skipped"}
    fetched_like = {r["canonical_url"] for r in crawled.rows if r["outcome"] in ("fetched", "redirect", "error")
                    or (r["error"] or "").startswith("host_parked:")}  # parked after its request
    strip = compile_strip(DEFAULT_STRIP_PARAMS)
    for h in crawled.hits:
        if h.path == "/robots.txt" or h.path.startswith("/rules/"):
            continue
        assert canonicalize(f"http://{h.host}{h.path}", strip) in fetched_like, h


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_case(case: Case, crawled):
    assert crawled.rows, f"the crawl produced no artifact (exit {crawled.proc.returncode}):\n{crawled.proc.stderr[-3000:]}"
    problems = check_row(case, crawled)
    row = crawled.by_canon.get((case.canonical or case.url).format(port=crawled.port), [None])[0]
    assert not problems, f"{case.id}: {case.doc}\n  " + "\n  ".join(problems) + f"\n  row: {row}"
