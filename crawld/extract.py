"""Audit fields and links from an HTML page (pure: bytes in, fields out).

Parsing is selectolax's lexbor backend (an HTML5 parser in C), with the
encoding chosen as the HTML standard's encoding sniffing algorithm does
(see ``_parser``).  A ``<meta http-equiv=refresh>`` is read as the HTML
Standard's "shared declarative refresh steps" read it
(:func:`parse_refresh`).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field

from selectolax.lexbor import LexborHTMLParser
from w3lib.encoding import html_body_declared_encoding, read_bom, resolve_encoding

from .urls import clean_href

#: MIME types parsed as HTML.
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})


@dataclass
class Page:
    """What an HTML page says about itself.

    ``hrefs`` are the raw ``href`` values of ``<a>`` and ``<area>``
    elements in document order, duplicates removed; ``nofollow`` those whose
    ``rel`` contains ``nofollow``.

    ``refresh_delay`` (seconds) is set when the page has a ``<meta
    http-equiv=refresh>`` that the HTML Standard acts on (the first one
    that parses, anywhere in the document); ``refresh_url`` is then the raw
    URL string it names (see :func:`parse_refresh`), or None when it names
    none and the page reloads itself.
    """

    title: str | None = None
    meta_robots: str | None = None
    canonical_link: str | None = None
    base_href: str | None = None
    hrefs: list[str] = field(default_factory=list)
    nofollow: set[str] = field(default_factory=set)
    refresh_delay: int | None = None
    refresh_url: str | None = None


def parse_content_type(value: str | None) -> tuple[str | None, str | None]:
    """``(mime, charset)`` of a Content-Type header value, lower-case.

    Example: ``text/HTML; Charset="UTF-8"`` -> ``("text/html", "utf-8")``.
    """
    if not value:
        return None, None
    parts = value.split(";")
    mime = parts[0].strip().lower() or None
    charset = None
    for p in parts[1:]:
        k, _, v = p.partition("=")
        if k.strip().lower() == "charset":
            charset = v.strip().strip("\"'").lower() or None
    return mime, charset


#: ASCII whitespace (WHATWG Infra): TAB, LF, FF, CR, SPACE
_ASCII_WS = "\t\n\x0c\r "
_DIGITS = "0123456789"
#: refresh delays are saturated here (seconds; an int32, about 68 years)
MAX_REFRESH_DELAY = 2**31 - 1


def _skip(s: str, pos: int, chars: str = _ASCII_WS) -> int:
    while pos < len(s) and s[pos] in chars:
        pos += 1
    return pos


def parse_refresh(content: str) -> tuple[int, str | None] | None:
    """``(delay_s, url)`` of a refresh value (a ``<meta http-equiv=refresh>``
    ``content``, or a ``Refresh`` header), or None where the HTML Standard
    ignores it.

    Steps 2-13 of the "shared declarative refresh steps" (HTML Living
    Standard, 4.2.5.3 Pragma directives, refresh state): ASCII whitespace,
    an integer time (a fraction such as ``1.5`` counts as ``1``; ``.5`` as
    ``0``), then ``;``, ``,`` or whitespace, then an optional ``URL`` (any
    case) and ``=``, then the URL, cut at its closing quote if it opens
    with ``'`` or ``"``.  ``delay_s`` saturates at :data:`MAX_REFRESH_DELAY`.
    ``url`` is the raw URL string, to be parsed against the document's
    base URL (an empty string means the base URL), or None when the value
    names no URL: the page refreshes itself.  A ``javascript:`` URL is
    refused (step 13).

    Examples: ``"0;url='http://example.com/'"`` -> ``(0, "http://example.com/")``;
    ``"5"`` -> ``(5, None)``; ``"0; http://x/"`` -> ``(0, "http://x/")``;
    ``"url=/x"`` -> None (no time).
    """
    s = content
    pos = _skip(s, 0)                                   # 3
    start = pos                                         # 5: timeString
    pos = _skip(s, pos, _DIGITS)
    if pos == start and not s.startswith(".", pos):     # 6
        return None
    digits = s[start:pos]                               # 7, saturated
    time = 0 if not digits else MAX_REFRESH_DELAY if len(digits) > 10 else min(int(digits), MAX_REFRESH_DELAY)
    pos = _skip(s, pos, _DIGITS + ".")                  # 8: the fraction, ignored
    if pos < len(s):                                    # 10
        if s[pos] not in ";," + _ASCII_WS:
            return None
        pos = _skip(s, pos)
        if pos < len(s) and s[pos] in ";,":
            pos += 1
        pos = _skip(s, pos)
    if pos >= len(s):                                   # 11: no URL
        return time, None
    url = s[pos:]                                       # 11.1
    skip_quotes = True
    if s[pos] in "Uu":                                  # 11.2-11.7: "URL" "="
        pos += 1
        if pos < len(s) and s[pos] in "Rr" and pos + 1 < len(s) and s[pos + 1] in "Ll":
            pos = _skip(s, pos + 2)
            if pos < len(s) and s[pos] == "=":
                pos = _skip(s, pos + 1)
            else:
                skip_quotes = False                     # "jump to parse": urlString stays whole
        else:
            skip_quotes = False
    if skip_quotes:                                     # 11.8-11.10
        quote = s[pos] if pos < len(s) and s[pos] in "'\"" else ""
        if quote:
            pos += 1
        url = s[pos:]
        if quote and quote in url:
            url = url[:url.index(quote)]
    # 11.11-13: the caller parses the URL against the document's base URL
    # (an empty string is the base URL itself); javascript: refreshes nothing
    if clean_href(url)[:11].lower() == "javascript:":
        return None
    return time, url


def _parser(body: bytes, charset: str | None) -> LexborHTMLParser:
    # precedence as in the HTML standard's encoding sniffing: BOM, then the
    # transport-layer charset, then a <meta charset> prescan, then (nothing
    # declared) UTF-8 if the bytes are UTF-8, else windows-1252 - labels
    # mapped by the WHATWG Encoding Standard (latin1 and ascii mean
    # windows-1252).  Scripting is on, as in browsers and Googlebot, so a
    # <noscript> pixel in <head> does not end the head early.
    bom_encoding, bom = read_bom(body)
    if bom_encoding:
        name = codecs.lookup(bom_encoding).name
        body = body[len(bom):]
    else:
        name = resolve_encoding(charset) if charset else None
        if not name:
            declared = html_body_declared_encoding(body[:4096])
            name = resolve_encoding(declared) if declared else None
        if not name:
            try:
                body.decode("utf-8")
                name = "utf-8"
            except UnicodeDecodeError:
                name = "cp1252"
    if name == "utf-8":
        return LexborHTMLParser(body, scripting=True)
    return LexborHTMLParser(body.decode(name, errors="replace"), scripting=True)


def _text(node) -> str | None:
    if node is None:
        return None
    t = node.text(strip=True)
    return " ".join(t.split())[:2000] if t else None


def parse_html(body: bytes, charset: str | None = None) -> Page:
    """Parse an HTML document.

    ``charset`` is the Content-Type header's, if any.  Never raises on bad
    markup or bad bytes: invalid sequences decode as U+FFFD.
    """
    tree = _parser(body, charset)
    page = Page()
    head = tree.head
    scope = head if head is not None else tree
    page.title = _text(scope.css_first("title") or tree.css_first("title"))
    for meta in scope.css("meta[name]"):
        attrs = meta.attrs
        if (attrs.get("name") or "").strip().lower() == "robots":
            content = attrs.get("content")
            if content:
                page.meta_robots = ",".join(p.strip().lower() for p in content.split(",") if p.strip())
            break
    for link in scope.css("link[rel]"):
        attrs = link.attrs
        if "canonical" in (attrs.get("rel") or "").lower().split():
            page.canonical_link = (attrs.get("href") or "").strip() or None
            break
    # the refresh pragma applies wherever the <meta> is in the document
    # (HTML Standard 4.2.5.3: "when a meta element is inserted into the
    # document"); the first one that parses wins ("will declaratively
    # refresh"), later ones are ignored
    for meta in tree.css("meta[http-equiv]"):
        attrs = meta.attrs
        if (attrs.get("http-equiv") or "").lower() != "refresh":  # ASCII case-insensitive, not trimmed
            continue
        refresh = parse_refresh(attrs.get("content") or "")
        if refresh is not None:
            page.refresh_delay, page.refresh_url = refresh
            break
    base = tree.css_first("base[href]")
    if base is not None:
        page.base_href = (base.attrs.get("href") or "").strip() or None
    seen: set[str] = set()
    hrefs = page.hrefs
    for node in tree.css("a[href], area[href]"):
        attrs = node.attrs
        href = attrs.get("href")
        if not href or href in seen:
            continue
        seen.add(href)
        hrefs.append(href)
        rel = attrs.get("rel")
        if rel and "nofollow" in rel.lower().split():
            page.nofollow.add(href)
    return page
