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
* reclaim return expired claims to the queue (or dead-letter them).

Entries are JSON payloads with a schema version (:data:`ENTRY_VERSION`);
nothing is pickled.  All times are Redis server time in microseconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import redis

from . import keys
from .config import CrawlConfig

#: schema version of entry payloads.
ENTRY_VERSION = 1

_LUA_DIR = Path(__file__).with_name("lua")
_SCRIPTS = ("push", "claim", "ack", "nack", "extend", "reclaim")


def load_script_source(name: str) -> str:
    """The full source of script ``name``: the shared prelude, then the body."""
    return (_LUA_DIR / "_lib.lua").read_text() + "\n" + (_LUA_DIR / f"{name}.lua").read_text()


@dataclass(frozen=True)
class Entry:
    """A URL waiting in (or claimed from) the frontier.

    ``url`` is the absolute URL to fetch, ``canonical`` its canonical form,
    ``depth`` the link distance from a seed, ``referrer`` the page it was
    found on, ``redirect_chain`` the URLs that redirected to it.
    """

    url: str
    canonical: str
    depth: int = 0
    referrer: str | None = None
    redirect_chain: tuple[str, ...] = ()

    def to_payload(self) -> bytes:
        """Compact JSON with the schema version."""
        d: dict[str, Any] = {"v": ENTRY_VERSION, "u": self.url, "c": self.canonical, "d": self.depth}
        if self.referrer is not None:
            d["r"] = self.referrer
        if self.redirect_chain:
            d["rc"] = list(self.redirect_chain)
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
                   referrer=d.get("r"), redirect_chain=tuple(d.get("rc", ())))


@dataclass(frozen=True)
class Claim:
    """A claimed entry: ``token`` identifies the claim (ack/nack/extend),
    ``attempts`` counts claims of this entry including this one."""

    shard: int
    token: bytes
    attempts: int
    payload: bytes


@dataclass(frozen=True)
class ShardSnapshot:
    """Counts of one shard read atomically (MULTI/EXEC).

    ``queued`` entries waiting, ``scheduled`` politeness keys on the
    schedule, ``claimed`` claims outstanding, ``dead`` dead-letter list
    length, ``stats`` the shard's monotonic counters.
    """

    shard: int
    queued: int
    scheduled: int
    claimed: int
    dead: int
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing claimed."""
        return self.queued == 0 and self.claimed == 0

    def activity(self) -> tuple[int, int]:
        """Counters that move whenever work enters or leaves the queue."""
        return (self.stats.get("pushed", 0), self.stats.get("claimed", 0))


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


class Frontier:
    """The frontier of one crawl over a Redis client.

    ``client`` is a ``redis.Redis`` with ``decode_responses=False``.  Methods
    raise ``redis.RedisError`` on connection or server errors.
    """

    def __init__(self, client: redis.Redis, config: CrawlConfig):
        self.client = client
        self.config = config
        self._scripts = {name: client.register_script(load_script_source(name)) for name in _SCRIPTS}
        self._keys = [keys.shard_keys(config.crawl_id, s).all() for s in range(config.num_shards)]
        self._T = int(round(config.emission_interval_ms * 1000))
        self._tau = int(round(config.burst_tolerance_ms * 1000))
        self._cap = config.max_inflight_per_host
        self._vt = int(config.visibility_timeout_s * 1_000_000)

    def keys(self, shard: int) -> list[str]:
        """The KEYS list of ``shard``."""
        return self._keys[shard]

    # -- transitions ---------------------------------------------------
    def push(self, shard: int, items: Iterable[tuple[bytes, str, bytes]], client: Any = None) -> int:
        """Push ``(fingerprint, politeness_key, payload)`` items into ``shard``.

        Items whose fingerprint the shard has seen are dropped.  Returns the
        number added (with ``client`` a pipeline, the pipeline's result).
        """
        args: list[Any] = [self._tau, self._cap]
        for fp, pkey, payload in items:
            args += (fp, pkey, payload)
        if len(args) == 2:
            return 0
        return self._scripts["push"](keys=self._keys[shard], args=args, client=client or self.client)

    def claim(self, shard: int, n: int, fetched: Sequence[bytes] = ()) -> tuple[float, list[Claim]]:
        """Claim up to ``n`` due entries of ``shard``.

        ``fetched`` are tokens of claims whose fetch is over: their
        in-flight slots are given back first, in the same call (idempotent).
        Returns ``(wait_s, claims)``: ``wait_s`` is the time until the next
        politeness key is due (-1.0 when none is scheduled).
        """
        r = self._scripts["claim"](keys=self._keys[shard],
                                   args=[n, self._T, self._tau, self._cap, self._vt, *fetched])
        claims = [Claim(shard, r[i], int(r[i + 1]), r[i + 2]) for i in range(1, len(r), 3)]
        wait = int(r[0])
        return (wait / 1e6 if wait >= 0 else -1.0), claims

    def ack(self, shard: int, tokens: Sequence[bytes], client: Any = None) -> int:
        """Ack claims of ``shard``; returns how many were still claimed."""
        if not tokens:
            return 0
        return self._scripts["ack"](keys=self._keys[shard], args=[self._tau, self._cap, *tokens],
                                    client=client or self.client)

    def nack(self, shard: int, token: bytes, delay_s: float, error: str) -> int:
        """Give a claim back: 1 requeued, 2 dead-lettered, 0 not claimed.

        The entry's politeness key is not fetched again for ``delay_s``.
        """
        return self._scripts["nack"](keys=self._keys[shard], args=[
            self._tau, self._cap, self.config.max_attempts, token, int(delay_s * 1e6), error[:500]])

    def extend(self, shard: int, tokens: Sequence[bytes]) -> int:
        """Heartbeat: extend the visibility deadline of held claims."""
        if not tokens:
            return 0
        return self._scripts["extend"](keys=self._keys[shard], args=[self._vt, *tokens])

    def reclaim(self, shard: int, limit: int = 1000) -> tuple[int, int]:
        """Return expired claims; ``(requeued, dead_lettered)``."""
        r = self._scripts["reclaim"](keys=self._keys[shard], args=[
            self._tau, self._cap, self.config.max_attempts, limit])
        return int(r[0]), int(r[1])

    def commit(self, pushes: dict[int, list[tuple[bytes, str, bytes]]], acks: dict[int, list[bytes]]) -> int:
        """Push discovered links, then ack finished claims, in one round trip.

        A pipeline on one connection runs its commands in order, so every
        ack follows the pushes of the pages it acknowledges.  Returns the
        number of claims acked.
        """
        pipe = self.client.pipeline(transaction=False)
        n_push = 0
        for shard, items in pushes.items():
            if items:
                self.push(shard, items, client=pipe)
                n_push += 1
        for shard, tokens in acks.items():
            if tokens:
                self.ack(shard, tokens, client=pipe)
        results = pipe.execute()
        return sum(int(r) for r in results[n_push:])

    # -- reading ---------------------------------------------------------
    def snapshot(self, shard: int) -> ShardSnapshot:
        """Atomic counts of ``shard`` (one MULTI/EXEC)."""
        k = keys.shard_keys(self.config.crawl_id, shard)
        pipe = self.client.pipeline(transaction=True)
        pipe.zcard(k.queue).zcard(k.sched).zcard(k.claimed).llen(k.dead).hgetall(k.stats)
        queued, scheduled, claimed, dead, stats = pipe.execute()
        return ShardSnapshot(shard, queued, scheduled, claimed, dead,
                             {kk.decode(): int(v) for kk, v in stats.items()})

    def snapshots(self) -> list[ShardSnapshot]:
        """:meth:`snapshot` of every shard, in shard order."""
        return [self.snapshot(s) for s in range(self.config.num_shards)]

    def oldest_claim_age_s(self, shard: int) -> float | None:
        """Seconds since the oldest outstanding claim of ``shard`` was made
        (from its deadline), or None when nothing is claimed."""
        k = keys.shard_keys(self.config.crawl_id, shard)
        first = self.client.zrange(k.claimed, 0, 0, withscores=True)
        if not first:
            return None
        sec, usec = self.client.time()
        now = sec * 1e6 + usec
        return max(0.0, (now - (first[0][1] - self._vt)) / 1e6)

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
