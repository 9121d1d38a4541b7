"""URL canonicalisation, fingerprints and link resolution (pure functions).

The canonical URL is what dedup, sharding and the artifact's
``canonical_url`` use.  It is w3lib's ``canonicalize_url`` (Scrapy's:
percent-encoding normalised, IDNA host, query arguments sorted, fragment
dropped), then the default port removed and tracking parameters stripped
(RFC 3986 section 6.2.3, scheme-based normalisation).

The fingerprint of a canonical URL is its 64-bit blake2b digest, as in
Scrapy's ``request_fingerprint`` idea but shorter: at 10^8 URLs the chance
of any collision is about 3e-4 (birthday bound n^2 / 2^65).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from typing import Iterable
from urllib.parse import urljoin, urlsplit, urlunsplit

import idna
from w3lib.url import canonicalize_url

ALLOWED_SCHEMES = ("http", "https")
_DEFAULT_PORTS = {"http": 80, "https": 443}
# WHATWG URL parsing removes ASCII tab and newline anywhere in the input and
# strips leading/trailing C0 controls and space.
_TAB_NL = re.compile(r"[\t\n\r]")
_C0_SPACE = "".join(chr(c) for c in range(0x21))
# a scheme, as RFC 3986 section 3.1 spells it
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
# a registered name after IDNA encoding (RFC 3986 unreserved characters)
_HOST = re.compile(r"^[a-z0-9_~.-]+$")


class BadURL(ValueError):
    """A URL that cannot be fetched; ``str(err)`` says why (one line)."""


def fingerprint(canonical_url: str) -> bytes:
    """64-bit blake2b digest (8 bytes) of a canonical URL."""
    return hashlib.blake2b(canonical_url.encode("utf-8"), digest_size=8).digest()


def compile_strip(patterns: Iterable[str]) -> tuple[frozenset[str], tuple[str, ...]]:
    """Split parameter patterns into exact names and ``prefix*`` prefixes."""
    exact, prefixes = set(), []
    for p in patterns:
        if p.endswith("*"):
            prefixes.append(p[:-1])
        else:
            exact.add(p)
    return frozenset(exact), tuple(prefixes)


def _strip_query(query: str, strip: tuple[frozenset[str], tuple[str, ...]]) -> str:
    exact, prefixes = strip
    kept = []
    for pair in query.split("&"):
        name = pair.split("=", 1)[0]
        if name in exact or (prefixes and name.startswith(prefixes)):
            continue
        kept.append(pair)
    return "&".join(kept)


def clean_href(href: str) -> str:
    """An href as a browser reads it (WHATWG URL parsing): tabs and newlines
    removed, C0 controls and spaces trimmed, backslashes read as slashes."""
    if "\t" in href or "\n" in href or "\r" in href:
        href = _TAB_NL.sub("", href)
    if "\\" in href:
        href = href.replace("\\", "/")
    return href.strip(_C0_SPACE)


def _idna_host(url: str) -> str:
    """``url`` with a non-ASCII host encoded by IDNA 2008 / UTS #46
    (non-transitional, as browsers do: ``faß.de`` -> ``xn--fa-hia.de``, not
    IDNA 2003's ``fass.de``)."""
    parts = urlsplit(url)
    host = parts.hostname
    if not host or host.isascii():
        return url
    try:
        ace = idna.encode(host, uts46=True, transitional=False).decode("ascii")
    except idna.IDNAError as exc:
        raise BadURL(f"invalid host {host!r}: {exc}") from None
    netloc = parts.netloc
    userinfo, _, hostport = netloc.rpartition("@")
    port = hostport[len(hostport.rstrip("0123456789")):] if ":" in hostport else ""
    new = (userinfo + "@" if userinfo else "") + ace + (":" + port if port else "")
    return urlunsplit(parts._replace(netloc=new))


def canonicalize(url: str, strip: tuple[frozenset[str], tuple[str, ...]] = (frozenset(), ())) -> str:
    """The canonical form of an absolute http(s) URL.

    ``strip`` comes from :func:`compile_strip`.  Example:
    ``HTTP://Example.COM:80/a/../b?z=1&utm_source=x&a=2#top`` ->
    ``http://example.com/b?a=2&z=1``.

    Raises:
        BadURL: for a relative URL, a scheme other than http/https, an empty
            or invalid host, or an invalid port.
    """
    url = clean_href(url)
    scheme_end = url.find(":")
    scheme = url[:scheme_end].lower() if scheme_end > 0 else ""
    if scheme not in ALLOWED_SCHEMES:
        raise BadURL(f"unsupported scheme {scheme!r}" if scheme else "not an absolute URL")
    try:
        if not url.isascii():
            url = _idna_host(url)
        canon = canonicalize_url(url, keep_fragments=False)
        parts = urlsplit(canon)
        port = parts.port
    except (ValueError, UnicodeError) as exc:
        raise BadURL(f"invalid URL: {exc}") from None
    host = parts.hostname
    if not host:
        raise BadURL("URL has no host")
    if not valid_host(host):
        raise BadURL(f"invalid host {host!r}")
    if port == 0:
        raise BadURL("invalid URL: port 0")
    netloc = parts.netloc
    if port is not None and (port == _DEFAULT_PORTS[scheme] or "@" in netloc):
        # rebuild netloc without the default port; credentials are dropped
        # too: a crawler never sends userinfo it found in a link.
        netloc = host if ":" not in host else f"[{host}]"
        if port != _DEFAULT_PORTS[scheme]:
            netloc += f":{port}"
    elif "@" in netloc:
        netloc = netloc.rsplit("@", 1)[1]
    query = parts.query
    if query and (strip[0] or strip[1]):
        query = _strip_query(query, strip)
    if netloc != parts.netloc or query != parts.query:
        canon = urlunsplit((parts.scheme, netloc, parts.path or "/", query, ""))
    return canon


def valid_host(host: str) -> bool:
    """Whether a lower-case, IDNA-encoded host can be fetched: an IPv6 or
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


def resolve(base: str, href: str) -> str | None:
    """``href`` made absolute against ``base``, without its fragment.

    Returns None for hrefs that are not links to fetch: empty,
    fragment-only, or with a non-http(s) scheme (``mailto:``,
    ``javascript:``, ``data:``, ``file:`` ...).
    """
    href = clean_href(href)
    if not href or href[0] == "#":
        return None
    m = _SCHEME.match(href)
    if m and m.group(1).lower() not in ALLOWED_SCHEMES:
        return None
    hash_at = href.find("#")
    if hash_at >= 0:
        href = href[:hash_at]
    try:
        return without_userinfo(urljoin(base, href))
    except ValueError:
        return None
