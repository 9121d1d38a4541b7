"""Politeness arithmetic (pure): the per-domain rate, and how it adapts.

This module is the reference for what the frontier's Lua scripts do to a
registered domain's politeness state (``crawld/lua/_lib.lua`` mirrors each
function here; ``tests/test_politeness_math.py`` runs both on one table).
All times and intervals are integers in microseconds of Redis server time.

Rate: GCRA, the virtual scheduling algorithm of ITU-T I.371.  A domain has
one theoretical arrival time (TAT) for the whole fleet; a request at ``now``
conforms when ``now >= TAT - tau``, and then ``TAT = max(TAT, now) + T``.
``T`` is the emission interval (1e6 / requests per second) and
``tau = (burst - 1) * T`` the tolerance: with ``burst`` <= 2, no window of
length ``w`` ever holds more than ``w / T + burst`` requests.

The interval in force (:func:`interval`) is the largest of:

* the claiming crawl's own ``1e6 / max_rps_per_host``;
* the domain's robots.txt Crawl-delay (``rates``);
* its adapted interval after 429/503 answers (``adapt``, below);
* the *floor*: the interval of the slowest crawl that claimed the domain in
  the last :data:`FLOOR_HOLD_US` (or 3 of its intervals), so that two crawls
  with different rates sharing a domain send at the slower one's rate.

Adaptation (:func:`on_slowdown`, :func:`on_success`): a 429 or 503 means
"slower", not "broken".  Multiplicative decrease, gentle increase (AIMD, as
TCP congestion control, RFC 5681), with the interval at the last slow-down
remembered as the host's *ceiling*, after the W_max of CUBIC (RFC 9438): far
from the ceiling the rate climbs back fast (``K_FAST``), near it slowly
(``K_PROBE``), so a host that answers 429 above a fixed rate (nginx
``limit_req``) sees few of them: about one per ``K_PROBE * ln(1.15)`` ~ 560
successes once the ceiling is known.  One reaction per interval (as TCP
reacts once per round trip): two 429s of requests that were in flight
together cut the rate once.  The first slow-down of a host with no
adaptation yet (and no Retry-After) goes straight to at most
:data:`FIRST_CUT_US` (1 request/s) instead of halving its way down from a
configured rate far above what the host takes, which would cost one 429 per
halving.  The interval never
exceeds ``max_interval_us`` and, recovered to the crawl's own interval, the
adaptation is dropped.

Fair share (in the claim script): when two crawls wait on one domain, they
take turns: a crawl that finds the domain's slot taken by another records
itself as waiting (``want``); the next crawl to find a conforming slot
while another waits leaves that slot to it, once.
"""

from __future__ import annotations

from dataclasses import dataclass

#: first slow-down of a host: at most 1 request/s (interval, us)
FIRST_CUT_US = 1_000_000
#: multiplicative decrease: the interval is multiplied by this (rate halved)
CUT_FACTOR = 2
#: successes to shrink the interval by a factor e, far from the ceiling
K_FAST = 32
#: the same near the ceiling (within :data:`PROBE_MARGIN` of it)
K_PROBE = 4000
#: "near the ceiling": interval below ``PROBE_MARGIN * ceiling``
PROBE_MARGIN = 1.15
#: how long the slowest crawl's interval binds the others after its claim (us)
FLOOR_HOLD_US = 60_000_000


@dataclass(frozen=True)
class Adapt:
    """A host's adaptation: ``interval`` in force (us), ``ceiling`` the
    interval at which it last asked us to slow down, ``cut_at`` when (us)."""

    interval: int
    ceiling: int
    cut_at: int

    def encode(self) -> str:
        """As stored in the ``adapt`` hash: ``interval:ceiling:cut_at``."""
        return f"{self.interval}:{self.ceiling}:{self.cut_at}"

    @classmethod
    def decode(cls, raw: bytes | str | None) -> "Adapt | None":
        """Parse :meth:`encode`'s form; None for absent or unreadable."""
        if raw is None:
            return None
        try:
            a, c, t = (raw.decode() if isinstance(raw, bytes) else raw).split(":")
            return cls(int(a), int(c), int(t))
        except ValueError:
            return None


@dataclass(frozen=True)
class Floor:
    """The slowest recent crawl's interval (us), binding until ``until`` (us)."""

    interval: int
    until: int

    def encode(self) -> str:
        return f"{self.interval}:{self.until}"

    @classmethod
    def decode(cls, raw: bytes | str | None) -> "Floor | None":
        if raw is None:
            return None
        try:
            a, u = (raw.decode() if isinstance(raw, bytes) else raw).split(":")
            return cls(int(a), int(u))
        except ValueError:
            return None


def interval(own: int, crawl_delay: int | None, adapt: Adapt | None, floor: Floor | None, now: int) -> int:
    """The emission interval in force for a claim by a crawl whose own
    interval is ``own`` (us): the largest of the four (see the module)."""
    t = own
    if crawl_delay is not None and crawl_delay > t:
        t = crawl_delay
    if adapt is not None and adapt.interval > t:
        t = adapt.interval
    if floor is not None and floor.until > now and floor.interval > t:
        t = floor.interval
    return t


def next_floor(floor: Floor | None, own: int, now: int) -> Floor | None:
    """The floor after a claim by a crawl of interval ``own``: that crawl's
    interval, renewed, if it is the slowest of the live floor (None: the
    stored floor stays as it is, to save a write)."""
    if floor is not None and floor.until > now and floor.interval > own:
        return None
    hold = max(FLOOR_HOLD_US, 3 * own)
    if floor is not None and floor.interval == own and floor.until - now > hold // 2:
        return None
    return Floor(own, now + hold)


def conforms(tat: int, now: int, t: int, bm1: float) -> bool:
    """Whether a request at ``now`` conforms (GCRA: ``now >= TAT - tau``,
    ``tau = bm1 * t``; ``bm1`` = burst - 1)."""
    return now >= tat - bm1 * t


def allowed_at(tat: int, now: int, t: int, bm1: float) -> float:
    """The earliest time a request conforms, never before ``now``."""
    return max(now, tat - bm1 * t)


def charge(tat: int, now: int, t: int) -> int:
    """The TAT after a conforming request at ``now``."""
    return max(tat, now) + t


def on_slowdown(adapt: Adapt | None, current: int, now: int, max_interval: int, told: bool = False) -> Adapt:
    """The adaptation after a 429 or 503 at ``now``; ``current`` is the
    interval that was in force (us); ``told``: the answer had a Retry-After
    (the host said when to come back: no jump to :data:`FIRST_CUT_US`).
    Within one interval of the last cut, nothing changes (the answers of
    requests sent together count once)."""
    if adapt is not None and now - adapt.cut_at < current:
        return adapt
    if adapt is None and not told:
        new = max(CUT_FACTOR * current, FIRST_CUT_US)
    else:
        new = CUT_FACTOR * current
    return Adapt(min(new, max(max_interval, current)), current, now)


def on_success(adapt: Adapt | None, own: int) -> Adapt | None:
    """The adaptation after a successful response: the interval shrinks
    by 1/K_FAST, or 1/K_PROBE near the ceiling; None once it is back at the
    crawl's own interval ``own``."""
    if adapt is None:
        return None
    k = K_PROBE if adapt.interval <= PROBE_MARGIN * adapt.ceiling else K_FAST
    new = adapt.interval - adapt.interval // k
    if new <= own:
        return None
    return Adapt(new, adapt.ceiling, adapt.cut_at)


class SendPacer:
    """Keeps a worker's own requests to one registered domain at least
    ``gap`` seconds apart *as they leave the process*.

    The claim script grants a request its GCRA slot in Redis time, but the
    request is sent a little later (the greenlet runs, robots.txt may come
    first); on a loaded machine one late request and the next, on time,
    would reach the server closer than the rate allows.  Before each send
    the worker asks :meth:`send_at` when it may go; the answer books that
    time (no yield in between: greenlets are cooperative), so concurrent
    requests of one domain are spaced too.  Times are monotonic seconds;
    ``max_keys`` bounds the memory (the oldest half is forgotten when full).
    """

    def __init__(self, max_keys: int = 100_000):
        self._last: dict[str, float] = {}
        self._max = max_keys

    def send_at(self, pkey: str, now: float, gap: float) -> float:
        """The earliest time >= ``now`` a request to ``pkey`` may leave,
        booked as its send time."""
        last = self._last.get(pkey)
        t = now if last is None else max(now, last + gap)
        if last is None and len(self._last) >= self._max:
            for k in list(self._last)[: self._max // 2]:
                del self._last[k]
        self._last[pkey] = t
        return t
