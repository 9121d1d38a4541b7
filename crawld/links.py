"""From discovered URLs to frontier pushes (pure, given a router).

Every URL a page, a redirect or a sitemap names is pushed to the shard
that owns it: to be fetched, or to be recorded without a fetch with the
reason (a skip "mode"), so that every URL ends as a row.  In order:

``out_of_scope``  its registered domain is not the seeds' nor allowed;
``over_depth``    deeper than ``max_depth``;
``nofollow``      rel=nofollow, or the page's robots meta / X-Robots-Tag
                  says nofollow (when the config honours them);
``url_too_long``, ``path_loop``  crawler traps (:func:`scope.trap_reason`);
``robots_disallowed``  the target origin's robots.txt, when this worker
                  already holds it, forbids it (saves a politeness slot).

An http(s) link that cannot become a URL (``http://www..example.com/``, a
bad port, an IPv4 address out of range: :func:`crawld.urls.resolve_link`)
is recorded too, as ``invalid_url: <why>``, under the printable form of the
href as written (:func:`crawld.urls.link_record`), on the shard of the page
that carries it: the same invalid href on many pages is one row.

The page budget and query-variant limit are applied by the push script.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .config import CrawlConfig
from .frontier import Entry, PushItem
from .scope import Router, trap_reason, variant_key
from .urls import fingerprint, link_record, resolve_link

#: (shard, local dedup key, item)
Push = tuple[int, bytes, PushItem]


#: the mode (and row ``error``) of a link that cannot become a URL is this,
#: then ": " and why
INVALID_URL = "invalid_url"

#: X-Robots-Tag directives that carry a value after a colon
_VALUED = ("unavailable_after", "max-snippet", "max-image-preview", "max-video-preview")


def robots_directives(meta_robots: str | None, x_robots_tag: str | None, agent: str) -> set[str]:
    """Directives (``noindex``, ``nofollow``, ...) of a page for ``agent``,
    from ``<meta name=robots>`` and X-Robots-Tag; ``none`` means both.

    An X-Robots-Tag value may start with a user agent (``googlebot:
    noindex, nofollow``, Google's syntax); it then applies only if that is
    ``agent``.
    """
    out = {p.strip().lower() for p in (meta_robots or "").split(",") if p.strip()}
    value = (x_robots_tag or "").strip()
    head, sep, rest = value.partition(":")
    if sep and head.strip().lower() not in _VALUED and "," not in head:
        value = rest if head.strip().lower() in (agent.lower(), "*") else ""
    out |= {p.strip().lower() for p in value.split(",") if p.strip()}
    if "none" in out:
        out |= {"noindex", "nofollow"}
    return out


def origin_of(canonical_url: str) -> str:
    """``scheme://host[:port]`` of a canonical URL."""
    scheme, rest = canonical_url.split("://", 1)
    return scheme + "://" + rest.split("/", 1)[0]


@dataclass
class LinkPlanner:
    """Turns URLs into pushes for one worker.

    ``robots_allows(origin, url)`` answers from the worker's robots.txt
    memory (None when it does not know).  ``pushed`` is the worker's set of
    dedup keys already pushed (skipping re-pushes saves round trips; the
    push script is still the authority); ``local_dups`` counts the URLs
    dropped that way.
    """

    config: CrawlConfig
    router: Router
    robots_allows: Callable[[str, str], bool | None]
    pushed: set[bytes] = field(default_factory=set)
    local_dups: int = 0  # plans dropped because this worker pushed the key already

    def mode(self, canonical: str, depth: int, nofollow: bool = False) -> str:
        """Why ``canonical`` at ``depth`` is not to be fetched ("" if it is)."""
        cfg = self.config
        r = self.router.route(canonical)
        if not r.in_scope:
            return "out_of_scope"
        if depth > cfg.max_depth:
            return "over_depth"
        if nofollow:
            return "nofollow"
        trap = trap_reason(canonical, cfg.max_url_length, cfg.max_path_repeats)
        if trap:
            return trap
        if self.robots_allows(origin_of(canonical), canonical) is False:
            return "robots_disallowed"
        return ""

    def plan(self, url: str, canonical: str, depth: int, referrer: str | None, *, nofollow: bool = False,
             redirect_chain: tuple[str, ...] = (), kind: str = "page") -> Push | None:
        """The push for one URL, or None if this worker pushed it already."""
        mode = self.mode(canonical, depth, nofollow) if kind == "page" else self._sitemap_mode(canonical)
        fp = fingerprint(canonical)
        key = fp if not mode else fp + b"s"
        if key in self.pushed:
            self.local_dups += 1
            return None
        r = self.router.route(canonical)
        payload = Entry(url, canonical, depth, referrer, redirect_chain, kind).to_payload()
        vkey = variant_key(canonical) if not mode else ""
        return r.shard, key, PushItem(fp, r.pkey, r.host, vkey, mode, payload)

    def _sitemap_mode(self, canonical: str) -> str:
        return "" if self.router.route(canonical).in_scope else "out_of_scope"

    def plan_invalid(self, record: str, why: str, depth: int, referrer: str, page_canonical: str) -> Push | None:
        """The push recording an invalid link (see the module docstring):
        ``record`` is its :func:`~crawld.urls.link_record` form, ``why`` the
        reason, ``page_canonical`` the canonical URL of the page carrying it,
        whose route (shard, politeness key, host) it takes.  None if this
        worker pushed it already."""
        fp = fingerprint(record)
        key = fp + b"s"
        if key in self.pushed:
            self.local_dups += 1
            return None
        r = self.router.route(page_canonical)
        payload = Entry(record, record, depth, referrer).to_payload()
        return r.shard, key, PushItem(fp, r.pkey, r.host, "", f"{INVALID_URL}: {why}", payload)

    def row_host(self, entry: Entry, mode: str) -> str:
        """The ``host`` of the row of ``entry`` recorded with ``mode``: its
        URL's, or for an invalid link (not a URL) the host of the page that
        carries it."""
        if mode.startswith(INVALID_URL):
            page = self.router.canonical(entry.referrer) if entry.referrer else None
            return self.router.route(page).host if page else ""
        return self.router.route(entry.canonical).host

    def page_links(self, page_url: str, base: str, hrefs: list[str], nofollow_hrefs: set[str],
                   depth: int, nofollow_all: bool) -> tuple[list[str], list[Push]]:
        """``(outlinks, pushes)`` for the links of a fetched page at
        ``depth``: outlinks are the canonical URLs, in order, once each
        (an invalid link: its recorded form)."""
        router = self.router
        honour = self.config.honour_nofollow
        outlinks: list[str] = []
        pushes: list[Push] = []
        seen_here: set[str] = set()
        for href in hrefs:
            absolute, why = resolve_link(base, href)
            if absolute is None:
                if why is None:
                    continue  # not a link: fragment-only, mailto:, javascript: ...
                record = link_record(href)
                if record in seen_here:
                    continue
                seen_here.add(record)
                outlinks.append(record)
                page = router.canonical(page_url)
                if page is not None:
                    p = self.plan_invalid(record, why, depth + 1, page_url, page)
                    if p is not None:
                        pushes.append(p)
                continue
            canon = router.canonical(absolute)
            if canon is None or canon in seen_here:
                continue
            seen_here.add(canon)
            outlinks.append(canon)
            nofollow = nofollow_all or (honour and href in nofollow_hrefs)
            p = self.plan(absolute, canon, depth + 1, page_url, nofollow=nofollow)
            if p is not None:
                pushes.append(p)
        return outlinks, pushes

    def remember(self, keys) -> None:
        """Note dedup keys whose push was committed."""
        if len(self.pushed) > 500_000:
            self.pushed.clear()
        self.pushed.update(keys)
