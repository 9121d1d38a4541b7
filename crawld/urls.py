"""Links and URLs as browsers parse them, canonical URLs and fingerprints
(pure functions).

Parsing follows the WHATWG URL Standard (https://url.spec.whatwg.org/),
the parser browsers use, through ada (PyPI ``ada-url``, a conformant C++
parser; it passes every entry of the web-platform-tests ``urltestdata.json``
it ships with).  ada does the work RFC 3986 resolvers such as
``urllib.parse.urljoin`` get wrong for links: ``///x`` and ``\\\\x`` are
scheme-relative, backslashes are slashes, tabs and newlines vanish, IPv4
hosts written in hex, octal or fewer than four parts are dotted decimal,
and hosts go through UTS #46 (nontransitional) to IDNA.

:func:`resolve_link` turns an href into the URL crawld fetches: the
WHATWG serialisation (``href``) of the parsed URL, always ASCII,
percent-encoded, with these deliberate differences:

* a reference that is empty or only a fragment is not a link (it names the
  page it is on), nor is one whose scheme is not http or https;
* the fragment is dropped (it is never sent);
* userinfo is dropped: a crawler never sends credentials found in a link;
* a trailing dot of a host name is dropped (``www.example.com.`` is the
  same site as ``www.example.com``: one canonical URL, one origin, one
  politeness key, and one request whichever form was found first);
* a host DNS cannot resolve is invalid (UTS #46 with VerifyDnsLength, as
  RFC 1034 section 3.1 limits names): an empty label (``www..example.com``),
  a label over 63 octets or a name over 253, or a character outside
  letters, digits, ``-``, ``_``, ``~`` and ``.`` (the standard lets
  ``!$&'()*+,;=`{}`` and ``"`` through); so is port 0, which no server can
  listen on (and the Fetch Standard blocks).

The canonical URL (:func:`canonicalize`) is what dedup, sharding and the
artifact's ``canonical_url`` use: that fetched URL passed through w3lib's
``canonicalize_url`` (Scrapy's: percent-encoding normalised, query
arguments sorted), then tracking parameters stripped.  WHATWG defines no
canonical form, so this part is crawld's; w3lib agrees with the WHATWG
serialisation it is given (it re-encodes nothing a WHATWG parser would read
differently), and the result is a WHATWG href again.

The fingerprint of a canonical URL is its 64-bit blake2b digest, as in
Scrapy's ``request_fingerprint`` idea but shorter: at 10^8 URLs the chance
of any collision is about 3e-4 (birthday bound n^2 / 2^65).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from typing import Iterable
from urllib.parse import unquote, urlsplit, urlunsplit

# the C API of ada through its cffi binding: ada_url.URL reads every
# attribute through __getattr__ with a lookup per call, several times slower
# than the few calls made here (one parse, the href and its component
# offsets), and resolve() runs for every link of every page
from ada_url._ada_wrapper import ffi as _ffi, lib as _lib
from w3lib.url import canonicalize_url

ALLOWED_SCHEMES = ("http", "https")
_DEFAULT_PORTS = {"http": 80, "https": 443}
# WHATWG URL parsing removes ASCII tab and newline anywhere in the input and
# strips leading/trailing C0 controls and space (basic URL parser, step 1-3).
_TAB_NL = re.compile(r"[\t\n\r]")
_C0_SPACE = "".join(chr(c) for c in range(0x21))
# a scheme, as the WHATWG scheme state (and RFC 3986 section 3.1) reads it
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
# a registered name after IDNA encoding (RFC 3986 unreserved characters)
_HOST = re.compile(r"^[a-z0-9_~.-]+$")
# ada_url_components: an offset left out of the URL
_OMITTED = 0xFFFFFFFF
# ada host types
_HOST_DOMAIN = 0
# WHATWG "forbidden domain code point": forbidden host code points, C0
# controls, "%" and DELETE
_FORBIDDEN_DOMAIN = frozenset("\x00\t\n\r #/:<>?@[\\]^|%\x7f" + "".join(chr(c) for c in range(0x20)))
# the last label of a host that the WHATWG host parser reads as IPv4
# ("ends in a number": digits, or 0x and hex digits)
_NUMERIC_LABEL = re.compile(r"^(?:[0-9]+|0[xX][0-9A-Fa-f]*)$")

# a "%" that does not start a percent-encoded byte (URL Standard 1.3)
_STRAY_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")

Strip = tuple[frozenset[str], tuple[str, ...]]
_NO_STRIP: Strip = (frozenset(), ())


class BadURL(ValueError):
    """A URL that cannot be fetched; ``str(err)`` says why (one line)."""


def fingerprint(canonical_url: str) -> bytes:
    """64-bit blake2b digest (8 bytes) of a canonical URL."""
    return hashlib.blake2b(canonical_url.encode("utf-8"), digest_size=8).digest()


def compile_strip(patterns: Iterable[str]) -> Strip:
    """Split parameter patterns into exact names and ``prefix*`` prefixes."""
    exact, prefixes = set(), []
    for p in patterns:
        if p.endswith("*"):
            prefixes.append(p[:-1])
        else:
            exact.add(p)
    return frozenset(exact), tuple(prefixes)


def _strip_query(query: str, strip: Strip) -> str:
    exact, prefixes = strip
    kept = []
    for pair in query.split("&"):
        name = pair.split("=", 1)[0]
        if name in exact or (prefixes and name.startswith(prefixes)):
            continue
        kept.append(pair)
    return "&".join(kept)


def clean_href(href: str) -> str:
    """An href as the WHATWG URL parser reads it before parsing: tabs and
    newlines removed, leading and trailing C0 controls and spaces trimmed,
    backslashes read as slashes (as they are in http(s) URLs)."""
    if "\t" in href or "\n" in href or "\r" in href:
        href = _TAB_NL.sub("", href)
    if "\\" in href:
        href = href.replace("\\", "/")
    return href.strip(_C0_SPACE)


def _trim(href: str) -> str:
    # basic URL parser steps 1-3: strip C0 controls and space, then remove
    # every tab and newline
    href = href.strip(_C0_SPACE)
    if "\t" in href or "\n" in href or "\r" in href:
        href = _TAB_NL.sub("", href)
    return href


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # a lone surrogate: the URL parser works on scalar values, and
        # UTF-8 encoding turns a surrogate into U+FFFD (Encoding Standard)
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


def _parse(href: str, base: str | None):
    """ada's WHATWG parse of ``href`` against ``base`` (None: ``href`` must
    be absolute): ``(serialisation, protocol_end, hostname_start,
    host_end, port, pathname_start, hash_start, host_type, has_credentials)``
    (offsets into the serialisation; ``port`` is :data:`_OMITTED` for the
    scheme's default) or None for a parse failure."""
    data = _utf8(href)
    if base is None:
        u = _lib.ada_parse(data, len(data))
    else:
        b = _utf8(base)
        u = _lib.ada_parse_with_base(data, len(data), b, len(b))
    try:
        if not _lib.ada_is_valid(u):
            return None
        s = _lib.ada_get_href(u)
        text = _ffi.unpack(s.data, s.length).decode("utf-8")
        c = _lib.ada_get_components(u)
        creds = _lib.ada_has_credentials(u)
        # with credentials, host_start is the "@" before the host
        return (text, c.protocol_end, c.host_start + 1 if creds else c.host_start, c.host_end, c.port,
                c.pathname_start, c.hash_start, _lib.ada_get_host_type(u), creds)
    finally:
        _lib.ada_free(u)


def _printable(text: str, limit: int = 0) -> str:
    """``text`` in printable ASCII: every code point outside U+0021-U+007E
    percent-encoded as UTF-8 (a lone surrogate as U+FFFD's); cut to
    ``limit`` characters (0: not cut) with "..." after."""
    if not (text.isascii() and text.isprintable() and " " not in text):
        text = "".join(ch if "!" <= ch <= "~" else "".join(f"%{b:02X}" for b in _utf8(ch)) for ch in text)
    if limit and len(text) > limit:
        text = text[:limit] + "..."
    return text


def _dns_problem(host: str) -> str | None:
    """Why an ASCII domain (without its trailing dot) cannot be a DNS name:
    UTS #46 VerifyDnsLength (RFC 1034 section 3.1: labels of 1-63 octets,
    253 octets in all), and characters a host name never has (RFC 1123
    section 2.1: letters, digits and hyphens; "_" and "~" are let through,
    as resolvers do).  None when it can."""
    if not host:
        return "no host"
    if not _HOST.match(host):
        return f"host {_printable(host, 80)!r} has characters no DNS host name has"
    if len(host) <= 63 and ".." not in host and host[0] != "." and host[-1] != ".":
        return None
    if len(host) > 253:
        return f"host name over 253 octets ({len(host)})"
    for label in host.split("."):
        if not label:
            return f"empty label in host {_printable(host, 80)!r}"
        if len(label) > 63:
            return f"host label over 63 octets ({len(label)}: {label[:20]}...)"
    return None


def _diagnose(text: str) -> str:
    """Why the WHATWG parser refused the trimmed reference ``text`` (whose
    scheme, if any, is http or https): one line, the failing part named.

    ada says only that parsing failed; this re-reads the authority as the
    special-authority states do (section 4.4 of the standard: userinfo up to
    the last "@", host, port) and parses each part on its own."""
    m = _SCHEME.match(text)
    rest = text[m.end():] if m else text
    if not m and not (rest[:2] in ("//", "\\\\", "/\\", "\\/")):
        return "invalid URL"
    rest = rest.lstrip("/\\")
    end = len(rest)
    for stop in "/\\?#":
        i = rest.find(stop)
        if 0 <= i < end:
            end = i
    hostport = rest[:end].rpartition("@")[2]
    if not hostport:
        return "no host"
    if hostport[0] == "[":
        close = hostport.find("]")
        if close < 0:
            return f"invalid IPv6 address {_printable(hostport, 60)!r} (no closing bracket)"
        host, port = hostport[:close + 1], hostport[close + 1:]
        if port and port[0] != ":":
            return f"invalid text after IPv6 address: {_printable(port, 40)!r}"
        port = port[1:]
    else:
        host, _, port = hostport.partition(":")
    if port:
        if not (port.isascii() and port.isdigit()):
            return f"invalid port {_printable(port, 40)!r}"
        if int(port) > 65535:
            return f"port {int(port)} over 65535"
    if not host:
        return "no host"
    if _parse(f"http://{host}/", None) is None:
        shown = _printable(host, 80)
        if host[0] == "[":
            return f"invalid IPv6 address {shown!r}"
        decoded = unquote(host, errors="replace")
        bad = sorted({ch for ch in decoded if ch in _FORBIDDEN_DOMAIN})
        if bad:
            return f"forbidden code point {_printable(bad[0])!r} in host {shown!r}"
        labels = decoded.split(".")
        if labels[-1] == "" and len(labels) > 1:
            labels.pop()
        if _NUMERIC_LABEL.match(labels[-1]):
            return f"invalid IPv4 address {shown!r}"
        return f"host {shown!r} fails IDNA (UTS #46) processing"
    return "invalid URL"


def _to_fetch(parsed) -> tuple[str | None, str | None]:
    """The URL to fetch from a :func:`_parse` result: ``(url, None)``,
    ``(None, why)`` for a host or port crawld refuses, ``(None, None)`` for
    a scheme other than http(s)."""
    text, proto_end, host_start, host_end, port, path_start, hash_start, host_type, creds = parsed
    if text[:proto_end - 1] not in ALLOWED_SCHEMES:
        return None, None
    host = text[host_start:host_end]
    dot = host_type == _HOST_DOMAIN and host.endswith(".")
    if host_type == _HOST_DOMAIN:
        why = _dns_problem(host[:-1] if dot else host)
        if why:
            return None, why
    if port == 0:
        return None, "port 0"
    end = hash_start if hash_start != _OMITTED else len(text)
    if not creds and not dot:
        return text[:end], None
    # rebuilt without userinfo and the host's trailing dot
    return text[:proto_end] + "//" + (host[:-1] if dot else host) + text[host_end:path_start] \
        + text[path_start:end], None


def resolve_link(base: str | None, href: str) -> tuple[str | None, str | None]:
    """An href (or Location, sitemap loc, seed) as the URL crawld fetches.

    ``href`` is parsed against ``base`` (an absolute URL; None: ``href``
    must be absolute) by the WHATWG URL Standard's basic URL parser.
    Returns:

    * ``(url, None)``: a link; ``url`` is the WHATWG serialisation (ASCII,
      percent-encoded) without fragment, userinfo or a host's trailing dot;
    * ``(None, why)``: an http(s) link that cannot become a URL to fetch;
      ``why`` says why in one line (``empty label in host 'www..x.com'``,
      ``port 99999 over 65535``, ``invalid IPv4 address '0xffffffff1'``...);
    * ``(None, None)``: not a link at all: empty, fragment-only, or a
      scheme other than http/https (``mailto:``, ``javascript:``, ``data:``,
      ``ftp:`` ...).
    """
    text = _trim(href)
    if not text or text[0] == "#":
        return None, None
    parsed = _parse(text, base)
    if parsed is not None:
        return _to_fetch(parsed)
    m = _SCHEME.match(text)
    if m is not None and m.group(1).lower() not in ALLOWED_SCHEMES:
        return None, None
    if m is None and base is None:
        return None, "not an absolute URL"
    return None, _diagnose(text)


def resolve(base: str | None, href: str) -> str | None:
    """``href`` made absolute against ``base``: the URL of
    :func:`resolve_link`, or None when there is none (not a link, or an
    invalid one)."""
    return resolve_link(base, href)[0]


def link_record(href: str) -> str:
    """The printable ASCII form an invalid link is recorded under (its row's
    ``url`` and ``canonical_url``, whose fingerprint dedups it): the
    reference as written, trimmed as the URL parser trims it, without
    fragment and userinfo (never stored), every code point outside
    U+0021-U+007E percent-encoded as UTF-8."""
    text = _trim(href)
    hash_at = text.find("#")
    if hash_at >= 0:
        text = text[:hash_at]
    m = _SCHEME.match(text)
    start = m.end() if m else 0
    slashes = len(text) - len(text[start:].lstrip("/\\")) - start
    if slashes >= 2 or (m and m.group(1).lower() in ALLOWED_SCHEMES):
        auth_start = start + slashes
        end = len(text)
        for stop in "/\\?":
            i = text.find(stop, auth_start)
            if 0 <= i < end:
                end = i
        at = text.rfind("@", auth_start, end)
        if at >= 0:
            text = text[:auth_start] + text[at + 1:]
    return _printable(text)


def location_reference(value: str) -> str:
    """A ``Location`` header value as a reference to parse, from the
    latin-1 text http.client makes of the header's bytes (one code point
    per byte): every byte >= 0x80 percent-encoded as received.

    A UTF-8 Location thus gives what browsers request (they UTF-8
    percent-encode the path: ``/caf\\xc3\\xa9`` -> ``/caf%C3%A9``), and a
    byte that is not UTF-8 is sent back as it came (``/caf\\xe9`` ->
    ``/caf%E9``), never decoded and re-encoded.  A code point above U+00FF
    (not from a header) is percent-encoded as UTF-8."""
    if value.isascii():
        return value
    out = []
    for ch in value:
        o = ord(ch)
        if o < 0x80:
            out.append(ch)
        elif o <= 0xFF:
            out.append(f"%{o:02X}")
        else:
            out.append("".join(f"%{b:02X}" for b in _utf8(ch)))
    return "".join(out)


def _escape_stray_percent(url: str) -> str:
    """``url`` with each "%" of its path that does not start a
    percent-encoded byte written "%25".

    The WHATWG path state leaves such a "%" as it is; w3lib decodes every
    escape once and keeps "%" raw, so ``/%3%41`` would become ``/%3A``, a
    new escape that a second pass decodes again (to ``/:``), and one that
    names another resource.  Written ``%25`` it means what it meant (a
    literal "%", RFC 3986 section 2.4) and the canonical form is stable."""
    start = url.find("/", url.find("//") + 2)
    if start < 0:
        return url
    end = url.find("?", start)
    end = len(url) if end < 0 else end
    path = url[start:end]
    fixed = _STRAY_PERCENT.sub("%25", path)
    return url if fixed == path else url[:start] + fixed + url[end:]


def canonicalize(url: str, strip: Strip = _NO_STRIP) -> str:
    """The canonical form of an absolute http(s) URL.

    ``strip`` comes from :func:`compile_strip`.  Example:
    ``HTTP://Example.COM:80/a/../b?z=1&utm_source=x&a=2#top`` ->
    ``http://example.com/b?a=2&z=1``.  The URL is parsed as
    :func:`resolve_link` parses it (WHATWG), then w3lib normalises its
    percent-encoding and sorts its query; tracking parameters in ``strip``
    are removed.  ``canonicalize(canonicalize(u)) == canonicalize(u)``.

    Raises:
        BadURL: for a relative URL, a scheme other than http/https, or a
            URL :func:`resolve_link` calls invalid (host, port...).
    """
    fetch, why = resolve_link(None, url)
    if fetch is None:
        if why:
            raise BadURL(why if why == "not an absolute URL" else f"invalid URL: {why}")
        m = _SCHEME.match(_trim(url))
        raise BadURL(f"unsupported scheme {m.group(1).lower()!r}" if m else "not an absolute URL")
    if "%" in fetch:
        fetch = _escape_stray_percent(fetch)
    try:
        canon = canonicalize_url(fetch, keep_fragments=False)
    except (ValueError, UnicodeError) as exc:  # not seen on a WHATWG serialisation; kept as a BadURL
        raise BadURL(f"invalid URL: {exc}") from None
    if (strip[0] or strip[1]) and "?" in canon:
        head, _, query = canon.partition("?")
        query = _strip_query(query, strip)
        canon = head + "?" + query if query else head
    return canon


def valid_host(host: str) -> bool:
    """Whether a lower-case, IDNA-encoded host name given by an operator
    (``allow_domains``, shard overrides) can be fetched: an IPv6 or
    dotted-quad IPv4 literal, or a name of 1-63 character labels (253 at
    most) in RFC 3986 unreserved characters whose last label is not numeric
    (WHATWG URL: a host ending in a number must be an IPv4 address)."""
    if ":" in host:
        try:
            ipaddress.IPv6Address(host.strip("[]"))
            return True
        except ValueError:
            return False
    if not _HOST.match(host) or len(host) > 253:
        return False
    labels = (host[:-1] if host.endswith(".") else host).split(".")
    if any(not label or len(label) > 63 for label in labels):
        return False
    if labels[-1].isdigit():
        try:
            ipaddress.IPv4Address(host.rstrip("."))
        except ValueError:
            return False
    return True


def without_userinfo(url: str) -> str:
    """``url`` without ``user:password@``: a crawler never sends credentials
    it found in a link, nor stores them in the artifact."""
    if "@" not in url:
        return url
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def url_host(canonical_url: str) -> str:
    """The lower-case host of a canonical URL (IPv6 without brackets)."""
    return urlsplit(canonical_url).hostname or ""
