"""robots.txt: fetch once per origin, cache in Redis, decide per URL.

Policy, after RFC 9309 (Robots Exclusion Protocol) section 2.3.1 and what
the major crawlers do:

* 2xx: the rules apply (parsed and matched by :mod:`crawld.robotstxt`);
  the file is cut at 500 KiB, and a cut file is parsed up to its last
  complete line;
* 4xx (and more than 5 redirects): "unavailable", everything is allowed;
* 5xx, time-outs and connection errors: "unreachable", the origin is treated
  as fully disallowed for now (RFC 9309 2.3.1.4); its URLs wait, spending
  no attempt, and each failed fetch is a failure of the host: it backs off
  (``backoff_base_s`` doubling to ``backoff_max_s``), is probed one request
  at a time, and is given up only after ``host_give_up_s`` of failing; its
  URLs then become ``blocked`` rows (``host_parked: robots_unreachable:
  ...``), never silently allowed;
* a fetched file is trusted for ``robots_ttl_s`` (RFC 9309 suggests at
  most 24 hours) before it is fetched again.

The cache entry of an origin lives in its shard's ``robots`` hash (JSON),
so every worker and restart of the fleet shares one fetch.  Within a worker
one greenlet fetches an origin's file while the others wait on it (gevent
``AsyncResult``), as Scrapy's robots.txt middleware does.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import gevent.event
import redis

from . import robotstxt

#: robots.txt bodies are cut here: Google's limit, 500 KiB (RFC 9309 2.5
#: asks crawlers that limit the size to parse at least 500 KiB)
MAX_ROBOTS_BYTES = 500 * 1024

RULES, ALLOW_ALL, UNREACHABLE = "rules", "allow_all", "unreachable"


def classify(status: int | None, error_kind: str | None) -> str:
    """The state of an origin from its robots.txt fetch (RFC 9309 2.3.1)."""
    if status is None:
        return ALLOW_ALL if error_kind == "redirects" else UNREACHABLE
    if 200 <= status < 300:
        return RULES
    if 300 <= status < 500:
        return ALLOW_ALL  # 4xx, or a redirect chain that did not end
    return UNREACHABLE


def agent_token(user_agent: str) -> str:
    """The product token robots.txt groups are matched against, from the
    crawler's User-Agent header value: its first product's name (RFC 9110
    10.1.5, ``product = token ["/" product-version]``), as in
    ``crawld/0.1 (+https://...)`` -> ``crawld``; ``*`` for a blank value.

    RFC 9309 2.2.1 lets a product token hold letters, ``_`` and ``-``
    only: a name with other characters (``bot2``) is returned whole, and
    no group binds it, since a group's value is cut to those characters
    (:func:`crawld.robotstxt.product_token`).
    """
    words = user_agent.split()
    return words[0].split("/", 1)[0] or "*" if words else "*"


@dataclass
class RobotsRecord:
    """What is cached for an origin: the fetch's time (Unix s), status,
    body (cut at :data:`MAX_ROBOTS_BYTES`), error, failures in a row, and
    ``cut``: the body was cut (at the size cap, or by a connection that
    broke off), so its last line is incomplete.  JSON without ``c``
    (written before the flag existed) loads as not cut."""

    fetched_at: float
    status: int | None
    body: str = ""
    error: str | None = None
    error_kind: str | None = None
    failures: int = 0
    cut: bool = False

    def to_json(self) -> str:
        d = {"v": 1, "t": self.fetched_at, "s": self.status, "b": self.body, "e": self.error,
             "k": self.error_kind, "n": self.failures}
        if self.cut:
            d["c"] = True
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: bytes | str) -> "RobotsRecord":
        d = json.loads(raw)
        return cls(float(d["t"]), d.get("s"), d.get("b") or "", d.get("e"), d.get("k"), int(d.get("n") or 0),
                   bool(d.get("c")))


@dataclass
class RobotsPolicy:
    """An origin's parsed robots.txt and what follows from it for the
    crawler whose product token is ``agent`` (see :func:`agent_token`).

    ``state`` is :func:`classify` of the fetch; with rules,
    ``crawl_delay_s`` is the ``Crawl-delay`` or ``Request-rate`` interval
    of the groups that bind the crawler (s, the longer of the two; None
    when neither is given or it is 0) and ``sitemaps`` the file's
    ``Sitemap`` URLs.  Parsing and matching follow RFC 9309
    (:mod:`crawld.robotstxt`).
    """

    record: RobotsRecord
    agent: str
    state: str = ""
    crawl_delay_s: float | None = None
    sitemaps: list[str] = field(default_factory=list)
    _rules: robotstxt.AgentRules | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.state = classify(self.record.status, self.record.error_kind)
        if self.state == RULES:
            parsed = robotstxt.parse(self.record.body, cut=self.record.cut)
            self._rules = parsed.rules_for(self.agent)
            delay = self._rules.crawl_delay_s
            self.crawl_delay_s = float(delay) if delay else None
            self.sitemaps = list(parsed.sitemaps)

    @property
    def cut(self) -> bool:
        """Was the robots.txt body cut (see :class:`RobotsRecord`)?  Its
        rules are then those up to its last complete line."""
        return self.record.cut

    def allowed(self, url: str) -> bool:
        """May ``url`` be fetched?  (False while the origin is unreachable.)

        ``url`` is any URL string of the origin (absolute, or a path with
        its query); it is judged on the request target that will be sent:
        dot segments removed and percent-encoding normalised
        (:func:`crawld.robotstxt.request_target`), so
        ``http://h/a/../admin`` is judged as ``/admin``.
        """
        if self.state == RULES:
            assert self._rules is not None
            return self._rules.allowed(robotstxt.request_target(url))
        return self.state == ALLOW_ALL

    def fresh(self, now: float, ttl_s: float, retry_s: float) -> bool:
        """Is the cached answer still good at ``now`` (Unix s)?"""
        age = now - self.record.fetched_at
        return age < (retry_s if self.state == UNREACHABLE else ttl_s)


@dataclass
class RobotsFetch:
    """What fetching one origin's robots.txt gave: ``status`` (None: no
    response), ``body`` (text, empty unless 2xx), ``error``/``error_kind``
    as :class:`crawld.fetcher.FetchResult` has them, and ``cut`` when the
    body was cut at :data:`MAX_ROBOTS_BYTES`."""

    status: int | None
    body: str = ""
    error: str | None = None
    error_kind: str | None = None
    cut: bool = False

    @classmethod
    def of(cls, rec: RobotsRecord) -> "RobotsFetch":
        """The answer another origin's record holds (a redirect to its
        ``/robots.txt`` takes its answer, RFC 9309 section 2.3.1.2)."""
        return cls(rec.status, rec.body, rec.error, rec.error_kind, rec.cut)


class RobotsCache:
    """robots.txt of the origins a worker serves, for one crawl.

    ``key_of(origin)`` names the Redis hash holding ``origin``'s cache entry
    (its shard's ``robots`` hash, shared by every crawl, so an origin's file
    is fetched once for the fleet within its TTL) and ``lock_of(origin)``
    the lock taken while one process fetches it.  ``fetch_body(origin,
    via)`` performs the requests (each redirect hop on its own politeness
    slot; a redirect to another origin's ``/robots.txt`` takes that origin's
    answer through :meth:`fetch`, ``via`` naming the origins waiting on it,
    so that a loop is caught) and returns a :class:`RobotsFetch`.  Raises
    ``redis.RedisError`` when Redis fails.
    """

    #: how long a fetch may hold an origin's lock before others fetch anyway (s)
    LOCK_TTL_S = 120.0

    def __init__(self, client: redis.Redis, key_of: Callable[[str], str], agent: str, ttl_s: float,
                 retry_s: float, fetch_body: Callable[[str], RobotsFetch], lock_of: Callable[[str], str],
                 max_local: int = 10_000, on_cut: Callable[[str, RobotsFetch], None] | None = None):
        self.client = client
        self.key_of = key_of
        self.lock_of = lock_of
        self.agent = agent
        self.ttl_s = ttl_s
        self.retry_s = retry_s
        self._fetch_body = fetch_body
        self._on_cut = on_cut
        self._local: dict[str, RobotsPolicy] = {}
        self._pending: dict[str, gevent.event.AsyncResult] = {}
        self._max_local = max_local
        self._token = uuid.uuid4().hex

    def _stored(self, origin: str, now: float) -> tuple[RobotsPolicy | None, int]:
        """The fresh stored policy of ``origin`` (or None), and the stored
        record's failures in a row."""
        raw = self.client.hget(self.key_of(origin), origin)
        if raw is None:
            return None, 0
        try:
            pol = RobotsPolicy(RobotsRecord.from_json(raw), self.agent)
        except (ValueError, KeyError, TypeError):
            return None, 0
        if not pol.fresh(now, self.ttl_s, self.retry_s):
            return None, pol.record.failures
        return pol, pol.record.failures

    def cached(self, origin: str) -> RobotsPolicy | None:
        """The fresh policy of ``origin`` from memory or Redis, else None."""
        now = time.time()
        pol = self._local.get(origin)
        if pol is not None and pol.fresh(now, self.ttl_s, self.retry_s):
            return pol
        pol, _ = self._stored(origin, now)
        if pol is not None:
            self._remember(origin, pol)
        return pol

    def known(self, origin: str) -> RobotsPolicy | None:
        """The policy of ``origin`` if this worker holds a fresh one
        (memory only, no Redis round trip)."""
        pol = self._local.get(origin)
        if pol is not None and pol.fresh(time.time(), self.ttl_s, self.retry_s):
            return pol
        return None

    def _remember(self, origin: str, pol: RobotsPolicy) -> None:
        if len(self._local) >= self._max_local:
            self._local.clear()
        self._local[origin] = pol

    def fetch(self, origin: str, via: tuple[str, ...] = ()) -> tuple[RobotsPolicy, bool]:
        """Fetch ``origin``'s robots.txt, once: greenlets of this process
        asking at the same time wait for one fetch (gevent AsyncResult), and
        other processes wait on the origin's lock in Redis and read what the
        fetch stored.  ``via``: the origins whose robots.txt redirected here
        and wait for this answer.

        Returns ``(policy, fetched_here)``: ``fetched_here`` is True for the
        one caller whose request went out (it used its politeness slot).
        """
        waiting = self._pending.get(origin)
        if waiting is not None:
            return waiting.get(), False
        result = self._pending[origin] = gevent.event.AsyncResult()
        try:
            pol, fetched = self._fetch_once(origin, via)
            self._remember(origin, pol)
            result.set(pol)
            return pol, fetched
        except BaseException as exc:
            result.set_exception(exc)
            raise
        finally:
            self._pending.pop(origin, None)

    def _fetch_once(self, origin: str, via: tuple[str, ...]) -> tuple[RobotsPolicy, bool]:
        lock = self.lock_of(origin)
        deadline = time.monotonic() + self.LOCK_TTL_S
        delay = 0.05
        while True:
            # again under the lock: a fetch that ended between this caller's
            # cache miss and now has stored the answer
            pol, failures = self._stored(origin, time.time())
            if pol is not None:
                return pol, False
            if self.client.set(lock, self._token, nx=True, px=int(self.LOCK_TTL_S * 1000)):
                break
            if time.monotonic() >= deadline:
                break  # the holder died holding it: fetch anyway
            gevent.sleep(delay)
            delay = min(delay * 2, 1.0)
        try:
            pol, failures = self._stored(origin, time.time())
            if pol is not None:
                return pol, False
            got = self._fetch_body(origin, via)
            state = classify(got.status, got.error_kind)
            rec = RobotsRecord(time.time(), got.status, got.body if state == RULES else "", got.error,
                               got.error_kind, failures + 1 if state == UNREACHABLE else 0)
            if got.cut:
                rec.cut = True
                if self._on_cut is not None:
                    self._on_cut(origin, got)
            self.client.hset(self.key_of(origin), origin, rec.to_json())
            return RobotsPolicy(rec, self.agent), True
        finally:
            try:
                if self.client.get(lock) == self._token.encode():
                    self.client.delete(lock)
            except redis.RedisError:
                pass  # it expires
