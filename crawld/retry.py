"""``crawlctl retry``: fetch again, in the same crawl, the URLs whose row is
an error (nothing is lost for good: DESIGN.md promise 4).

The rows are read from the crawl's artifact, merged first so that it holds
the newest row of every URL.  The selected URLs are queued again on their
shards past the visited set (``crawld/lua/requeue.lua``), each carrying the
crawl's next *retry generation* (:func:`crawld.keys.crawl_retries`); the
worker writes that generation into the new row (``retry``), and the next
merge keeps, of each URL, the row of the latest generation and says how
many older rows it replaced (:class:`crawld.merge.MergeResult` ``retried``).

What may be retried: errors (rows with outcome ``error``: no usable
response; and responses with an error status, outcome ``fetched``: by
default 5xx and 429, any with ``--status``), ``dead_letter`` rows, and the
URLs of a host that was given up (``skipped`` with ``host_parked: ...``) or
whose robots.txt could not be read (``blocked`` with ``robots_unreachable:
...``).
Never what the crawl's rules or the site refused (out of scope, over depth,
robots.txt disallowed, an address the policy blocks): retrying those would
break them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pyarrow.parquet as pq
import redis

from . import keys
from .config import CrawlConfig
from .frontier import Entry, Frontier
from .scope import Router

#: ``--outcome`` values: a row outcome, or the reason of the not-fetched rows
#: that may be retried
OUTCOMES = ("error", "dead_letter", "host_parked", "robots_unreachable")
#: what ``crawlctl retry`` selects by default
DEFAULT_OUTCOMES = ("error", "dead_letter")
#: statuses selected when no ``--status`` is given: server errors, 429, no response
DEFAULT_STATUSES = ("5xx", "429", "none")
#: URLs queued per script call
BATCH = 500
_COLUMNS = ["url", "canonical_url", "outcome", "status", "host", "depth", "referrer", "redirect_chain", "error"]


def check_status(value: str) -> str:
    """A ``--status`` value: ``4xx``/``5xx``, a status code, or ``none`` (no
    response).

    Raises:
        ValueError: anything else.
    """
    v = value.strip().lower()
    if v == "none" or (len(v) == 3 and v[0] in "12345" and (v[1:] == "xx" or v.isdigit())):
        return v
    raise ValueError(f"status {value!r}: use 4xx, 5xx, a code such as 503, or none")


@dataclass(frozen=True)
class RetryFilter:
    """Which rows to retry: ``outcomes`` (:data:`OUTCOMES`), ``statuses``
    (:func:`check_status` values; empty = :data:`DEFAULT_STATUSES`), ``hosts``
    (host names or registered domains, lower case; empty = any)."""

    outcomes: tuple[str, ...] = DEFAULT_OUTCOMES
    statuses: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()

    def kind(self, row: dict[str, Any]) -> str | None:
        """The :data:`OUTCOMES` value ``row`` counts under, or None."""
        outcome, error = row.get("outcome"), row.get("error") or ""
        if outcome in ("error", "dead_letter"):
            return outcome
        if outcome == "fetched" and (row.get("status") or 0) >= 400:
            return "error"
        if outcome == "skipped" and error.startswith("host_parked"):
            return "host_parked"
        if outcome == "blocked" and error.startswith(("robots_unreachable", "host_parked: robots_unreachable")):
            return "robots_unreachable"
        return None

    def matches(self, row: dict[str, Any]) -> bool:
        """Whether ``row`` (an artifact row as a dict) is to be retried."""
        kind = self.kind(row)
        if kind is None or kind not in self.outcomes:
            return False
        status = row.get("status")
        code = "none" if status is None else str(status)
        if not any(s == code or (s.endswith("xx") and code[:1] == s[0]) for s in self.statuses or DEFAULT_STATUSES):
            return False
        if self.hosts:
            host = (row.get("host") or "").lower()
            if not any(host == h or host.endswith("." + h) for h in self.hosts):
                return False
        return True


def select(artifact: str | Path, flt: RetryFilter) -> list[dict[str, Any]]:
    """The rows of ``artifact`` (a Parquet file) that ``flt`` matches."""
    table = pq.read_table(artifact, columns=_COLUMNS)
    return [r for r in table.to_pylist() if flt.matches(r)]


def requeue(client: redis.Redis, config: CrawlConfig, rows: Iterable[dict[str, Any]]) -> tuple[int, dict[int, int]]:
    """Queue ``rows``' URLs again under the crawl's next retry generation;
    returns ``(generation, URLs queued per shard)``."""
    rows = list(rows)
    gen = int(client.incr(keys.crawl_retries(config.crawl_id)))
    router = Router(config)
    frontier = Frontier(client, config)
    by_shard: dict[int, list[tuple[str, bytes]]] = defaultdict(list)
    for r in rows:
        canon = r["canonical_url"]
        route = router.route(canon)
        entry = Entry(r["url"], canon, int(r.get("depth") or 0), r.get("referrer"),
                      tuple(r.get("redirect_chain") or ()), retry=gen)
        by_shard[route.shard].append((route.pkey, entry.to_payload()))
    queued: dict[int, int] = {}
    for shard, items in sorted(by_shard.items()):
        queued[shard] = sum(frontier.requeue(shard, items[i:i + BATCH]) for i in range(0, len(items), BATCH))
    return gen, queued


def describe(rows: list[dict[str, Any]], flt: RetryFilter) -> str:
    """``error=12 dead_letter=5`` for the selected rows."""
    c = Counter(flt.kind(r) for r in rows)
    return " ".join(f"{k}={c[k]}" for k in OUTCOMES if c[k]) or "none"
