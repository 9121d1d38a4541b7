"""The Redis frontier: per-shard politeness-keyed queues, claims and acks.

Every state transition is one Lua script (``crawld/lua/*.lua``, each with a
header documenting its KEYS and ARGV, all sharing ``_lib.lua``), loaded once
per client and run with EVALSHA, so a crash between two Redis calls can
neither lose nor duplicate an entry:

* push    dedup and enqueue: add the fingerprint to the shard's visited set
          and, if new, queue the entry under its politeness key;
* claim   take up to n entries whose politeness key is due, applying GCRA
          and the in-flight cap, with a visibility deadline;
* ack     drop finished claims (a late ack after a reclaim is a no-op);
* nack    give a failed claim back (requeued, or dead-lettered past
          ``max_attempts``);
* extend  heartbeat: push back the deadline of claims still being worked;
* reclaim return expired claims to the queue (or dead-letter them);
* reserve book one extra request (a robots.txt fetch) against GCRA;
* rate    slow a politeness key down (robots.txt Crawl-delay);
* lease / release  take, renew or give up the shard's lease (fencing: a
          claim made with a lease token fails once another token holds it);
* abandon drop every claim of a crawl being purged, giving its in-flight
          slots back;
* requeue queue URLs to fetch again past the visited set (crawlctl retry).

Besides URLs to fetch, the frontier carries URLs to *record without
fetching* (a "mode" naming why: out of scope, over depth, over budget, host
given up, ...), so that every URL ends as a row through the same claim,
row, ack path.

Entries are JSON payloads with a schema version (:data:`ENTRY_VERSION`);
nothing is pickled.  All times are Redis server time in microseconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Sequence

import redis

from . import dedup, keys
from .config import CrawlConfig
from .redisconn import is_cluster

#: schema version of entry payloads.
ENTRY_VERSION = 1

_LUA_DIR = Path(__file__).with_name("lua")
_SCRIPTS = ("push", "claim", "ack", "nack", "extend", "reclaim", "reserve", "rate", "lease", "release", "abandon", "requeue")


def load_script_source(name: str) -> str:
    """The full source of script ``name``: the shared prelude, then the body."""
    return (_LUA_DIR / "_lib.lua").read_text() + "\n" + (_LUA_DIR / f"{name}.lua").read_text()


def register_plain_script(client: Any, name: str) -> Any:
    """``crawld/lua/<name>.lua`` (a script without the shard prelude)
    registered on ``client``: a redis-py Script, run by EVALSHA (loaded
    into Redis on first use)."""
    return client.register_script((_LUA_DIR / f"{name}.lua").read_text())


@dataclass(frozen=True)
class Entry:
    """A URL waiting in (or claimed from) the frontier.

    ``url`` is the absolute URL to fetch, ``canonical`` its canonical form,
    ``depth`` the link distance from a seed, ``referrer`` the page it was
    found on, ``redirect_chain`` the URLs that redirected to it, ``kind``
    ``page`` or ``sitemap`` (a sitemap's URLs are pushed, not its links),
    ``deferrals`` how many times it was put back without spending an
    attempt (429, 503, a connection that could not be made:
    :func:`crawld.outcomes.disposition`), ``retry`` the generation of the
    ``crawlctl retry`` that queued it again (0: none, :mod:`crawld.retry`).
    For a sitemap, ``depth`` is its nesting level instead: 0 when robots.txt
    names it, n + 1 when an index at level n lists it (no payload change:
    a sitemap entry of depth 0 is read as level 0).
    """

    url: str
    canonical: str
    depth: int = 0
    referrer: str | None = None
    redirect_chain: tuple[str, ...] = ()
    kind: str = "page"
    deferrals: int = 0
    retry: int = 0

    def to_payload(self) -> bytes:
        """Compact JSON with the schema version."""
        d: dict[str, Any] = {"v": ENTRY_VERSION, "u": self.url, "c": self.canonical, "d": self.depth}
        if self.referrer is not None:
            d["r"] = self.referrer
        if self.redirect_chain:
            d["rc"] = list(self.redirect_chain)
        if self.kind != "page":
            d["k"] = self.kind
        if self.deferrals:
            d["df"] = self.deferrals
        if self.retry:
            d["rg"] = self.retry
        return json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_payload(cls, payload: bytes | str) -> "Entry":
        """Parse a payload.

        Raises:
            ValueError: not JSON, an unknown schema version or missing fields.
        """
        d = json.loads(payload)
        if not isinstance(d, dict) or d.get("v") != ENTRY_VERSION:
            raise ValueError(f"unsupported entry payload version {d.get('v') if isinstance(d, dict) else None!r}")
        return cls(url=d["u"], canonical=d["c"], depth=int(d.get("d", 0)),
                   referrer=d.get("r"), redirect_chain=tuple(d.get("rc", ())), kind=d.get("k", "page"),
                   deferrals=int(d.get("df", 0)), retry=int(d.get("rg", 0)))


@dataclass(frozen=True)
class Claim:
    """A claimed entry: ``token`` identifies the claim (ack/nack/extend),
    ``attempts`` counts claims of this entry including this one, ``mode`` is
    "" for a URL to fetch, else why it is to be recorded without a fetch;
    ``interval_s`` the domain's emission interval in force when it was
    claimed (seconds; 0 for a URL to record)."""

    shard: int
    token: bytes
    attempts: int
    payload: bytes
    mode: str = ""
    interval_s: float = 0.0


class PushItem(NamedTuple):
    """One URL to push: ``fp`` its fingerprint, ``pkey`` its politeness key,
    ``host`` its host name (page budget), ``vkey`` host+path when it has a
    query ("" otherwise; query-variant limit), ``mode`` "" to fetch it or a
    skip reason, ``payload`` the :class:`Entry` JSON."""

    fp: bytes
    pkey: str
    host: str
    vkey: str
    mode: str
    payload: bytes


class HostReport(NamedTuple):
    """How a fetch went for its politeness key, for the claim script
    (``crawld/lua/claim.lua`` lists the codes): ``code`` "o" success, "f"
    failure (``value`` = jitter in [0, 1)), "a" slow down (429/503), "r"
    slow down and hold at least ``value`` seconds (Retry-After), "h" hold
    for ``value`` seconds without counting a failure, "p" give the host up
    for ``value`` seconds now; ``reason`` is kept if the host is given up."""

    pkey: str
    code: str
    value: float
    reason: str


def _report_args(rep: HostReport) -> tuple[Any, ...]:
    """A host outcome as script arguments: pkey, code, value (microseconds
    for "r" and "h"), reason (at most 300 characters)."""
    value = int(rep.value * 1e6) if rep.code in ("r", "h", "p") else rep.value
    return rep.pkey, rep.code, value, rep.reason[:300]


@dataclass(frozen=True)
class ShardSnapshot:
    """Counts of one shard read atomically (MULTI/EXEC).

    ``queued`` entries waiting to be fetched, ``scheduled`` politeness keys
    on the schedule, ``claimed`` claims outstanding, ``dead`` dead-letter
    list length, ``stats`` the shard's monotonic counters, ``skips`` URLs
    waiting to be recorded without a fetch.
    """

    shard: int
    queued: int
    scheduled: int
    claimed: int
    dead: int
    stats: dict[str, int] = field(default_factory=dict)

    skips: int = 0

    @property
    def idle(self) -> bool:
        """Nothing queued (to fetch or to record) and nothing claimed."""
        return self.queued == 0 and self.claimed == 0 and self.skips == 0

    def activity(self) -> tuple[int, int, int, int]:
        """Counters that move whenever work enters or leaves the queues."""
        return (self.stats.get("pushed", 0), self.stats.get("skip_pushed", 0), self.stats.get("claimed", 0),
                self.stats.get("retried", 0))


def crawl_finished(prev: Sequence[ShardSnapshot] | None, cur: Sequence[ShardSnapshot]) -> bool:
    """True when two consecutive waves of snapshots prove the crawl is done.

    Both waves must show every shard idle with unchanged push and claim
    counters.  Each shard then had no push and no claim between its two
    reads; since every wave-1 read precedes every wave-2 read, at the instant
    between the waves all shards were empty with nothing claimed, and only a
    claimed entry can produce new work (a counting variant of Mattern's
    four-counter termination detection, 1987).
    """
    if prev is None or len(prev) != len(cur):
        return False
    for a, b in zip(prev, cur):
        if not (a.idle and b.idle and a.activity() == b.activity()):
            return False
    return True


class LeaseLost(RuntimeError):
    """A claim was refused: another worker holds the shard's lease."""


class StaleConfig(RuntimeError):
    """A lease was refused: the shard was moved by a rebalance newer than
    the caller's config (crawld.rebalance)."""


class Frontier:
    """The frontier of one crawl over a Redis client.

    ``client`` is a ``redis.Redis`` with ``decode_responses=False``.  Methods
    raise ``redis.RedisError`` on connection or server errors.
    """

    def __init__(self, client: redis.Redis, config: CrawlConfig):
        self.client = client
        self.config = config
        self._scripts = {name: client.register_script(load_script_source(name)) for name in _SCRIPTS}
        # read-only, standalone (no prelude): see counts.lua
        self._counts = client.register_script((_LUA_DIR / "counts.lua").read_text())
        self._cluster = is_cluster(client)
        self._keys = [keys.shard_keys(config.crawl_id, s).all() for s in range(config.num_shards)]
        # ARGV[1..3] of every script: T0 (us), burst - 1, in-flight cap
        self._common = [int(round(config.emission_interval_ms * 1000)), config.burst - 1.0,
                        config.max_inflight_per_host]
        self._vt = int(config.visibility_timeout_s * 1_000_000)
        self._dedup_spec = dedup.push_spec(config)  # lays out a shard's dedup structures on first push
        # host-outcome settings of claim.lua and nack.lua
        self._backoff = [int(config.backoff_base_s * 1e6), int(config.backoff_max_s * 1e6),
                         config.host_max_failures, int(config.host_give_up_s * 1e6)]

    def keys(self, shard: int) -> list[str]:
        """The KEYS list of ``shard``."""
        return self._keys[shard]

    def _run(self, name: str, shard: int, args: list[Any], client: Any = None) -> Any:
        return self._scripts[name](keys=self._keys[shard], args=[*self._common, *args],
                                   client=client or self.client)

    # -- transitions ---------------------------------------------------
    def push(self, shard: int, items: Iterable[PushItem], client: Any = None) -> tuple[int, int, int]:
        """Push URLs into ``shard``: ``(queued, recorded, duplicates)``.

        URLs to fetch whose fingerprint the shard has queued before are
        duplicates (by the crawl's ``dedup`` backend, :mod:`crawld.dedup`);
        URLs over the page budget or query-variant limit become URLs to
        record; URLs pushed with a mode are recorded once, unless
        queued for fetching.  With ``client`` a pipeline, returns that.
        """
        args: list[Any] = [self.config.max_pages_per_host, self.config.max_query_variants, self._dedup_spec]
        for it in items:
            args += (dedup.tagged_fingerprint(it.fp, it.pkey), *it[1:])
        if len(args) == 3:
            return (0, 0, 0)
        r = self._run("push", shard, args, client)
        return r if client is not None else tuple(int(x) for x in r)

    def claim(self, shard: int, n: int, fetched: Sequence[bytes] = (),
              reports: Sequence[HostReport] = (), lease: str = "") -> tuple[float, list[Claim]]:
        """Claim up to ``n`` entries of ``shard``: URLs to record first,
        then URLs of due politeness keys.

        ``fetched`` are tokens of claims whose fetch is over: their
        in-flight slots are given back first, in the same call (idempotent).
        ``reports`` apply host outcomes (backoff, parking) before claiming.
        With ``lease`` (a token) nothing is claimed unless that token holds
        the shard's lease.  Returns ``(wait_s, claims)``: ``wait_s`` is the
        time until the next politeness key is due (-1.0 when none is
        scheduled).

        Raises:
            LeaseLost: ``lease`` is not the shard's lease holder.
        """
        args: list[Any] = [lease, n, self._vt, len(fetched), *fetched, *self._backoff]
        for rep in reports:
            args += _report_args(rep)
        r = self._run("claim", shard, args)
        if int(r[0]) == -2:
            raise LeaseLost(f"shard {shard} of crawl {self.config.crawl_id} is leased to another worker")
        claims = [Claim(shard, r[i], int(r[i + 1]), r[i + 3], r[i + 2].decode("utf-8", "replace"),
                        int(r[i + 4]) / 1e6)
                  for i in range(1, len(r), 5)]
        wait = int(r[0])
        return (wait / 1e6 if wait >= 0 else -1.0), claims

    def ack(self, shard: int, tokens: Sequence[bytes], client: Any = None,
            outcomes: Sequence[str] | None = None) -> int:
        """Ack claims of ``shard``; returns how many were still claimed.

        ``outcomes[i]`` (optional) is the outcome of the row of
        ``tokens[i]``; each acked one is counted in the shard's stats as
        ``rows_<outcome>`` (what ``crawlctl status`` shows)."""
        if not tokens:
            return 0
        args = list(tokens) if outcomes is None else \
            [t + b"\x1f" + o.encode() for t, o in zip(tokens, outcomes)]
        return self._run("ack", shard, args, client)

    def nack(self, shard: int, token: bytes, error: str, count: bool = True,
             report: HostReport | None = None, payload: bytes | None = None) -> int:
        """Give a claim back: 1 requeued, 2 dead-lettered, 0 not claimed.

        With ``count`` false the attempt does not count toward
        ``max_attempts`` (the URL was deferred, not tried).  ``report``, the
        failure's host outcome (e.g. Retry-After), is applied in the same
        atomic step, before the entry is queued again (it is applied even
        when the token is no longer claimed).  ``payload`` replaces the
        entry's payload (e.g. with its deferral count raised).
        """
        args: list[Any] = [self.config.max_attempts, token, error[:500], "1" if count else "0", payload or b""]
        if report is not None:
            args += [*self._backoff, *_report_args(report)]
        return self._run("nack", shard, args)

    def extend(self, shard: int, tokens: Sequence[bytes]) -> int:
        """Heartbeat: extend the visibility deadline of held claims."""
        if not tokens:
            return 0
        return self._run("extend", shard, [self._vt, *tokens])

    def reclaim(self, shard: int, limit: int = 1000) -> tuple[int, int]:
        """Return expired claims; ``(requeued, dead_lettered)``."""
        r = self._run("reclaim", shard, [self.config.max_attempts, limit])
        return int(r[0]), int(r[1])

    def requeue(self, shard: int, items: Iterable[tuple[str, bytes]]) -> int:
        """Queue URLs of ``shard`` to be fetched again, past the visited set
        (``crawlctl retry``): ``items`` are ``(pkey, payload)``; returns how
        many were queued (counted in the shard's stats as ``retried``)."""
        args: list[Any] = []
        for pkey, payload in items:
            args += (pkey, payload)
        if not args:
            return 0
        return int(self._run("requeue", shard, args))

    def abandon(self, shard: int, limit: int = 1000) -> int:
        """Drop every claim of ``shard`` without requeueing it (a crawl
        being purged), giving back the in-flight slots it held; returns how
        many were dropped (call again while it returns ``limit``)."""
        return int(self._run("abandon", shard, [limit]))

    def reserve(self, shard: int, pkey: str) -> float:
        """Book one more request to ``pkey``; returns seconds to wait before
        sending it."""
        return int(self._run("reserve", shard, [pkey])) / 1e6

    def slow_down(self, shard: int, pkey: str, interval_s: float) -> float:
        """Make ``pkey``'s interval between requests at least
        ``interval_s`` (robots.txt Crawl-delay); returns the interval in
        force, in seconds."""
        return int(self._run("rate", shard, [pkey, int(interval_s * 1e6)])) / 1e6

    def lease(self, shard: int, token: str, ttl_s: float, epoch: int | None = None) -> bool:
        """Take or renew the lease of ``shard`` for ``token`` (time to live
        ``ttl_s``); False when another token holds it.

        Raises:
            StaleConfig: ``epoch`` (the crawl's rebalance generation the
                caller's config is from) is older than the shard's.
        """
        r = int(self._run("lease", shard, [token, int(ttl_s * 1000), "" if epoch is None else int(epoch)]))
        if r == -1:
            raise StaleConfig(f"shard {shard} of crawl {self.config.crawl_id} was rebalanced after "
                              f"generation {epoch}: reload the crawl")
        return r == 1

    def release(self, shard: int, token: str) -> bool:
        """Give the lease of ``shard`` up if ``token`` holds it."""
        return bool(self._run("release", shard, [token]))

    def leaseholder(self, shard: int) -> str | None:
        """The token holding the lease of ``shard``, if any."""
        v = self.client.get(keys.shard_keys(self.config.crawl_id, shard).lease)
        return v.decode() if v is not None else None

    def commit(self, pushes: dict[int, list[PushItem]], acks: dict[int, list[bytes]],
               outcomes: dict[int, list[str]] | None = None) -> tuple[int, tuple[int, int, int]]:
        """Push discovered links, then ack finished claims, in one round trip.

        A pipeline on one connection runs its commands in order, so every
        ack follows the pushes of the pages it acknowledges.  ``outcomes``
        as for :meth:`ack`.  Returns ``(claims acked, (queued, recorded,
        duplicates))`` summed over the pushes.

        On Redis Cluster the shards live on several nodes and a cluster
        pipeline neither runs scripts nor orders commands across nodes, so
        the scripts run one after the other (one round trip per shard):
        every push has succeeded before the first ack is sent.
        """
        if self._cluster:
            queued = recorded = dups = acked = 0
            for shard, items in pushes.items():
                if items:
                    q, r, d = self.push(shard, items)
                    queued, recorded, dups = queued + q, recorded + r, dups + d
            for shard, tokens in acks.items():
                if tokens:
                    acked += int(self.ack(shard, tokens, outcomes=(outcomes or {}).get(shard)))
            return acked, (queued, recorded, dups)
        pipe = self.client.pipeline(transaction=False)
        n_push = 0
        for shard, items in pushes.items():
            if items:
                self.push(shard, items, client=pipe)
                n_push += 1
        for shard, tokens in acks.items():
            if tokens:
                self.ack(shard, tokens, client=pipe, outcomes=(outcomes or {}).get(shard))
        results = pipe.execute()
        pushed = [sum(int(r[i]) for r in results[:n_push]) for i in range(3)]
        return sum(int(r) for r in results[n_push:]), (pushed[0], pushed[1], pushed[2])

    # -- reading ---------------------------------------------------------
    def counts(self, shard: int) -> dict[str, Any]:
        """Counts of ``shard`` read atomically by one read-only script
        (``counts.lua``; the same on a single Redis and on a cluster):
        ``now_us`` (the shard's Redis time), ``queued``, ``scheduled``,
        ``claimed``, ``oldest_deadline_us`` (None when nothing is claimed),
        ``expired`` (claims past their deadline), ``skips``, ``dead``,
        ``stats`` (every counter) and ``lease`` (token or None)."""
        r = self._counts(keys=self._keys[shard], client=self.client)
        flat = r[9]
        return {"now_us": int(r[0]) * 1_000_000 + int(r[1]), "queued": int(r[2]), "scheduled": int(r[3]),
                "claimed": int(r[4]), "oldest_deadline_us": float(r[5]) if r[5] else None,
                "expired": int(r[6]), "skips": int(r[7]), "dead": int(r[8]),
                "stats": {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)},
                "lease": r[10].decode() if len(r) > 10 and r[10] else None}

    def snapshot(self, shard: int) -> ShardSnapshot:
        """Atomic counts of ``shard`` (one read-only script, see :meth:`counts`)."""
        c = self.counts(shard)
        return ShardSnapshot(shard, c["queued"], c["scheduled"], c["claimed"], c["dead"], c["stats"], c["skips"])

    def snapshots(self) -> list[ShardSnapshot]:
        """:meth:`snapshot` of every shard, in shard order."""
        return [self.snapshot(s) for s in range(self.config.num_shards)]

    def oldest_claim_age_s(self, shard: int) -> float | None:
        """Seconds since the oldest outstanding claim of ``shard`` was made
        (from its deadline), or None when nothing is claimed."""
        c = self.counts(shard)  # the deadline and TIME of the shard's own node
        if c["oldest_deadline_us"] is None:
            return None
        return max(0.0, (c["now_us"] - (c["oldest_deadline_us"] - self._vt)) / 1e6)

    def dead_letters(self, shard: int, start: int = 0, end: int = -1) -> list[dict[str, Any]]:
        """Dead-lettered entries of ``shard`` as dicts (pkey, attempts,
        payload, reason, at_us)."""
        k = keys.shard_keys(self.config.crawl_id, shard)
        out = []
        for raw in self.client.lrange(k.dead, start, end):
            d = json.loads(raw)
            d["at_us"] = int(d.get("at_us") or 0)
            out.append(d)
        return out
