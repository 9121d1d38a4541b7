"""Sitemaps (sitemaps.org protocol 0.9): read the URLs a site lists.

A sitemap is an XML ``<urlset>`` of page URLs, an XML ``<sitemapindex>``
of more sitemaps, or a text file of page URLs, one a line; any of them
possibly gzip-compressed.  The protocol caps a sitemap at 50,000 URLs and
50 MiB (52,428,800 bytes) uncompressed; larger ones are cut there.  XML
parsing uses the standard library's expat-based parser, which resolves no
external entities and (with expat >= 2.4) refuses entity-expansion bombs.

An index lists sitemaps, not other indexes (sitemaps.org, "Using Sitemap
index files"; Google does not read nested indexes either), but such
nesting is met in the wild, so it is followed down to
:data:`MAX_NESTING` levels below the sitemaps robots.txt names: no deeper,
or a server inventing ``/sm/N+1.xml`` forever would be followed forever.
"""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
import zlib
from dataclasses import dataclass, field

MAX_URLS = 50_000
MAX_UNCOMPRESSED = 50 * 1024 * 1024
#: gzip members read from one sitemap at most (a BGZF file of 50 MiB,
#: 64 KiB blocks, has about 800)
MAX_GZIP_MEMBERS = 10_000
#: the deepest nesting level fetched: the sitemaps robots.txt names (and
#: /sitemap.xml) are level 0, the sitemaps an index at level n lists are
#: level n + 1 (the protocol needs 1: an index and its sitemaps)
MAX_NESTING = 2

_GZIP_MAGIC = b"\x1f\x8b"
_UTF8_BOM = b"\xef\xbb\xbf"
_LEADING_WS = re.compile(rb"[ \t\r\n\f\v]*")


@dataclass
class Sitemap:
    """``kind`` is ``urlset``, ``sitemapindex``, ``text`` (a text sitemap:
    page URLs like a urlset) or None (not a sitemap); ``locs`` the listed
    URLs (at most :data:`MAX_URLS`); ``error`` why it could not be read, or
    not all of it, if so."""

    kind: str | None
    locs: list[str] = field(default_factory=list)
    error: str | None = None


def _gunzip(body: bytes) -> tuple[bytes, str | None]:
    """Every member of a gzip file, at most :data:`MAX_UNCOMPRESSED` bytes
    and :data:`MAX_GZIP_MEMBERS` members in all: ``(data, why it was cut
    short or None)``.

    A gzip file is a series of members (RFC 1952 section 2.2), each
    decompressed in turn, as gzip(1) does; bytes after the last member that
    do not start another are ignored, and a file ending inside a member
    yields what it held.  The bounds hold over the sum, so a gzip bomb of
    one member or of many yields at most MAX_UNCOMPRESSED bytes, and a file
    of a million empty members costs no more than MAX_GZIP_MEMBERS: each
    member is fed in pieces of at most 64 KiB, so what follows it is never
    copied whole.  Raises ``zlib.error`` if the first member is not gzip; a
    broken later member ends the output there.
    """
    out: list[bytes] = []
    room = MAX_UNCOMPRESSED
    view = memoryview(body)
    pos = members = 0
    while body[pos:pos + 2] == _GZIP_MAGIC:
        if room <= 0:
            return b"".join(out), f"over {MAX_UNCOMPRESSED} bytes uncompressed"
        if members >= MAX_GZIP_MEMBERS:
            return b"".join(out), f"over {MAX_GZIP_MEMBERS} gzip members"
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        step = 1024
        while not d.eof:
            if room <= 0:  # (a max_length of 0 would mean no bound at all)
                return b"".join(out), f"over {MAX_UNCOMPRESSED} bytes uncompressed"
            piece = view[pos:pos + step]
            if not piece:
                return b"".join(out), None  # the file ends inside this member
            try:
                chunk = d.decompress(piece, room)
            except zlib.error:
                if members == 0:
                    raise
                return b"".join(out), None
            out.append(chunk)
            room -= len(chunk)
            pos += len(piece) - len(d.unconsumed_tail) - len(d.unused_data)
            if not d.eof and d.unconsumed_tail:
                return b"".join(out), f"over {MAX_UNCOMPRESSED} bytes uncompressed"
            step = min(step * 2, 1 << 16)
        members += 1
    return b"".join(out), None


def _parse_text(body: bytes, cut: str | None = None) -> Sitemap:
    """A text sitemap (sitemaps.org, "Text file"): UTF-8, one URL a line,
    "You must fully specify URLs, including the http".  Blank lines are
    skipped; other lines that are not absolute http(s) URLs are counted in
    ``error`` and left out.  ``cut``: the body was cut short (why), so its
    last line may be part of a URL and is left out too."""
    lines = body.decode("utf-8", errors="replace").split("\n")
    if cut:
        lines.pop()
    locs: list[str] = []
    bad = 0
    for line in lines:
        url = line.strip()
        if not url:
            continue
        if not url[:8].lower().startswith(("http://", "https://")):
            bad += 1
            continue
        locs.append(url)
        if len(locs) >= MAX_URLS:
            break
    errors = [f"cut short: {cut}"] if cut else []
    if bad:
        errors.append(f"{bad} line{'s' if bad != 1 else ''} not an absolute http(s) URL")
    return Sitemap("text", locs, "; ".join(errors) or None)


def parse_sitemap(body: bytes) -> Sitemap:
    """Read a sitemap body: gzip detected by its magic bytes, then XML if
    its first character (after a UTF-8 byte order mark and whitespace) is
    ``<``, else a text sitemap.  Never raises."""
    cut = None
    try:
        if body[:2] == _GZIP_MAGIC:
            body, cut = _gunzip(body)
    except (zlib.error, OSError, EOFError) as exc:
        return Sitemap(None, error=f"bad gzip: {exc}")
    if len(body) > MAX_UNCOMPRESSED:
        body, cut = body[:MAX_UNCOMPRESSED], f"over {MAX_UNCOMPRESSED} bytes"
    start = body[len(_UTF8_BOM):] if body.startswith(_UTF8_BOM) else body
    first = _LEADING_WS.match(start).end()
    if first == len(start):
        return Sitemap(None, error="empty")
    if start[first:first + 1] != b"<":
        return _parse_text(start, cut)
    locs: list[str] = []
    kind = None
    try:
        for event, el in ET.iterparse(io.BytesIO(body), events=("start", "end")):
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
        return Sitemap(kind, locs, error=f"cut short: {cut or exc}")
    return Sitemap(kind, locs)
