"""The Redis key schema: the one place that names crawld's keys.

Keys that belong to a shard carry the hash tag of the shard *number*,
``{s<shard>}``, whatever the crawl: every crawl that routes a registered
domain to shard N (:mod:`crawld.sharding`) keeps that domain's queues in the
same Redis Cluster slot as the domain's *politeness state*, which is one
per registered domain for the whole fleet, shared by every crawl
(:data:`SHARED_KEY_NAMES`: the GCRA timestamp, in-flight count, adapted
rate, failure count, Retry-After hold, robots.txt cache).  So the claim
script of any crawl reads and updates the one politeness state of a domain
atomically, in one Lua script on one slot, on a single Redis and on Redis
Cluster alike.  Two crawls that would route a shared domain to different
shard numbers (other shard counts or ``shard_overrides``) cannot share it:
``crawlctl seed`` refuses such a crawl (:mod:`crawld.crawls`).

Keys of one crawl on a shard are named ``crawld:{s<N>}:crawl:<crawl_id>:<name>``;
shared keys ``crawld:{s<N>}:<name>``; crawl-wide keys carry ``{crawl_id}``.
Lua scripts, workers, the reclaim loop, the CLI and the tests all build keys
through this module and nowhere else.

Shard keys and their types (``s``: shared by every crawl, ``c``: one crawl's):

========== = ======== ========================================================
name       . type     contents
========== = ======== ========================================================
queue      c zset     frontier entries, all scored 0, member
                      ``pkey \\x1f seq \\x1f attempts \\x1f payload``; lexical
                      order gives one FIFO per politeness key (Mercator back
                      queues inside one key)
sched      c zset     politeness key -> next time this crawl may claim it
                      (us, Redis time)
gcra       s hash     politeness key -> GCRA theoretical arrival time (us)
inflight   s hash     politeness key -> fetches in flight, every crawl's
claimed    c zset     claim token -> visibility deadline (us, Redis time)
claims     c hash     claim token -> ``pkey \\x1f attempts \\x1f payload``
seen       c hash     layout of the shard's dedup structure of URLs ever queued
                      for fetching (crawld.dedup: backend, sizes, count); its
                      data keys extend the name: ``seen:<bucket>`` (intsets,
                      redis_set), ``seen:bits`` (Bloom bitmap) or ``seen:bf``
                      (RedisBloom)
dead       c list     dead-lettered entries (JSON with reason)
stats      c hash     monotonic counters: pushed, dup, claimed, acked, nacked,
                      reclaimed, dead, skipped, ...
seq        c string   counter for queue order and claim tokens
skips      c list     URLs to record without fetching, ``reason \x1f payload``
                      (out of scope, over depth, over budget, ...)
skipseen   c hash     the same for fingerprints ever pushed to ``skips`` (one
                      row per URL): ``skipseen:<bucket>``, ``skipseen:bits``...
rates      s hash     politeness key -> GCRA emission interval (us) when
                      robots.txt Crawl-delay makes it slower than a crawl's
fails      s hash     politeness key -> ``failures in a row:first failure (us)``
parked     s hash     politeness key -> ``until (us)|why`` the host is given up
budget     c hash     host name -> URLs queued (max_pages_per_host)
variants   c hash     host name + path -> distinct queries queued
robots     s hash     origin (scheme://host:port) -> robots.txt cache entry (JSON)
lease      c string   token of the worker serving the shard (SET NX PX, renewed)
adapt      s hash     politeness key -> adapted interval after 429/503
                      (``interval:ceiling:last decrease``, us; crawld.politeness)
want       s hash     politeness key -> queue key of a crawl waiting for its
                      turn (fair share between crawls)
floor      s hash     politeness key -> ``interval:until`` (us): the slowest
                      crawl's own interval, binding every crawl until then
========== = ======== ========================================================
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
    "adapt", "want", "floor",
)

#: the shard keys shared by every crawl (the politeness state of the
#: registered domains a shard number owns, and the robots.txt cache)
SHARED_KEY_NAMES = frozenset({"gcra", "inflight", "rates", "fails", "parked", "robots", "adapt", "want", "floor"})


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
    adapt: str
    want: str
    floor: str

    def all(self) -> list[str]:
        """All keys in :data:`SHARD_KEY_NAMES` order, as Lua's KEYS expect."""
        return [getattr(self, n) for n in SHARD_KEY_NAMES]


def shard_tag(shard: int) -> str:
    """The hash tag of every key of shard number ``shard``, of any crawl:
    ``{s<shard>}``."""
    return "{s%d}" % shard


def shared_key(shard: int, name: str) -> str:
    """Shard number ``shard``'s shared key ``name`` (one of
    :data:`SHARED_KEY_NAMES`), which is the same for every crawl."""
    if name not in SHARED_KEY_NAMES:
        raise ValueError(f"{name!r} is not a shared shard key")
    return f"{PREFIX}:{shard_tag(shard)}:{name}"


def crawl_shard_prefix(crawl_id: str, shard: int) -> str:
    """The common prefix of the keys of one crawl on one shard (for SCAN)."""
    return f"{PREFIX}:{shard_tag(shard)}:crawl:{crawl_id}:"


def shard_keys(crawl_id: str, shard: int) -> ShardKeys:
    """Keys of ``shard`` (0-based) of ``crawl_id``: its own keys, and the
    shard's :data:`SHARED_KEY_NAMES`."""
    own = crawl_shard_prefix(crawl_id, shard)
    return ShardKeys(**{n: shared_key(shard, n) if n in SHARED_KEY_NAMES else own + n for n in SHARD_KEY_NAMES})


def robots_lock(shard: int, origin: str) -> str:
    """String with a TTL: held by the one process fetching ``origin``'s
    robots.txt (``origin`` is owned by shard number ``shard``); the others
    wait for the answer it stores in the shard's ``robots`` hash."""
    return f"{PREFIX}:{shard_tag(shard)}:robots-lock:{origin}"


def crawl_config(crawl_id: str) -> str:
    """String key holding the crawl's config as JSON (see crawld.config)."""
    return f"{PREFIX}:{{{crawl_id}}}:config"


def crawl_scope(crawl_id: str) -> str:
    """Set of the registered domains (politeness keys) in a crawl's scope:
    its seeds' and ``allow_domains``, added to by every ``crawlctl seed``.
    Workers read it (not the seed list) to decide what is in scope."""
    return f"{PREFIX}:{{{crawl_id}}}:scope"


#: string with a TTL: held while one ``crawlctl seed`` checks that no other
#: crawl routes a domain of its scope to another shard number, and records
#: the scope (crawld.crawls)
SCOPE_LOCK = f"{PREFIX}:scope:lock"


def crawl_retries(crawl_id: str) -> str:
    """String counter: the generation of the crawl's last ``crawlctl retry``
    (absent = 0); each retry's requeued URLs carry it into their rows."""
    return f"{PREFIX}:{{{crawl_id}}}:retries"


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


def crawl_patterns(crawl_id: str) -> tuple[str, ...]:
    """SCAN match patterns that together cover every key of a crawl (and the
    shard keys of crawls laid out before the shared politeness state,
    ``crawld:{<crawl_id>:<shard>}:*``)."""
    return (f"{PREFIX}:{{{crawl_id}}}:*", f"{PREFIX}:{{s*}}:crawl:{crawl_id}:*", f"{PREFIX}:{{{crawl_id}:*")


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
