"""Sitemaps (sitemaps.org protocol 0.9): read the URLs a site lists.

A sitemap is a ``<urlset>`` of page URLs or a ``<sitemapindex>`` of more
sitemaps, possibly gzip-compressed.  The protocol caps a sitemap at 50,000
URLs and 50 MiB uncompressed; larger ones are cut there.  Parsing uses the
standard library's expat-based parser, which resolves no external entities
and (with expat >= 2.4) refuses entity-expansion bombs.
"""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
import zlib
from dataclasses import dataclass, field

MAX_URLS = 50_000
MAX_UNCOMPRESSED = 50 * 1024 * 1024


@dataclass
class Sitemap:
    """``kind`` is ``urlset``, ``sitemapindex`` or None (not a sitemap);
    ``locs`` the listed URLs (at most :data:`MAX_URLS`); ``error`` why it
    could not be read, if it could not."""

    kind: str | None
    locs: list[str] = field(default_factory=list)
    error: str | None = None


def _gunzip(body: bytes) -> bytes:
    # bounded: a gzip bomb yields MAX_UNCOMPRESSED bytes, not gigabytes
    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body, MAX_UNCOMPRESSED)


def parse_sitemap(body: bytes) -> Sitemap:
    """Read a sitemap body (gzip detected by its magic bytes).  Never raises."""
    try:
        if body[:2] == b"\x1f\x8b":
            body = _gunzip(body)
    except (zlib.error, OSError, EOFError) as exc:
        return Sitemap(None, error=f"bad gzip: {exc}")
    locs: list[str] = []
    kind = None
    try:
        for event, el in ET.iterparse(io.BytesIO(body[:MAX_UNCOMPRESSED]), events=("start", "end")):
            tag = el.tag.rsplit("}", 1)[-1]
            if event == "start":
                if kind is None:
                    if tag not in ("urlset", "sitemapindex"):
                        return Sitemap(None, error=f"not a sitemap: root element <{tag}>")
                    kind = tag
                continue
            if tag == "loc" and el.text and el.text.strip():
                locs.append(el.text.strip())
                if len(locs) >= MAX_URLS:
                    break
            el.clear()
    except ET.ParseError as exc:
        if kind is None:
            return Sitemap(None, error=f"not XML: {exc}")
        return Sitemap(kind, locs, error=f"cut short: {exc}")
    return Sitemap(kind, locs)

