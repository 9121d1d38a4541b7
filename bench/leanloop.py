#!/usr/bin/env python3
"""Baseline: a lean single-process crawl loop with crawld's libraries.

requests under gevent, selectolax (lexbor), w3lib canonicalisation and
tldextract scope checks, an in-memory set for dedup and a deque for the
frontier; no Redis, no politeness, no output.  It is the floor crawld's CPU
per page is compared with (bench/cpu_per_page.py).  Prints one JSON line:
pages, cpu_s (user+sys of this process), wall_s.

    python bench/leanloop.py --proxy http://127.0.0.1:PORT SEED_URL...
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
from collections import deque  # noqa: E402
from urllib.parse import urljoin, urlsplit  # noqa: E402

import gevent.pool  # noqa: E402
import requests  # noqa: E402
import tldextract  # noqa: E402
from requests.adapters import HTTPAdapter  # noqa: E402
from selectolax.lexbor import LexborHTMLParser  # noqa: E402
from w3lib.url import canonicalize_url  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("seeds", nargs="+")
    p.add_argument("--proxy")
    p.add_argument("--concurrency", type=int, default=32)
    args = p.parse_args()
    extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)
    domain = lambda host: extract(host).top_domain_under_public_suffix or host  # noqa: E731
    session = requests.Session()
    session.mount("http://", HTTPAdapter(pool_connections=64, pool_maxsize=args.concurrency, max_retries=0))
    if args.proxy:
        session.proxies.update({"http": args.proxy, "https": args.proxy})
    scope = {domain(urlsplit(s).hostname) for s in args.seeds}
    seen = {canonicalize_url(s) for s in args.seeds}
    todo = deque(args.seeds)
    pool = gevent.pool.Pool(args.concurrency)
    pages = 0

    def visit(url: str) -> None:
        nonlocal pages
        try:
            r = session.get(url, timeout=(10, 20), allow_redirects=False)
        except requests.RequestException:
            return
        pages += 1
        if not r.headers.get("content-type", "").startswith("text/html"):
            return
        tree = LexborHTMLParser(r.content)
        hrefs = {n.attrs.get("href") for n in tree.css("a[href]")}
        for href in hrefs:
            if not href or href.startswith("#"):
                continue
            absolute = urljoin(url, href)
            if not absolute.startswith(("http://", "https://")):
                continue
            canon = canonicalize_url(absolute)
            if canon in seen:
                continue
            host = urlsplit(canon).hostname
            if host and domain(host) in scope:
                seen.add(canon)
                todo.append(absolute)

    t0 = time.monotonic()
    while todo or pool.free_count() < pool.size:
        while todo and pool.free_count():
            pool.spawn(visit, todo.popleft())
        gevent.sleep(0.001 if not todo else 0)
    pool.join()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"pages": pages, "cpu_s": ru.ru_utime + ru.ru_stime, "wall_s": time.monotonic() - t0}))


if __name__ == "__main__":
    main()
