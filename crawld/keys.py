"""The Redis key schema: the one place that names crawld's keys.

Every key is namespaced by ``crawl_id``.  Keys that belong to a shard carry
the hash tag ``{crawl_id:shard}`` so that every Lua script touches a single
Redis Cluster slot; crawl-wide keys carry ``{crawl_id}``.  Lua scripts,
workers, the reclaim loop, the CLI and the tests all build keys through this
module and nowhere else.

Shard keys and their types:

========== ======== ==========================================================
name       type     contents
========== ======== ==========================================================
queue      zset     frontier entries, all scored 0, member
                    ``pkey \\x1f seq \\x1f attempts \\x1f payload``; lexical
                    order gives one FIFO per politeness key (Mercator back
                    queues inside one key)
sched      zset     politeness key -> next allowed fetch time (ms, Redis time)
gcra       hash     politeness key -> GCRA theoretical arrival time (ms)
inflight   hash     politeness key -> entries claimed and not yet acked
claimed    zset     claim token -> visibility deadline (ms, Redis time)
claims     hash     claim token -> ``pkey \\x1f attempts \\x1f payload``
seen       hash     layout of the shard's dedup structure of URLs ever queued
                    for fetching (crawld.dedup: backend, sizes, count); its
                    data keys extend the name: ``seen:<bucket>`` (intsets,
                    redis_set), ``seen:bits`` (Bloom bitmap) or ``seen:bf``
                    (RedisBloom); a plain set of 8-byte fingerprints in
                    crawls created before the dedup backends
dead       list     dead-lettered entries (JSON with reason)
stats      hash     monotonic counters: pushed, dup, claimed, acked, nacked,
                    reclaimed, dead, skipped, ...
seq        string   counter for queue order and claim tokens
skips      list     URLs to record without fetching, ``reason \x1f payload``
                    (out of scope, over depth, over budget, ...)
skipseen   hash     the same for fingerprints ever pushed to ``skips`` (one
                    row per URL): ``skipseen:<bucket>``, ``skipseen:bits``...
rates      hash     politeness key -> GCRA emission interval (microseconds)
                    when robots.txt Crawl-delay makes it slower than the crawl's
fails      hash     politeness key -> failures in a row (5xx, 429, connection)
parked     hash     politeness key -> why the host was given up
budget     hash     host name -> URLs queued (max_pages_per_host)
variants   hash     host name + path -> distinct queries queued
robots     hash     origin (scheme://host:port) -> robots.txt cache entry (JSON)
lease      string   token of the worker serving the shard (SET NX PX, renewed)
========== ======== ==========================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "crawld"

#: crawl ids are used inside key names and hash tags, so braces, colons and
#: whitespace are not allowed.
CRAWL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

#: the order in which frontier scripts receive the shard keys (KEYS[1..n]).
SHARD_KEY_NAMES = (
    "queue", "sched", "gcra", "inflight", "claimed", "claims",
    "seen", "dead", "stats", "seq", "skips", "skipseen", "rates",
    "fails", "parked", "budget", "variants", "robots", "lease",
)


def check_crawl_id(crawl_id: str) -> str:
    """Return ``crawl_id`` if it is usable in key names.

    Raises:
        ValueError: when it is empty, longer than 64 characters or holds
            characters other than letters, digits, ``.``, ``_`` and ``-``.
    """
    if not isinstance(crawl_id, str) or not CRAWL_ID_RE.match(crawl_id):
        raise ValueError(
            f"invalid crawl id {crawl_id!r}: use 1-64 letters, digits, '.', '_' or '-'"
        )
    return crawl_id


@dataclass(frozen=True)
class ShardKeys:
    """The keys of one shard of one crawl (see the module table)."""

    queue: str
    sched: str
    gcra: str
    inflight: str
    claimed: str
    claims: str
    seen: str
    dead: str
    stats: str
    seq: str
    skips: str
    skipseen: str
    rates: str
    fails: str
    parked: str
    budget: str
    variants: str
    robots: str
    lease: str

    def all(self) -> list[str]:
        """All keys in :data:`SHARD_KEY_NAMES` order, as Lua's KEYS expect."""
        return [getattr(self, n) for n in SHARD_KEY_NAMES]


def shard_tag(crawl_id: str, shard: int) -> str:
    """The hash tag shared by every key of one shard: ``{crawl_id:shard}``."""
    return "{%s:%d}" % (crawl_id, shard)


def shard_keys(crawl_id: str, shard: int) -> ShardKeys:
    """Keys of ``shard`` (0-based) of ``crawl_id``."""
    base = f"{PREFIX}:{shard_tag(crawl_id, shard)}:"
    return ShardKeys(**{n: base + n for n in SHARD_KEY_NAMES})


def crawl_config(crawl_id: str) -> str:
    """String key holding the crawl's config as JSON (see crawld.config)."""
    return f"{PREFIX}:{{{crawl_id}}}:config"


def crawl_control(crawl_id: str) -> str:
    """Hash of operator requests for a crawl (e.g. ``drain`` -> 1)."""
    return f"{PREFIX}:{{{crawl_id}}}:control"


def crawl_state(crawl_id: str) -> str:
    """String key holding the operator's state of a crawl: ``active``
    (also when the key is absent), ``paused``, ``cancelled``
    (``crawlctl pause|resume|cancel``) or ``rebalancing`` (``crawlctl
    rebalance``, see crawld.rebalance).  Workers read it every second or
    so: they claim nothing for a paused crawl, and stop serving a cancelled
    or rebalancing one once what they hold is committed (giving its leases
    up; a rebalancing crawl is served again, with its new config, once it
    is active again).  Cancelled is final."""
    return f"{PREFIX}:{{{crawl_id}}}:state"


#: the values of :func:`crawl_state` (absent means ``active``).
STATES = ("active", "paused", "cancelled", "rebalancing")


def crawl_patterns(crawl_id: str) -> tuple[str, str]:
    """SCAN match patterns that together cover every key of a crawl."""
    return (f"{PREFIX}:{{{crawl_id}}}:*", f"{PREFIX}:{{{crawl_id}:*")


def crawl_epoch(crawl_id: str) -> str:
    """String counter: the crawl's rebalance generation (absent = 0),
    incremented by each ``crawlctl rebalance`` after it stores the new
    config.  Every shard records the generation it was last moved in
    (``stats`` field ``rebalance_epoch``), and the lease script refuses a
    worker whose view of the crawl is older (crawld.rebalance)."""
    return f"{PREFIX}:{{{crawl_id}}}:epoch"


def crawl_rebalance(crawl_id: str) -> str:
    """Hash: progress of a ``crawlctl rebalance`` under way (``from``,
    ``to``, ``token``, ``prev_state``, ``phase`` and per-source-shard
    ``done:<shard>``), deleted when it completes; a re-run resumes it.
    ``prev_state`` is the state the crawl gets back at the end
    (``crawlctl pause|resume|cancel`` during a rebalance change it)."""
    return f"{PREFIX}:{{{crawl_id}}}:rebalance"


def crawl_rebalance_lock(crawl_id: str) -> str:
    """String with a TTL: held (``host:pid:nonce``) by the one
    ``crawlctl rebalance`` process working on the crawl, renewed while it
    runs; a second one refuses to start until it expires."""
    return f"{PREFIX}:{{{crawl_id}}}:rebalance:lock"


#: set of the ids of crawls that have a config in this Redis.
CRAWLS = f"{PREFIX}:crawls"


def family_merges(family: str) -> str:
    """Hash of the merged crawls of a crawl family (``CrawlConfig.family``):
    crawl id -> JSON ``{rows, duplicates, cross_shard_duplicates, created_at,
    merged_at, artifact, ...}``, written by each merge and read by
    ``crawlctl verify`` to compare a crawl with the previous one."""
    return f"{PREFIX}:family:{family}:merges"

#: hash: "host:pid" of each running crawld -> its state (JSON: shards,
#: children, restarts, given-up children, updated_at).
SUPERVISORS = f"{PREFIX}:supervisors"

#: hash: shard number (or "all") -> Unix time a drain was asked for
#: (``crawlctl drain``).  Workers of a drained shard stop claiming, finish
#: what they hold, give their leases up and wait until the field is removed.
DRAIN = f"{PREFIX}:drain"
