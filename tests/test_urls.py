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
from crawld.urls import (BadURL, canonicalize, compile_strip, fingerprint, link_record, location_reference, resolve,
                         resolve_link, url_host)

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
    # a "%" that starts no escape means a literal "%" (RFC 3986 2.4), written
    # %25, so that decoding cannot make a new escape ("%3%41" is not "%3A")
    ("http://example.com/50%off", "http://example.com/50%25off"),
    ("http://example.com/%3%41b", "http://example.com/%253Ab"),
    ("http://example.com/%%41", "http://example.com/%25A"),
    ("http://example.com/p?d=50%&e=%3%41", "http://example.com/p?d=50%25&e=%253A"),
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
    # trailing-dot FQDN: the WHATWG URL Standard keeps the dot (a distinct
    # origin to a browser), but it names the same site: crawld drops it, so
    # both forms are one canonical URL, origin and politeness key (below)
    ("http://example.com./", "http://example.com/"),
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
    # the WHATWG serialisation lower-cases the scheme and the host
    ("HTTPS://X.org/p", "https://x.org/p"),
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


# WHATWG URL Standard (https://url.spec.whatwg.org/) ----------------------------
# Links are resolved as browsers resolve them, by the standard's basic URL
# parser; the cases below are where an RFC 3986 resolver (urljoin) differs.

WHATWG_BASE = "http://example.org/dir/page.html"

WHATWG_RESOLVE = [
    # special-authority-ignore-slashes state: any run of slashes and
    # backslashes after the scheme (or instead of it) starts the authority
    ("///test", "http://test/"),
    ("////test/x", "http://test/x"),
    ("/\\/\\//x", "http://x/"),
    ("\\\\server\\share\\f", "http://server/share/f"),
    ("/\\other.example/a", "http://other.example/a"),
    ("http:///x", "http://x/"),
    ("http:\\\\www.example.com\\foo", "http://www.example.com/foo"),
    ("https:/example.com/a", "https://example.com/a"),  # another scheme: its authority follows
    ("https:example.com/a", "https://example.com/a"),
    ("http:sibling.html", "http://example.org/dir/sibling.html"),  # the base's scheme: a relative path
    # backslashes are slashes in paths too
    ("a\\b\\c", "http://example.org/dir/a/b/c"),
    # tabs and newlines anywhere, C0 controls and spaces at the ends, vanish
    ("ht\ttp://exa\nmple.net/p\ra\tth", "http://example.net/path"),
    ("\x00\x1f /x \x7f", "http://example.org/x%20%7F"),
    # dot segments, also percent-encoded ones (single- and double-dot path segment)
    ("a/%2e%2E/b", "http://example.org/dir/b"),
    ("../../../../x", "http://example.org/x"),
    ("./.", "http://example.org/dir/"),
    # percent-encode sets: path, query (special), userinfo dropped
    ("/a b/c\"d<e>f", "http://example.org/a%20b/c%22d%3Ce%3Ef"),
    ("/caf\u00e9?q=\u00e9 '", "http://example.org/caf%C3%A9?q=%C3%A9%20%27"),
    ("/{x}^`", "http://example.org/%7Bx%7D%5E%60"),
    ("/%7Euser/%zz", "http://example.org/%7Euser/%zz"),  # existing escapes are left alone
    # host and port
    ("HTTP://EXAMPLE.Net:80/", "http://example.net/"),
    ("http://example.net:0080", "http://example.net/"),
    ("https://example.net:443?x", "https://example.net/?x"),
    ("http://ex%41mple.net/", "http://example.net/"),  # the host is percent-decoded first
    ("http://[2001:DB8:0:0::1]:8080/", "http://[2001:db8::1]:8080/"),
    ("http://[::127.0.0.1]/", "http://[::7f00:1]/"),
]


@pytest.mark.parametrize("href, expected", WHATWG_RESOLVE, ids=[repr(r[0]) for r in WHATWG_RESOLVE])
def test_resolve_follows_whatwg(href, expected):
    assert resolve(WHATWG_BASE, href) == expected
    assert resolve_link(WHATWG_BASE, href) == (expected, None)
    # what is fetched is printable ASCII, and canonicalises without error
    assert expected.isascii() and expected.isprintable() and " " not in expected
    canonicalize(expected, STRIP)


# IPv4 in hex, octal, or fewer than four parts (IPv4 parser, section 3.5):
# dotted decimal in the URL fetched, in the canonical URL, and so in the host
# the address policy, the politeness key and the fingerprint see
IPV4_FORMS = [
    ("http://0x7f000001/", "http://127.0.0.1/"),
    ("http://0x.0x.0x.0x/", "http://0.0.0.0/"),
    ("http://192.0x00A80001/", "http://192.168.0.1/"),
    ("http://0300.0250.0.01/x", "http://192.168.0.1/x"),
    ("http://127.1/", "http://127.0.0.1/"),
    ("http://2130706433/", "http://127.0.0.1/"),
    ("http://2852039166/latest/", "http://169.254.169.254/latest/"),
    ("http://0x7F.1:8080/", "http://127.0.0.1:8080/"),
    ("http://１２７.０.０.１/", "http://127.0.0.1/"),  # full-width digits map to ASCII first
]


@pytest.mark.parametrize("url, dotted", IPV4_FORMS, ids=[c[0] for c in IPV4_FORMS])
def test_ipv4_forms_become_dotted_decimal(url, dotted):
    assert resolve(WHATWG_BASE, url) == dotted
    assert canonicalize(url, STRIP) == dotted
    assert fingerprint(canonicalize(url, STRIP)) == fingerprint(canonicalize(dotted, STRIP))
    assert politeness_key(url_host(canonicalize(url))) == politeness_key(url_host(dotted))


def test_hex_loopback_is_refused_by_the_address_policy():
    from crawld.config import CrawlConfig
    from crawld.netpolicy import AddressPolicy
    from crawld.scope import Router

    # the worker checks the host of the canonical URL, as routed
    router = Router(CrawlConfig(crawl_id="c1", seeds=("http://www.example.com/",)))
    route = router.route(router.canonical(resolve(WHATWG_BASE, "http://0x7f000001/admin")))
    assert route.host == "127.0.0.1" and route.pkey == "127.0.0.1"
    assert "loopback" in AddressPolicy(allow_loopback=False).check_host(route.host)
    assert AddressPolicy(allow_loopback=True).check_host(route.host) is None
    meta = router.route(router.canonical("http://0xA9FEA9FE/latest/meta-data/"))
    assert meta.host == "169.254.169.254" and AddressPolicy(allow_loopback=True).check_host(meta.host)


# A host name's trailing dot (the DNS root) names the same site: one
# canonical URL and fingerprint, one origin, one politeness key; the URL
# fetched drops it too
TRAILING_DOT = [
    ("http://www.example.com./page", "http://www.example.com/page"),
    ("https://www.example.com.:8443/a?b", "https://www.example.com:8443/a?b"),
    ("http://u:p@www.example.com./", "http://www.example.com/"),
    ("http://1.2.3.4./", "http://1.2.3.4/"),  # an IPv4 address (the standard drops this dot itself)
    ("http://xn--bcher-kva.de./", "http://xn--bcher-kva.de/"),
]


@pytest.mark.parametrize("url, plain", TRAILING_DOT, ids=[c[0] for c in TRAILING_DOT])
def test_trailing_dot_host_is_the_same_site(url, plain):
    from crawld.links import origin_of

    assert resolve(WHATWG_BASE, url) == plain
    a, b = canonicalize(url, STRIP), canonicalize(plain, STRIP)
    assert a == b
    assert fingerprint(a) == fingerprint(b)
    assert origin_of(a) == origin_of(b)
    assert politeness_key(url_host(a)) == politeness_key(url_host(b))


# UTS #46 (nontransitional, as the standard's domain to ASCII runs it):
# the URL fetched carries the mapped, punycode host
UTS46_HOSTS = [
    ("http://ＥＸＡＭＰＬＥ．com/a", "http://example.com/a"),  # full-width letters and full stop
    ("http://example\u3002com/", "http://example.com/"),  # ideographic full stop
    ("http://www\uff61example\uff0ecom/", "http://www.example.com/"),  # halfwidth ideographic full stop
    ("http://exa\u200bmple.com/", "http://example.com/"),  # zero-width space: ignored
    ("http://\u00adexam\u00adple.com/", "http://example.com/"),  # soft hyphens: ignored
    ("http://ex\ufeffample.com/", "http://example.com/"),  # zero-width no-break space: ignored
    ("http://bu\u0308cher.de/", "http://xn--bcher-kva.de/"),  # NFC: u + combining diaeresis
    ("http://BÜCHER.de/", "http://xn--bcher-kva.de/"),
    ("http://faß.de/", "http://xn--fa-hia.de/"),  # nontransitional: ß kept
    ("http://%E2%98%83.net/", "http://xn--n3h.net/"),  # percent-encoded UTF-8, decoded first
]


@pytest.mark.parametrize("url, mapped", UTS46_HOSTS, ids=[c[0] for c in UTS46_HOSTS])
def test_uts46_hosts_are_fetched_mapped(url, mapped):
    import requests

    fetched = resolve(WHATWG_BASE, url)
    assert fetched == mapped
    assert canonicalize(url, STRIP) == canonicalize(fetched, STRIP)
    # what the worker sends is a URL its HTTP client takes as it is
    assert requests.Request("GET", fetched).prepare().url == mapped


# Location header values: http.client hands them over decoded as latin-1
# (one code point per byte); every byte >= 0x80 is percent-encoded as
# received, so UTF-8 gives what browsers request and other bytes stay
LOCATIONS = [
    ("/caf\xe9/", "/caf%E9/", "http://example.org/caf%E9/"),
    ("/caf\xc3\xa9/", "/caf%C3%A9/", "http://example.org/caf%C3%A9/"),
    ("/plain?q=1", "/plain?q=1", "http://example.org/plain?q=1"),
    ("/a b?\xff", "/a b?%FF", "http://example.org/a%20b?%FF"),
    ("http://b\xc3\xbccher.de/x", "http://b%C3%BCcher.de/x", "http://xn--bcher-kva.de/x"),
    ("/\u20ac", "/%E2%82%AC", "http://example.org/%E2%82%AC"),  # not from a header: UTF-8
]


@pytest.mark.parametrize("raw, reference, fetched", LOCATIONS, ids=[repr(c[0]) for c in LOCATIONS])
def test_location_reference(raw, reference, fetched):
    from crawld.fetcher import _location

    assert location_reference(raw) == reference
    assert _location(raw) == reference
    assert resolve("http://example.org/from", location_reference(raw)) == fetched


def test_location_with_a_non_utf8_host_byte_is_invalid():
    # %E9 alone does not decode as UTF-8: U+FFFD, which UTS #46 disallows
    url, why = resolve_link("http://example.org/", location_reference("http://caf\xe9.example/"))
    assert url is None and why and "IDNA" in why


# Links that cannot become URLs: (None, why) for an http(s) link, one line
INVALID_LINKS = [
    ("http://www..example.com/", "empty label"),
    ("//www..example.com/x", "empty label"),
    ("http://." + "a" * 63 + ".com/", "empty label"),
    ("http://" + "a" * 64 + ".example.com/", "over 63 octets"),
    ("http://" + ".".join(["a" * 60] * 5) + "/", "over 253 octets"),
    ("http://example.com../", "empty label"),
    ("http://example.com:99999/", "over 65535"),
    ("http://example.com:8o/", "invalid port"),
    ("http://example.com:0/", "port 0"),
    ("http://0xffffffff1/", "invalid IPv4 address"),
    ("http://1.2.3.4.5/", "invalid IPv4 address"),
    ("http://256.256.256.256/", "invalid IPv4 address"),
    ("http://a.b.c.09/", "invalid IPv4 address"),
    ("http://[::%31]/", "invalid IPv6 address"),
    ("http://[::1/", "invalid IPv6 address"),
    ("http://[1:2:3:4:5:6:7:8:9]/", "invalid IPv6 address"),
    ("http://exa mple.com/", "forbidden code point"),
    ("http://ex<ample.com/", "forbidden code point"),
    ("http://exa%00mple.com/", "forbidden code point"),
    # the standard lets these through; no DNS host name has them (RFC 1123 2.1)
    ("http://a!b.example/", "no DNS host name"),
    ("http://{x}.example/", "no DNS host name"),
    ("https://a\ufffdb.com/", "IDNA"),
    ("http://user@/", "no host"),
    ("http://", "no host"),
    ("https://:443/", "no host"),
]


@pytest.mark.parametrize("href, why", INVALID_LINKS, ids=[repr(c[0][:60]) for c in INVALID_LINKS])
def test_invalid_links_say_why(href, why):
    url, reason = resolve_link(WHATWG_BASE, href)
    assert url is None and reason, (url, reason)
    assert why in reason and "\n" not in reason and reason.isascii() and reason.isprintable()
    assert resolve(WHATWG_BASE, href) is None
    with pytest.raises(BadURL):
        canonicalize(absolute_form(href), STRIP)


def absolute_form(href: str) -> str:
    """A scheme-relative href made absolute (the BadURL check needs one)."""
    return "http:" + href if href.startswith("//") else href


NOT_LINKS = ["", "   ", "#", "#top", " \t#x", "mailto:a@example.com", "javascript:void(0)", "java\nscript:x",
             "data:,x", "tel:+1", "ftp://[bad", "file:///etc/passwd", "view-source:http://x/", "about:blank"]


@pytest.mark.parametrize("href", NOT_LINKS, ids=[repr(h) for h in NOT_LINKS])
def test_not_links(href):
    assert resolve_link(WHATWG_BASE, href) == (None, None)


LINK_RECORDS = [
    ("http://www..example.com/", "http://www..example.com/"),
    ("  http://exa mple.com/a b#frag\n", "http://exa%20mple.com/a%20b"),
    ("http://user:s3cret@www..example.com/x", "http://www..example.com/x"),  # credentials never stored
    ("//u@bad..host/", "//bad..host/"),
    ("http://exa\tmple..com/", "http://example..com/"),  # tabs and newlines removed, as the parser does
    ("http://caf\u00e9..fr/\u00e9", "http://caf%C3%A9..fr/%C3%A9"),
    ("http://a\x00b/", "http://a%00b/"),
    ("http://x@y@z:99999/", "http://z:99999/"),
]


@pytest.mark.parametrize("href, record", LINK_RECORDS, ids=[repr(c[0]) for c in LINK_RECORDS])
def test_link_record_is_printable_ascii(href, record):
    got = link_record(href)
    assert got == record
    assert got.isascii() and got.isprintable() and " " not in got


def test_resolve_without_base_takes_absolute_urls_only():
    assert resolve(None, "HTTP://Example.com/a#b") == "http://example.com/a"
    assert resolve_link(None, "/relative") == (None, "not an absolute URL")
    assert resolve_link(None, "mailto:x@example.com") == (None, None)
