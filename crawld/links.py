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

A sitemap is pushed to be fetched when in scope (``out_of_scope``
otherwise) and no deeper than :data:`crawld.sitemaps.MAX_NESTING` levels
of sitemap indexes (``sitemap_too_deep`` otherwise); a sitemap entry's
``depth`` is its nesting level.

An http(s) link that cannot become a URL (``http://www..example.com/``, a
bad port, an IPv4 address out of range: :func:`crawld.urls.resolve_link`)
is recorded too, as ``invalid_url: <why>``, under the printable form of the
href as written (:func:`crawld.urls.link_record`), on the shard of the page
that carries it: the same invalid href on many pages is one row.

The page budget and query-variant limit are applied by the push script.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .config import CrawlConfig
from .frontier import Entry, PushItem
from .scope import Router, trap_reason, variant_key
from .sitemaps import MAX_NESTING
from .urls import fingerprint, link_record, resolve_link

#: (shard, local dedup key, item)
Push = tuple[int, bytes, PushItem]


#: the mode (and row ``error``) of a link that cannot become a URL is this,
#: then ": " and why
INVALID_URL = "invalid_url"

#: robots directives that carry a value after a colon (Google Search
#: Central, "Robots meta tag, data-nosnippet, and X-Robots-Tag
#: specifications", /search/docs/crawling-indexing/robots-meta-tag):
#: ``max-snippet: 20`` names no user agent
_VALUED = frozenset({"unavailable_after", "max-snippet", "max-image-preview", "max-video-preview"})
#: ``<user-agent>:`` at the start of an X-Robots-Tag item: a product token
#: (no whitespace, comma or colon), as in ``googlebot: nofollow``
_AGENT_PREFIX = re.compile(r"^\s*([^\s,:]+)\s*:(.*)$", re.S)


def _split_items(value: str) -> list[str]:
    """The comma-separated items of one directive list, with the commas of
    an ``unavailable_after`` date (RFC 822 ``Wed, 03 Dec 2025 ...``, RFC
    850 ``Wednesday, 03-Dec-25 ...``) kept inside its item."""
    items: list[str] = []
    for part in value.split(","):
        if items and part.strip()[:1].isdigit() and items[-1].strip().lower().startswith("unavailable_after"):
            items[-1] += "," + part
        else:
            items.append(part)
    return items


def robots_directives(meta_robots: str | None, x_robots_tag: str | Sequence[str] | None, agent: str) -> set[str]:
    """Directives (``noindex``, ``nofollow``, ``max-snippet: 20``, ...) of a
    page for the crawler whose robots.txt product token is ``agent``, from
    ``<meta name=robots>`` and the X-Robots-Tag header lines, lower-case;
    ``none`` adds ``noindex`` and ``nofollow``.

    ``x_robots_tag`` is the list of the response's X-Robots-Tag field lines
    as received, one item per line (a str is one line).  They must not be
    joined first: ``otherbot: noindex`` and ``nofollow`` on two lines give
    ``nofollow`` to every crawler, while the single line ``otherbot:
    noindex, nofollow`` gives both to otherbot only.

    Syntax (Google Search Central, "Robots meta tag, data-nosnippet, and
    X-Robots-Tag specifications", "Using the X-Robots-Tag HTTP header"; the
    same reading as MDN's X-Robots-Tag reference): a line is a
    comma-separated list of rules, "the X-Robots-Tag may optionally specify
    a user agent before the rules", and "rules specified without a user
    agent are valid for all crawlers".  A ``<user-agent>:`` prefix scopes
    the rules after it, up to the next prefix or the end of the line, so
    ``googlebot: noindex, otherbot: nofollow`` gives ``noindex`` to
    googlebot and ``nofollow`` to otherbot; each line starts unscoped.
    Valued rules (``unavailable_after: <date>``, ``max-snippet: 20``, ...)
    are not user agents.  Names are case-insensitive; ``*`` counts as
    every agent.  Conflicting rules: "the more restrictive rule applies",
    so the result is the union of every rule that applies to ``agent``.
    """
    out = {p.strip().lower() for p in (meta_robots or "").split(",") if p.strip()}
    lines = [x_robots_tag] if isinstance(x_robots_tag, str) else list(x_robots_tag or ())
    me = agent.strip().lower()
    for line in lines:
        applies = True  # unscoped until a user agent is named
        for item in _split_items(line or ""):
            m = _AGENT_PREFIX.match(item)
            if m and m.group(1).lower() not in _VALUED:
                applies = m.group(1).lower() in (me, "*")
                m, item = _AGENT_PREFIX.match(m.group(2)), m.group(2)
            if m and m.group(1).lower() in _VALUED:  # a valued rule, written "name: value"
                item = f"{m.group(1)}: {m.group(2).strip()}"
            rule = " ".join(item.split()).lower()
            if rule and applies:
                out.add(rule)
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
        """The push for one URL, or None if this worker pushed it already.

        ``kind`` is the entry's (``page`` or ``sitemap``); for a sitemap,
        ``depth`` is its nesting level (0: named by robots.txt)."""
        mode = self.mode(canonical, depth, nofollow) if kind == "page" else self._sitemap_mode(canonical, depth)
        fp = fingerprint(canonical)
        key = fp if not mode else fp + b"s"
        if key in self.pushed:
            self.local_dups += 1
            return None
        r = self.router.route(canonical)
        payload = Entry(url, canonical, depth, referrer, redirect_chain, kind).to_payload()
        vkey = variant_key(canonical) if not mode else ""
        return r.shard, key, PushItem(fp, r.pkey, r.host, vkey, mode, payload)

    def _sitemap_mode(self, canonical: str, level: int) -> str:
        """Why the sitemap ``canonical`` at nesting ``level`` (its entry's
        ``depth``) is not to be fetched ("" if it is)."""
        if not self.router.route(canonical).in_scope:
            return "out_of_scope"
        if level > MAX_NESTING:
            return "sitemap_too_deep"
        return ""

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
