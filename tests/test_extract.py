"""crawld.extract: audit fields and links from HTML bytes.

Encodings follow the HTML Standard's encoding sniffing algorithm and the
WHATWG Encoding Standard, which is what a browser shows for the same bytes.
"""

from __future__ import annotations

import os
import random
from html.parser import HTMLParser
from pathlib import Path

import pytest

from crawld.extract import HTML_TYPES, MAX_REFRESH_DELAY, Page, parse_content_type, parse_html, parse_refresh

PYDOCS = Path("/usr/share/doc/python3-doc/html")

# (id, body, header charset, expected fields)
CASES = [
    ("title-whitespace",
     b"<html><head><title>  Hello \n\t World  </title></head><body></body></html>", None,
     {"title": "Hello World"}),
    ("title-entities", b"<title>a &amp; b &#8212; c</title>", None, {"title": "a & b \u2014 c"}),
    ("title-empty", b"<title></title>", None, {"title": None}),
    ("title-blank", b"<title>   \n </title>", None, {"title": None}),
    ("title-first-wins", b"<head><title>x</title></head><body><title>y</title></body>", None, {"title": "x"}),
    ("no-title", b"<p>hello</p>", None, {"title": None}),
    ("meta-robots-case",
     b"<head><title>Hi</title><META NAME='Robots' CONTENT=' NoIndex , NOFOLLOW '></head>", None,
     {"title": "Hi", "meta_robots": "noindex,nofollow"}),
    ("meta-robots-name-spaces",
     b"<head><meta name=' ROBOTS ' content='noindex,,nofollow,'></head>", None,
     {"meta_robots": "noindex,nofollow"}),
    ("meta-robots-after-other-meta",
     b"<head><meta name='description' content='d'><meta name='robots' content='NOARCHIVE'></head>", None,
     {"meta_robots": "noarchive"}),
    ("meta-googlebot-is-not-robots",
     b"<head><meta name='googlebot' content='noindex'></head>", None, {"meta_robots": None}),
    ("canonical-simple",
     b"<head><link rel='canonical' href='https://example.com/a'></head>", None,
     {"canonical_link": "https://example.com/a"}),
    ("canonical-tokens-case",
     b"<head><link rel='Alternate CANONICAL' href=' http://x/a '><link rel=canonical href=/b></head>", None,
     {"canonical_link": "http://x/a"}),
    ("canonical-not-a-token",
     b"<head><link rel='canonical-ish' href='/x'><link rel='stylesheet' href='/s.css'></head>", None,
     {"canonical_link": None}),
    ("base-href", b"<head><base href=' /base/ '></head><a href='a'>x</a>", None,
     {"base_href": "/base/", "hrefs": ["a"]}),
    ("base-without-href", b"<head><base target='_blank'></head>", None, {"base_href": None}),
    ("hrefs-a-area-dedup-order",
     b"<body><a href='a'>x</a><map><area href='b'></map><a href='a'>dup</a><a href='#'>h</a>"
     b"<a>no href</a><a href=''>empty</a><a href='c'>c</a><area href='b'><a href='d'>d</a></body>", None,
     {"hrefs": ["a", "b", "#", "c", "d"], "nofollow": set()}),
    ("hrefs-not-from-link-or-img",
     b"<head><link href='/style.css' rel=stylesheet></head><img src='/i.png'><a href='/x'>x</a>", None,
     {"hrefs": ["/x"]}),
    ("hrefs-entities-decoded", b"<a href='/a?x=1&amp;y=2'>a</a>", None, {"hrefs": ["/a?x=1&y=2"]}),
    ("nofollow",
     b"<a href='x' rel='nofollow'>x</a><a href='y' rel='external NoFollow'>y</a><a href='z' rel='noopener'>z</a>",
     None, {"hrefs": ["x", "y", "z"], "nofollow": {"x", "y"}}),
    # rel is a set of space-separated tokens (HTML Standard), as for canonical
    ("nofollow-is-a-token",
     b"<a href='x' rel='nofollowed'>x</a><a href='y' rel='x-nofollow'>y</a><a href='z' rel='ugc nofollow'>z</a>",
     None, {"hrefs": ["x", "y", "z"], "nofollow": {"z"}}),
    ("garbage-markup",
     b"<html><title>t</title><a href=/1>one<a href=/2>two</a></p></div></b><a href=\"/3", None,
     {"title": "t", "hrefs": ["/1", "/2"]}),
    # encodings: the Content-Type charset
    ("header-utf8", "<title>caf\u00e9 \u20ac \u65e5\u672c</title>".encode("utf-8"), "utf-8",
     {"title": "caf\u00e9 \u20ac \u65e5\u672c"}),
    ("header-windows-1252", "<title>caf\u00e9 \u20ac \u2019</title>".encode("cp1252"), "windows-1252",
     {"title": "caf\u00e9 \u20ac \u2019"}),
    ("header-latin1-plain", "<title>caf\u00e9 na\u00efve</title>".encode("latin-1"), "iso-8859-1",
     {"title": "caf\u00e9 na\u00efve"}),
    # WHATWG Encoding Standard: the labels "iso-8859-1", "latin1" and
    # "us-ascii" all mean windows-1252; browsers show 0x80 as the euro sign
    # and 0x92 as a right single quote
    ("header-iso-8859-1-cp1252-bytes", "<title>caf\u00e9 \u20ac \u2019</title>".encode("cp1252"), "iso-8859-1",
     {"title": "caf\u00e9 \u20ac \u2019"}),
    ("header-latin1-cp1252-bytes", "<title>\u201cquoted\u201d</title>".encode("cp1252"), "latin1",
     {"title": "\u201cquoted\u201d"}),
    ("header-cp1252-href", b"<a href=\"/caf\xe9\">x</a>", "windows-1252", {"hrefs": ["/caf\u00e9"]}),
    # encodings: no header charset, sniffed from <meta>
    ("meta-charset-windows-1251",
     "<html><head><meta charset='windows-1251'><title>\u041f\u0440\u0438\u0432\u0435\u0442</title></head></html>"
     .encode("cp1251"), None, {"title": "\u041f\u0440\u0438\u0432\u0435\u0442"}),
    ("meta-http-equiv-windows-1251",
     "<html><head><meta http-equiv='Content-Type' content='text/html; charset=windows-1251'>"
     "<title>\u041f\u0440\u0438\u0432\u0435\u0442</title></head></html>".encode("cp1251"), None,
     {"title": "\u041f\u0440\u0438\u0432\u0435\u0442"}),
    ("meta-charset-shift_jis",
     "<html><head><meta charset='shift_jis'><title>\u65e5\u672c\u8a9e\u306e\u30da\u30fc\u30b8</title></head>"
     "<body><a href='/\u30da\u30fc\u30b8'>p</a></body></html>".encode("shift_jis"), None,
     {"title": "\u65e5\u672c\u8a9e\u306e\u30da\u30fc\u30b8", "hrefs": ["/\u30da\u30fc\u30b8"]}),
    ("unknown-header-charset-falls-back-to-meta",
     "<meta charset='windows-1251'><title>\u041f\u0440\u0438\u0432\u0435\u0442</title>".encode("cp1251"),
     "x-no-such-charset", {"title": "\u041f\u0440\u0438\u0432\u0435\u0442"}),
    ("no-charset-utf8-body", "<title>\u65e5\u672c\u8a9e</title>".encode("utf-8"), None, {"title": "\u65e5\u672c\u8a9e"}),
    # encodings: byte order marks
    ("utf8-bom-no-header", b"\xef\xbb\xbf<title>\xc3\xa9</title>", None, {"title": "\u00e9"}),
    ("utf8-bom-header-utf8", b"\xef\xbb\xbf<title>\xc3\xa9</title>", "utf-8", {"title": "\u00e9"}),
    ("utf16le-bom-no-header", "\ufeff<title>\u00e9</title>".encode("utf-16-le"), None, {"title": "\u00e9"}),
    # HTML Standard encoding sniffing, step 1: a BOM wins over the
    # Content-Type charset
    ("utf8-bom-beats-header-latin1",
     b"\xef\xbb\xbf<html><head><title>\xc3\xa9t\xc3\xa9</title></head><body><a href=\"/\xc3\xa9\">x</a></body></html>",
     "iso-8859-1", {"title": "\u00e9t\u00e9", "hrefs": ["/\u00e9"]}),
    # invalid bytes never raise; they decode as U+FFFD
    ("invalid-utf8-header", b"<title>bad \xff\xfe\xc3 utf8</title>", "utf-8", {"title": "bad \ufffd\ufffd\ufffd utf8"}),
    ("invalid-utf8-no-header", b"<title>bad \xff utf8</title><a href='/ok'>ok</a>", None, {"hrefs": ["/ok"]}),
    ("empty-body", b"", None, {"title": None, "meta_robots": None, "canonical_link": None, "base_href": None,
                               "hrefs": [], "nofollow": set()}),
    ("empty-body-utf8", b"", "utf-8", {"title": None, "hrefs": []}),
    ("nul-bytes", b"\x00\x00\x00<title>x</title>", None, {"title": "x"}),
]


@pytest.mark.parametrize("body, charset, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parse_html(body, charset, expected):
    page = parse_html(body, charset)
    assert isinstance(page, Page)
    got = {k: getattr(page, k) for k in expected}
    assert got == expected


def test_header_charset_wins_over_meta():
    # HTML Standard: the transport-layer charset comes before the <meta> prescan
    body = "<meta charset='windows-1251'><title>\u041f\u0440\u0438</title>".encode("cp1251")
    title = parse_html(body, "utf-8").title
    assert title is not None and "\u041f" not in title and "\ufffd" in title


@pytest.mark.parametrize("seed", range(20))
def test_binary_garbage_never_raises(seed):
    rnd = random.Random(seed)
    body = bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(1, 20000)))
    for cs in (None, "utf-8", "iso-8859-1", "shift_jis", "utf-16", "bogus"):
        page = parse_html(body, cs)
        assert isinstance(page.hrefs, list)
        assert page.title is None or (isinstance(page.title, str) and len(page.title) <= 2000)


def test_every_byte_value_never_raises():
    body = bytes(range(256)) * 64 + os.urandom(4096)
    parse_html(body)
    parse_html(body, "utf-8")


def test_huge_title_is_capped():
    page = parse_html(b"<title>" + b"word " * 10000 + b"</title>")
    assert page.title is not None and len(page.title) == 2000 and page.title.startswith("word word")


def test_many_links_kept_in_order():
    body = b"".join(b"<a href='/p/%d'>%d</a>" % (i % 3000, i) for i in range(6000))
    assert parse_html(body, "utf-8").hrefs == [f"/p/{i}" for i in range(3000)]


CONTENT_TYPES = [
    ('text/HTML; Charset="UTF-8"', ("text/html", "utf-8")),
    ("text/html", ("text/html", None)),
    ("text/html;charset=ISO-8859-1", ("text/html", "iso-8859-1")),
    ("text/html; charset='utf-8'", ("text/html", "utf-8")),
    ("application/xhtml+xml; charset=utf-8; foo=bar", ("application/xhtml+xml", "utf-8")),
    ("text/html; foo=bar; CHARSET = Shift_JIS ", ("text/html", "shift_jis")),
    ("text/html; charset=", ("text/html", None)),
    ("TEXT/PLAIN", ("text/plain", None)),
    ("  application/json  ", ("application/json", None)),
    ("image/png; name=x.png", ("image/png", None)),
    ("", (None, None)),
    (None, (None, None)),
]


@pytest.mark.parametrize("value, expected", CONTENT_TYPES, ids=[repr(c[0]) for c in CONTENT_TYPES])
def test_parse_content_type(value, expected):
    assert parse_content_type(value) == expected


def test_html_types():
    assert parse_content_type("text/html; charset=utf-8")[0] in HTML_TYPES
    assert parse_content_type("Application/XHTML+XML")[0] in HTML_TYPES
    assert parse_content_type("text/plain")[0] not in HTML_TYPES


# <meta http-equiv=refresh> ------------------------------------------------------
# HTML Living Standard 4.2.5.3 (refresh state), "shared declarative refresh
# steps": (content, (delay, raw URL string) or None where the steps return)
REFRESH_VALUES = [
    # a time, then ";" / "," / whitespace, then "URL=" in any case (optional)
    ("0;url=http://example.com/", (0, "http://example.com/")),
    ("0; URL=http://example.com/", (0, "http://example.com/")),
    ("0,Url=/next", (0, "/next")),
    ("0 url=/next", (0, "/next")),
    ("3 ; uRl = /spaced", (3, "/spaced")),
    # quotes: the URL ends at the closing quote, whatever follows
    ("0;url='http://example.com/'", (0, "http://example.com/")),
    ('0; url="http://example.com/a b"', (0, "http://example.com/a b")),
    ("0;url='http://example.com/' and then junk", (0, "http://example.com/")),
    ("0;url='unterminated", (0, "unterminated")),
    ("0; 'quoted-without-url='", (0, "quoted-without-url=")),
    # no "url=" at all: the rest is the URL
    ("0; http://x/", (0, "http://x/")),
    ("0;http://x/", (0, "http://x/")),
    ("0; urn:x", (0, "urn:x")),        # "u", "r", then not "l": the whole rest is the URL
    ("0; url", (0, "url")),            # "url" without "=": the whole rest is the URL
    ("0; url = ", (0, "")),            # an empty URL: the document's base URL
    # newlines and other ASCII whitespace around the parts (the URL keeps
    # its own; the URL parser trims them later)
    ("\n 0\n;\n url=\n /nl \n", (0, "/nl \n")),
    ("\t5\x0c;\rurl=/ff", (5, "/ff")),
    # the delay: digits, a fraction ignored, ".5" is 0
    ("5", (5, None)),
    (" 5 ", (5, None)),
    ("5;", (5, None)),
    ("1.5; url=/f", (1, "/f")),
    (".5,url=/z", (0, "/z")),
    ("5.5.5", (5, None)),
    ("9" * 5000, (MAX_REFRESH_DELAY, None)),  # saturated (and no int() of 5000 digits)
    ("2147483648;url=/late", (MAX_REFRESH_DELAY, "/late")),
    # the steps return (no refresh)
    ("", None),
    ("   ", None),
    ("url=/x", None),                  # no time
    ("; url=/x", None),
    ("-1; url=/x", None),
    ("5abc", None),                    # after the time: not ; , or whitespace
    ("\u00a05; url=/x", None),        # NO-BREAK SPACE is not ASCII whitespace
    ("0; url=javascript:alert(1)", None),
    ("0; url=' JavaScript:alert(1)'", None),
]


@pytest.mark.parametrize("content, expected", REFRESH_VALUES, ids=[repr(c[0][:40]) for c in REFRESH_VALUES])
def test_parse_refresh(content, expected):
    assert parse_refresh(content) == expected


# (id, document, expected (refresh_delay, refresh_url))
REFRESH_PAGES = [
    ("head", b"<head><meta http-equiv='refresh' content='0;url=/moved'></head>", (0, "/moved")),
    ("http-equiv-any-case", b"<meta HTTP-EQUIV='ReFrEsH' content='7; URL=/a'>", (7, "/a")),
    ("http-equiv-not-trimmed", b"<meta http-equiv=' refresh' content='0;url=/a'>", (None, None)),
    ("in-body", b"<body><p>moved<meta http-equiv=refresh content='2;url=/b'></body>", (2, "/b")),
    ("first-valid-wins", b"<meta http-equiv=refresh content='soon'><meta http-equiv=refresh content='4;url=/c'>"
                         b"<meta http-equiv=refresh content='0;url=/d'>", (4, "/c")),
    ("empty-content-skipped", b"<meta http-equiv=refresh content=''><meta http-equiv=refresh content='1;url=/e'>",
     (1, "/e")),
    ("no-content", b"<meta http-equiv=refresh>", (None, None)),
    ("javascript-skipped", b"<meta http-equiv=refresh content='0;url=javascript:x()'>"
                           b"<meta http-equiv=refresh content='0;url=/f'>", (0, "/f")),
    ("reload-only", b"<meta http-equiv=refresh content='30'>", (30, None)),
    ("entities-decoded", b"<meta http-equiv=refresh content='0;url=/g?a=1&amp;b=2'>", (0, "/g?a=1&b=2")),
    # scripting is on (as in browsers): <noscript> content is text, not a <meta>
    ("noscript-ignored", b"<head><noscript><meta http-equiv=refresh content='0;url=/ns'></noscript></head>",
     (None, None)),
    ("other-http-equiv", b"<meta http-equiv='content-type' content='0; url=/h'>", (None, None)),
    ("none", b"<title>t</title>", (None, None)),
]


@pytest.mark.parametrize("body, expected", [c[1:] for c in REFRESH_PAGES], ids=[c[0] for c in REFRESH_PAGES])
def test_meta_refresh_of_a_page(body, expected):
    page = parse_html(body, "utf-8")
    assert (page.refresh_delay, page.refresh_url) == expected


# real pages: the Python documentation of Debian's python3-doc ---------------

class _Oracle(HTMLParser):
    """Independent extraction with the standard library's HTML tokenizer."""

    def __init__(self):
        super().__init__()
        self.hrefs: list[str] = []
        self.nofollow: set[str] = set()
        self.title: str | None = None
        self._title: list[str] | None = None
        self._seen_title = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("a", "area") and a.get("href") and a["href"] not in self.hrefs:
            self.hrefs.append(a["href"])
            if "nofollow" in (a.get("rel") or "").lower().split():
                self.nofollow.add(a["href"])
        if tag == "title" and not self._seen_title:
            self._title, self._seen_title = [], True

    def handle_endtag(self, tag):
        if tag == "title" and self._title is not None:
            self.title = " ".join("".join(self._title).split()) or None
            self._title = None

    def handle_data(self, data):
        if self._title is not None:
            self._title.append(data)


DOC_PAGES = [
    ("index.html", lambda t: t.endswith("Documentation"), 20),
    ("library/os.html", lambda t: t.startswith("os \u2014 Miscellaneous operating system interfaces"), 400),
    ("library/index.html", lambda t: t.startswith("The Python Standard Library"), 200),
    ("tutorial/index.html", lambda t: t.startswith("The Python Tutorial"), 100),
    ("reference/datamodel.html", lambda t: "Data model" in t, 200),
    ("genindex-all.html", lambda t: t.startswith("Index"), 5000),
]


@pytest.fixture(scope="module")
def docs_root() -> Path:
    if not (PYDOCS / "index.html").exists():
        pytest.fail("python3-doc is not installed at /usr/share/doc/python3-doc/html")
    return PYDOCS


@pytest.mark.parametrize("rel, title_ok, min_links", DOC_PAGES, ids=[d[0] for d in DOC_PAGES])
@pytest.mark.parametrize("charset", ["utf-8", None])
def test_python_docs_pages(docs_root, rel, title_ok, min_links, charset):
    body = (docs_root / rel).read_bytes()
    page = parse_html(body, charset)
    assert page.title and title_ok(page.title), page.title
    assert "\n" not in page.title and "  " not in page.title
    assert len(page.hrefs) >= min_links
    assert len(page.hrefs) == len(set(page.hrefs))
    oracle = _Oracle()
    oracle.feed(body.decode("utf-8"))
    oracle.close()
    assert page.title == oracle.title
    assert page.hrefs == oracle.hrefs
    assert page.nofollow == oracle.nofollow
    assert page.base_href is None


def test_python_docs_relative_links_resolve(docs_root):
    from crawld.urls import canonicalize, resolve
    base = "http://docs.pyref-test.org/library/os.html"
    page = parse_html((docs_root / "library/os.html").read_bytes(), "utf-8")
    resolved = {resolve(base, h) for h in page.hrefs} - {None}
    canon = {canonicalize(u) for u in resolved}
    assert "http://docs.pyref-test.org/library/os.path.html" in canon
    assert "http://docs.pyref-test.org/contents.html" in canon
    assert "https://www.python.org/" in canon
