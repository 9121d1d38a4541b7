"""The artifact's row: its Arrow schema and how a fetch becomes a row.

One row per URL.  Workers write rows as NDJSON lines (``fetched_at`` as
integer Unix milliseconds); ``crawlctl merge`` reads them with
:data:`NDJSON_SCHEMA` and writes Parquet with :data:`SCHEMA`.

``outcome`` is one of:

* ``fetched``   a response arrived (any status that is not a redirect);
* ``redirect``  the URL redirects, and ``redirect_kind`` says how:
                ``http``, a 3xx with a Location; ``meta_refresh``, an HTML
                page whose ``<meta http-equiv=refresh>`` names another URL,
                whatever its delay (``refresh_delay_s``).  ``final_url`` is
                where it points, and that URL has its own row (when in
                scope) with this one in its ``redirect_chain``.  A
                meta-refresh row is also the page's own: status (2xx),
                title, robots meta, canonical link and outlinks, its links
                followed.  Search engines follow both kinds (Google Search
                Central, "Redirects and Google Search": an instant meta
                refresh is read as a permanent redirect, a delayed one as a
                temporary redirect), so an audit counts both in redirect
                chains; a refresh that reloads the page itself (no URL, or
                its own) is not a redirect: ``fetched`` with
                ``refresh_delay_s``;
* ``error``     no usable response; ``error`` says why (``connect: ...``,
                ``timeout: ...``, ``deadline: ...``, ``protocol: ...``,
                ``bad_redirect: ...``, ``redirect_loop: ...``,
                ``too_many_redirects: ...``, ... - the redirect ones with
                their ``redirect_kind``);
* ``blocked``   not fetched on the site's or the operator's word:
                ``robots_disallowed``, ``robots_unreachable: ...``,
                ``address_blocked: ...``;
* ``skipped``   not fetched by the crawl's limits: ``out_of_scope``,
                ``over_depth``, ``over_budget``, ``too_many_query_variants``,
                ``url_too_long``, ``path_loop``, ``nofollow``,
                ``sitemap_too_deep``, ``host_parked: ...``, ``invalid_url: ...``
                (in ``error``; an http(s) link that cannot become a URL, its
                row's ``url`` and ``canonical_url`` the href as written,
                :func:`crawld.urls.link_record`);
* ``dead_letter`` the URL was given up after ``max_attempts`` claims (its
                worker kept dying, or it kept failing); ``error`` is the
                reason and ``fetched_at`` when it was given up.

For rows not fetched, ``fetched_at`` is when the decision was recorded.
``retry`` is 0, or the generation of the ``crawlctl retry`` that queued the
URL again (crawld.retry): of the rows of one URL, the merge keeps the one of
the latest generation.

Schema versions (``crawld.schema_version`` in the Parquet metadata): 1, the
first; 2 adds ``redirect_kind``, ``refresh_delay_s`` and ``retry``.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa

#: columns of the Parquet artifact.
SCHEMA = pa.schema([
    pa.field("crawl_id", pa.string(), nullable=False),
    pa.field("url", pa.string(), nullable=False),
    pa.field("canonical_url", pa.string(), nullable=False),
    pa.field("final_url", pa.string()),
    pa.field("outcome", pa.string(), nullable=False),
    pa.field("status", pa.int32()),
    pa.field("redirect_chain", pa.list_(pa.string())),
    pa.field("redirect_kind", pa.string()),
    pa.field("refresh_delay_s", pa.int32()),
    pa.field("content_type", pa.string()),
    pa.field("content_length", pa.int64()),
    pa.field("truncated", pa.bool_()),
    pa.field("title", pa.string()),
    pa.field("meta_robots", pa.string()),
    pa.field("canonical_link", pa.string()),
    pa.field("x_robots_tag", pa.string()),
    pa.field("depth", pa.int32()),
    pa.field("referrer", pa.string()),
    pa.field("outlinks", pa.list_(pa.string())),
    pa.field("host", pa.string()),
    pa.field("fetched_at", pa.timestamp("ms", tz="UTC")),
    pa.field("response_ms", pa.float64()),
    pa.field("error", pa.string()),
    pa.field("shard", pa.int32()),
    pa.field("attempt", pa.int32()),
    pa.field("retry", pa.int32()),
], metadata={"crawld.schema_version": "2"})

#: the same columns as written in NDJSON parts (timestamps as int ms).
NDJSON_SCHEMA = pa.schema([
    f if f.name != "fetched_at" else pa.field("fetched_at", pa.int64()) for f in SCHEMA
])

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})

#: ``redirect_kind`` values: a 3xx Location, a ``<meta http-equiv=refresh>``
REDIRECT_KINDS = ("http", "meta_refresh")

#: the reason of a URL whose robots.txt could not be read
ROBOTS_UNREACHABLE = "robots_unreachable"
#: skip reasons (the ``mode`` of a frontier entry) whose row is ``blocked``
#: rather than ``skipped``
BLOCKED_MODES = ("robots_disallowed", ROBOTS_UNREACHABLE, "address_blocked")


def outcome_of_mode(mode: str) -> str:
    """``blocked`` or ``skipped`` for a URL recorded without a fetch.  A
    host given up because its robots.txt could not be read
    (``host_parked: robots_unreachable: ...``) is ``blocked``: RFC 9309
    section 2.3.1.4 reads an unreachable robots.txt as a complete disallow."""
    if mode.startswith(BLOCKED_MODES) or mode.startswith("host_parked: " + ROBOTS_UNREACHABLE):
        return "blocked"
    return "skipped"


def make_row(*, crawl_id: str, url: str, canonical_url: str, outcome: str, shard: int, attempt: int,
             depth: int, referrer: str | None, host: str, fetched_at: float, response_ms: float,
             status: int | None = None, final_url: str | None = None,
             redirect_chain: tuple[str, ...] | list[str] = (), redirect_kind: str | None = None,
             refresh_delay_s: int | None = None, content_type: str | None = None,
             content_length: int | None = None, truncated: bool = False, title: str | None = None,
             meta_robots: str | None = None, canonical_link: str | None = None,
             x_robots_tag: str | None = None, outlinks: list[str] | None = None,
             error: str | None = None, retry: int = 0) -> dict[str, Any]:
    """A row as a dict ready for NDJSON; ``fetched_at`` in Unix seconds."""
    return {
        "crawl_id": crawl_id,
        "url": url,
        "canonical_url": canonical_url,
        "final_url": final_url if final_url is not None else (url if status is not None else None),
        "outcome": outcome,
        "status": status,
        "redirect_chain": list(redirect_chain),
        "redirect_kind": redirect_kind,
        "refresh_delay_s": refresh_delay_s,
        "content_type": content_type,
        "content_length": content_length,
        "truncated": truncated,
        "title": title,
        "meta_robots": meta_robots,
        "canonical_link": canonical_link,
        "x_robots_tag": x_robots_tag,
        "depth": depth,
        "referrer": referrer,
        "outlinks": outlinks or [],
        "host": host,
        "fetched_at": int(fetched_at * 1000),
        "response_ms": round(response_ms, 3),
        "error": error,
        "shard": shard,
        "attempt": attempt,
        "retry": retry,
    }


def dead_letter_row(crawl_id: str, shard: int, dead: dict[str, Any]) -> dict[str, Any]:
    """The row of a dead-lettered entry (as :meth:`Frontier.dead_letters`
    returns it).  An unreadable payload still yields a row naming it."""
    try:
        p = json.loads(dead.get("payload") or "{}")
    except ValueError:
        p = {}
    url = p.get("u") or f"urn:crawld:unreadable-entry:{dead.get('pkey', '')}"
    canonical = p.get("c") or url
    try:
        host = urlsplit(canonical).hostname or ""
    except ValueError:  # an invalid link's recorded form (invalid_url) need not split: "http://[oops/"
        host = ""
    return make_row(crawl_id=crawl_id, url=url, canonical_url=canonical, outcome="dead_letter", shard=shard,
                    attempt=int(dead.get("attempts") or 0), depth=int(p.get("d") or 0), referrer=p.get("r"),
                    host=host, fetched_at=float(dead.get("at_us") or 0) / 1e6,
                    response_ms=0.0, redirect_chain=p.get("rc") or (), retry=int(p.get("rg") or 0),
                    error=str(dead.get("reason") or "") + (f" (while recording: {dead['mode']})" if dead.get("mode") else ""))
