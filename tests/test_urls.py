"""crawld.urls: canonicalisation, link resolution and fingerprints (pure functions).

Expected values follow RFC 3986 section 6 (syntax- and scheme-based
normalisation) and, where browsers and RFC 3986 differ, the WHATWG URL
Standard, since the crawler must fetch the URL a browser would fetch.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from crawld.config import DEFAULT_STRIP_PARAMS
from crawld.sharding import politeness_key
from crawld.urls import BadURL, canonicalize, compile_strip, fingerprint, resolve, url_host

STRIP = compile_strip(DEFAULT_STRIP_PARAMS)

# (input, expected canonical URL with the default strip list)
CANON = [
    # scheme and host are case-insensitive; the path is not
    ("HTTP://Example.COM/", "http://example.com/"),
    ("HTTPS://EXAMPLE.COM/PATH/File.HTML", "https://example.com/PATH/File.HTML"),
    # the docstring's own example
    ("HTTP://Example.COM:80/a/../b?z=1&utm_source=x&a=2#top", "http://example.com/b?a=2&z=1"),
    # default ports removed, other ports kept
    ("http://example.com:80/x", "http://example.com/x"),
    ("https://example.com:443/x", "https://example.com/x"),
    ("http://example.com:0080/", "http://example.com/"),
    ("http://example.com:8080/x", "http://example.com:8080/x"),
    ("https://example.com:8443/", "https://example.com:8443/"),
    ("http://example.com:443/", "http://example.com:443/"),  # 443 is not http's default
    ("https://example.com:80/", "https://example.com:80/"),  # 80 is not https's default
    ("http://example.com:/", "http://example.com/"),  # empty port = default
    # empty path -> "/"
    ("http://example.com", "http://example.com/"),
    ("http://example.com:80", "http://example.com/"),
    ("http://example.com?b=2&a=1", "http://example.com/?a=1&b=2"),
    ("http://example.com:80?x=1", "http://example.com/?x=1"),
    # fragments dropped
    ("http://example.com/page#section-2", "http://example.com/page"),
    ("http://example.com/?a=1#f", "http://example.com/?a=1"),
    ("http://example.com/#", "http://example.com/"),
    # query arguments sorted (stable for repeated names)
    ("http://example.com/?z=1&a=2&m=3", "http://example.com/?a=2&m=3&z=1"),
    ("http://example.com/?b=1&a=2&a=1", "http://example.com/?a=1&a=2&b=1"),
    ("http://example.com/?&&a=1", "http://example.com/?a=1"),
    # tracking parameters (config.DEFAULT_STRIP_PARAMS)
    ("http://example.com/?utm_source=x", "http://example.com/"),
    ("http://example.com/?utm_medium=email&utm_campaign=spring&id=7", "http://example.com/?id=7"),
    ("http://example.com/?gclid=abc&fbclid=def&q=3", "http://example.com/?q=3"),
    ("http://example.com/p?msclkid=1&dclid=2&gbraid=3&wbraid=4&keep=1", "http://example.com/p?keep=1"),
    ("http://example.com/?mc_cid=1&mc_eid=2&_hsenc=3&_hsmi=4", "http://example.com/"),
    ("http://example.com/?a=1&utm_source=x&", "http://example.com/?a=1"),
    ("http://example.com/path/?gclid=x#y", "http://example.com/path/"),
    ("http://example.com/?fbclid", "http://example.com/"),  # no value
    ("http://example.com/?gclidx=1", "http://example.com/?gclidx=1"),  # exact names are exact
    ("http://example.com/?xutm_source=1", "http://example.com/?xutm_source=1"),  # prefix, not substring
    # dot segments (RFC 3986 5.2.4)
    ("http://example.com/a/./b/../c", "http://example.com/a/c"),
    ("http://example.com/a/b/../../..", "http://example.com/"),
    ("http://example.com/./a", "http://example.com/a"),
    ("http://example.com/%2e%2e/a", "http://example.com/a"),
    # percent-encoding: unreserved decoded, hex upper-cased, non-ASCII UTF-8 encoded
    ("http://example.com/%7euser", "http://example.com/~user"),
    ("http://example.com/%41%42c", "http://example.com/ABc"),
    ("http://example.com/a%2fb", "http://example.com/a%2Fb"),  # reserved stays encoded
    ("http://example.com/caf%c3%a9", "http://example.com/caf%C3%A9"),
    ("http://example.com/café", "http://example.com/caf%C3%A9"),
    ("http://example.com/a b", "http://example.com/a%20b"),
    ("http://example.com/?q=€", "http://example.com/?q=%E2%82%AC"),
    # IDN host -> punycode (UTS #46 mapping: case fold, full-width forms)
    ("http://bücher.de/", "http://xn--bcher-kva.de/"),
    ("http://BÜCHER.de:80", "http://xn--bcher-kva.de/"),
    ("http://münchen.de/straße", "http://xn--mnchen-3ya.de/stra%C3%9Fe"),
    ("http://例え.テスト/", "http://xn--r8jz45g.xn--zckzah/"),
    ("http://ＥＸＡＭＰＬＥ.com/", "http://example.com/"),
    ("http://xn--bcher-kva.de/", "http://xn--bcher-kva.de/"),
    # nontransitional IDNA (IDNA2008 / WHATWG URL Standard, what browsers
    # resolve): "faß.de" is its own domain, not "fass.de"
    ("http://faß.de/", "http://xn--fa-hia.de/"),
    # userinfo dropped
    ("http://user:pw@example.com/", "http://example.com/"),
    ("http://user:pw@example.com:80/", "http://example.com/"),
    ("http://user@example.com:8080/x", "http://example.com:8080/x"),
    ("http://u:p%40ss@Example.com/", "http://example.com/"),
    ("http://u@[::1]:80/", "http://[::1]/"),
    # IPv6 and IPv4 literal hosts
    ("http://[::1]/", "http://[::1]/"),
    ("http://[::1]:8080/", "http://[::1]:8080/"),
    ("http://[2001:DB8::1]:80/x", "http://[2001:db8::1]/x"),
    ("http://1.2.3.4:80/", "http://1.2.3.4/"),
    # whitespace a browser ignores
    ("  http://example.com/\n", "http://example.com/"),
    ("http://exa\tmple.com/pa\nth", "http://example.com/path"),
    # trailing-dot FQDN: kept, as the WHATWG URL Standard and browsers keep it
    # (it is a distinct origin); both forms share a politeness key (see below)
    ("http://example.com./", "http://example.com./"),
]


@pytest.mark.parametrize("url, expected", CANON, ids=[c[0] for c in CANON])
def test_canonicalize(url, expected):
    assert canonicalize(url, STRIP) == expected


@pytest.mark.parametrize("url, expected", CANON, ids=[c[0] for c in CANON])
def test_canonicalize_is_idempotent(url, expected):
    canon = canonicalize(url, STRIP)
    assert canonicalize(canon, STRIP) == canon


def test_tracking_params_kept_without_strip_list():
    assert canonicalize("http://example.com/?utm_source=x&a=1") == "http://example.com/?a=1&utm_source=x"


def test_custom_strip_list():
    strip = compile_strip(["sessionid", "ref_*"])
    assert strip == (frozenset({"sessionid"}), ("ref_",))
    url = "http://example.com/?sessionid=9&ref_src=tw&ref=1&utm_source=x"
    assert canonicalize(url, strip) == "http://example.com/?ref=1&utm_source=x"


def test_trailing_dot_host_shares_politeness_key():
    a = url_host(canonicalize("http://www.example.com./"))
    b = url_host(canonicalize("http://www.example.com/"))
    assert politeness_key(a) == politeness_key(b) == "example.com"


BAD = [
    "mailto:someone@example.com",
    "javascript:alert(1)",
    "JavaScript:void(0)",
    "ftp://example.com/file",
    "data:text/html,hello",
    "file:///etc/passwd",
    "/relative/path",
    "relative/path.html",
    "?a=1",
    "//example.com/protocol-relative",
    "http//example.com",
    "",
    "   ",
    "http://",
    "http:///x",
    "https://",
    "http://:80/",
    "http://user@/",
    "http://example.com:99999/",
    "http://example.com:65536/",
    "http://example.com:abc/",
    "http://example.com:-1/",
    "http://example.com:+80/",
    "http://[::1]:99999/",
    "http://[::1/",
    # hosts with forbidden code points (RFC 3986 reg-name; WHATWG "forbidden
    # host code point"): the docstring promises BadURL for an invalid host
    "http://exa mple.com/",
    "http://ex<ample.com/",
    "http://exam\x00ple.com/",
]


@pytest.mark.parametrize("url", BAD, ids=[repr(b) for b in BAD])
def test_canonicalize_rejects(url):
    with pytest.raises(BadURL) as info:
        canonicalize(url, STRIP)
    msg = str(info.value)
    assert msg and "\n" not in msg


def test_badurl_is_valueerror():
    assert issubclass(BadURL, ValueError)


@pytest.mark.parametrize("url, host", [
    ("http://example.com/", "example.com"),
    ("http://[::1]:8080/", "::1"),
    ("http://xn--bcher-kva.de/", "xn--bcher-kva.de"),
    ("http://1.2.3.4/", "1.2.3.4"),
])
def test_url_host(url, host):
    assert url_host(url) == host


BASE = "https://docs.example.org/3/library/os.html?x=1#top"

RESOLVE = [
    # not links to fetch
    ("", None),
    ("   ", None),
    ("#frag", None),
    ("#", None),
    ("\t#x", None),
    ("mailto:a@example.com", None),
    ("MAILTO:a@example.com", None),
    ("javascript:void(0)", None),
    ("JavaScript:alert(1)", None),
    (" javascript:x", None),
    ("java\nscript:alert(1)", None),  # tab/newline removed first, as browsers do
    ("data:text/html,x", None),
    ("data:,", None),
    ("tel:+1-555-0100", None),
    ("sms:123", None),
    ("file:///etc/passwd", None),
    ("ftp://example.com/f", None),
    ("about:blank", None),
    ("urn:isbn:123", None),
    # RFC 3986 scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ): these are
    # non-http(s) schemes too and must not come back as links
    ("view-source:https://x.org/", None),
    ("git+ssh://host/repo.git", None),
    ("android-app://com.example/https/x", None),
    # protocol-relative: base's scheme
    ("//other.org/x", "https://other.org/x"),
    ("//other.org/x#frag", "https://other.org/x"),
    # relative paths
    ("../index.html", "https://docs.example.org/3/index.html"),
    ("../../a/b", "https://docs.example.org/a/b"),
    ("sub/page.html#sec", "https://docs.example.org/3/library/sub/page.html"),
    ("./", "https://docs.example.org/3/library/"),
    ("..", "https://docs.example.org/3/"),
    ("/abs", "https://docs.example.org/abs"),
    ("a/b:c", "https://docs.example.org/3/library/a/b:c"),  # colon after a slash is not a scheme
    # whitespace inside and around the href
    (" /abs \n", "https://docs.example.org/abs"),
    ("/a\tb\nc", "https://docs.example.org/abc"),
    ("pa\tge.html", "https://docs.example.org/3/library/page.html"),
    ("\n  ../x.html\r\n", "https://docs.example.org/3/x.html"),
    # query-only references replace the base's query (RFC 3986 5.2.2)
    ("?a=1", "https://docs.example.org/3/library/os.html?a=1"),
    ("?a=1#f", "https://docs.example.org/3/library/os.html?a=1"),
    # absolute http(s) URLs: fragment dropped, otherwise as given
    ("http://x.org/a#b", "http://x.org/a"),
    ("https://x.org/", "https://x.org/"),
    ("HTTPS://X.org/p", "https://X.org/p"),
]


@pytest.mark.parametrize("href, expected", RESOLVE, ids=[repr(r[0]) for r in RESOLVE])
def test_resolve(href, expected):
    assert resolve(BASE, href) == expected


def test_resolve_result_never_has_fragment():
    for href, _ in RESOLVE:
        r = resolve(BASE, href)
        assert r is None or "#" not in r


def test_resolve_then_canonicalize_docs_link():
    r = resolve("https://Docs.Example.org:443/3/library/os.html", "../tutorial/index.html?utm_source=nav#intro")
    assert canonicalize(r, STRIP) == "https://docs.example.org/3/tutorial/index.html"


# fingerprints ---------------------------------------------------------------

def test_fingerprint_is_8_bytes():
    fp = fingerprint("http://example.com/")
    assert isinstance(fp, bytes) and len(fp) == 8


def test_fingerprint_is_blake2b_64():
    url = "https://docs.python.org/3/library/os.html"
    assert fingerprint(url) == hashlib.blake2b(url.encode(), digest_size=8).digest()


def test_fingerprint_pinned_value():
    # pinned: the seen sets in Redis hold these bytes; a change of algorithm
    # would make every existing crawl re-fetch everything
    assert fingerprint("http://example.com/").hex() == "fb2241160c9dad06"


def test_fingerprint_stable_across_processes():
    # unlike hash(), independent of PYTHONHASHSEED
    code = "from crawld.urls import fingerprint; print(fingerprint('http://example.com/a?b=1').hex())"
    outs = set()
    for seed in ("0", "1", "12345"):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"})
        outs.add(p.stdout.strip())
    assert outs == {fingerprint("http://example.com/a?b=1").hex()}


def test_fingerprint_distinguishes_urls():
    urls = [f"http://example.com/page/{i}" for i in range(20000)]
    assert len({fingerprint(u) for u in urls}) == len(urls)


def test_equivalent_urls_share_a_fingerprint():
    a = canonicalize("HTTP://Example.com:80/a/./b?y=2&x=1&utm_source=z#frag", STRIP)
    b = canonicalize("http://example.com/a/b?x=1&y=2", STRIP)
    assert fingerprint(a) == fingerprint(b)
