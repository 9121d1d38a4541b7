"""Audit fields and links from an HTML page (pure: bytes in, fields out).

Parsing is selectolax's lexbor backend (an HTML5 parser in C), with the
encoding chosen as the HTML standard's encoding sniffing algorithm does
(see ``_parser``).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field

from selectolax.lexbor import LexborHTMLParser
from w3lib.encoding import html_body_declared_encoding, read_bom, resolve_encoding

#: MIME types parsed as HTML.
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})


@dataclass
class Page:
    """What an HTML page says about itself.

    ``hrefs`` are the raw ``href`` values of ``<a>`` and ``<area>``
    elements in document order, duplicates removed; ``nofollow`` those whose
    ``rel`` contains ``nofollow``.
    """

    title: str | None = None
    meta_robots: str | None = None
    canonical_link: str | None = None
    base_href: str | None = None
    hrefs: list[str] = field(default_factory=list)
    nofollow: set[str] = field(default_factory=set)


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
