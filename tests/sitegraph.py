"""Independent ground truth for end-to-end tests.

Computes the pages reachable from a seed directly from the files on disk,
with the standard library's ``html.parser`` and ``urllib`` (deliberately not
crawld's selectolax/w3lib code path), and measures request rates from the
site server's own timestamps.
"""

from __future__ import annotations

from collections import defaultdict
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit




class _Links(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.hrefs: list[str] = []
        self.base: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag in ("a", "area"):
            for k, v in attrs:
                if k == "href" and v:
                    self.hrefs.append(v)
        elif tag == "base" and self.base is None:
            self.base = dict(attrs).get("href")


def reachable_files(root: Path, host: str, seed: str = "index.html") -> set[str]:
    """Relative paths of the files under ``root`` reachable from ``seed`` by
    following ``<a>``/``<area>`` links that stay on ``host``."""
    todo = [seed]
    seen = {seed}
    while todo:
        rel = todo.pop()
        path = root / rel
        if path.suffix.lower() not in (".html", ".htm"):
            continue
        parser = _Links()
        parser.feed(path.read_bytes().decode("utf-8", errors="replace"))
        page_url = f"http://{host}/{rel}"
        base = urljoin(page_url, parser.base) if parser.base else page_url
        for href in parser.hrefs:
            href = href.strip()
            if not href or href.startswith(("#", "mailto:", "javascript:", "data:", "tel:")):
                continue
            target = urlsplit(urljoin(base, href))
            if target.scheme not in ("http", "https") or target.hostname != host:
                continue
            tpath = unquote(target.path)
            if tpath.endswith("/"):
                tpath += "index.html"
            trel = tpath.lstrip("/")
            if trel and trel not in seen and (root / trel).is_file():
                seen.add(trel)
                todo.append(trel)
    return seen


def url_to_rel(url: str) -> str:
    """The relative file path a crawled URL names (``/`` -> index.html)."""
    p = unquote(urlsplit(url).path)
    if p.endswith("/"):
        p += "index.html"
    return p.lstrip("/")


def group_hits(hits, key_of) -> dict[str, list[float]]:
    """Server hit times grouped by ``key_of(host)``."""
    out: dict[str, list[float]] = defaultdict(list)
    for h in hits:
        out[key_of(h.host)].append(h.t)
    return out
