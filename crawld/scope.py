"""Scope and routing: is a URL in the crawl, and which shard owns it.

A URL is in scope when its politeness key (registered domain, see
:mod:`crawld.sharding`) is one of the seeds' or in ``allow_domains``.
:class:`Router` memoises canonicalisation and per-host routing, the hot path
of link extraction: a documentation page repeats the same navigation links
on every page, so most lookups are cache hits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .config import CrawlConfig
from .sharding import politeness_key, shard_for
from .urls import BadURL, canonicalize, compile_strip, url_host


@dataclass(frozen=True)
class Route:
    """Where a canonical URL goes: its ``host``, politeness key ``pkey``,
    owning ``shard`` and whether it is ``in_scope``."""

    host: str
    pkey: str
    shard: int
    in_scope: bool


def scope_keys(config: CrawlConfig) -> frozenset[str]:
    """Politeness keys in scope: the seeds' and ``allow_domains``.

    Raises:
        BadURL: a seed is not a crawlable URL.
    """
    ks = set()
    private = config.psl_private_domains
    for seed in config.seeds:
        ks.add(politeness_key(url_host(canonicalize(seed)), private))
    for d in config.allow_domains:
        ks.add(politeness_key(d, private))
    return frozenset(ks)


def trap_reason(canonical_url: str, max_url_length: int, max_path_repeats: int) -> str | None:
    """Why a URL looks like a crawler trap, or None.

    ``url_too_long`` past ``max_url_length`` characters; ``path_loop``
    when one path segment repeats more than ``max_path_repeats`` times
    (relative-link loops such as ``/a/b/a/b/a/b/...``).
    """
    if len(canonical_url) > max_url_length:
        return "url_too_long"
    parts = canonical_url.split("/", 3)
    if len(parts) == 4:
        path = parts[3].split("?", 1)[0]
        segments = [seg for seg in path.split("/") if seg]
        if len(segments) > max_path_repeats and Counter(segments).most_common(1)[0][1] > max_path_repeats:
            return "path_loop"
    return None


def variant_key(canonical_url: str) -> str:
    """``host/path`` of a URL with a query (counted against
    ``max_query_variants``), or "" for a URL without one."""
    if "?" not in canonical_url:
        return ""
    return canonical_url.split("://", 1)[-1].split("?", 1)[0]


class Router:
    """Canonicalise and route URLs for one crawl, with bounded memo caches.

    A URL's shard is :func:`crawld.sharding.shard_for` of its politeness key,
    so the crawl's ``shard_overrides`` pin domains wherever URLs are routed.

    ``scope`` adds registered domains to the config's own (the crawl's
    scope set in Redis, :func:`crawld.crawls.load_scope`: seeds given from
    a file are not in the config).  ``max_cache`` bounds each cache
    (entries); a full cache is cleared.
    """

    def __init__(self, config: CrawlConfig, max_cache: int = 200_000, scope=None):
        self.config = config
        self.scope = scope_keys(config) | frozenset(scope or ())
        self._strip = compile_strip(config.strip_params)
        self._overrides = config.shard_override_map
        self._canon: dict[str, str | None] = {}
        self._routes: dict[str, Route] = {}
        self._max = max_cache

    def widen(self, domains) -> None:
        """Add registered domains to the scope (seeds added to a live crawl)."""
        new = frozenset(domains) - self.scope
        if new:
            self.scope = self.scope | new
            self._routes.clear()

    def canonical(self, url: str) -> str | None:
        """Canonical form of an absolute URL, or None when it is not
        crawlable (bad URL, non-http scheme)."""
        c = self._canon.get(url, False)
        if c is not False:
            return c
        try:
            c = canonicalize(url, self._strip)
        except BadURL:
            c = None
        if len(self._canon) >= self._max:
            self._canon.clear()
        self._canon[url] = c
        return c

    def route(self, canonical_url: str) -> Route:
        """Route of a canonical URL (from :meth:`canonical`).

        Raises:
            ValueError: the URL has no host.
        """
        # canonical URLs are scheme://netloc/...: the netloc is the third
        # slash-separated field
        netloc = canonical_url.split("/", 3)[2]
        r = self._routes.get(netloc)
        if r is None:
            host = url_host(canonical_url)
            pkey = politeness_key(host, self.config.psl_private_domains)
            r = Route(host, pkey, shard_for(pkey, self.config.num_shards, self._overrides), pkey in self.scope)
            if len(self._routes) >= self._max:
                self._routes.clear()
            self._routes[netloc] = r
        return r
