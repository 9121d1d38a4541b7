"""Politeness measured after the fact, from request timestamps (pure).

Used on a site server's own log (tests, demo, benchmarks) and on the
``fetched_at`` column of an artifact.  The bounds are those of DESIGN.md
promise 2 for a rate R and a bucket of at most 2 tokens: no closed 1 s
window may hold more than ceil(R)+1 requests, no 10 s window more than
10R+ceil(R)+1.
"""

from __future__ import annotations

import bisect
import math
from typing import Iterable


def max_in_window(times: Iterable[float], window_s: float) -> int:
    """Most timestamps (seconds) inside any closed window of ``window_s``."""
    ts = sorted(times)
    best = j = 0
    for i in range(len(ts)):
        while ts[i] - ts[j] > window_s:
            j += 1
        best = max(best, i - j + 1)
    return best


def limits(rps: float) -> tuple[int, float]:
    """Allowed requests in a 1 s and in a 10 s window at ``rps``."""
    return math.ceil(rps) + 1, 10 * rps + math.ceil(rps) + 1


def rate_violations(times_by_key: dict[str, list[float]], rps: float) -> dict[str, tuple[int, int]]:
    """Keys whose timestamps break the bounds at ``rps`` requests/s, as
    key -> (most requests in a 1 s window, most in a 10 s window)."""
    lim1, lim10 = limits(rps)
    bad = {}
    for key, ts in times_by_key.items():
        m1, m10 = max_in_window(ts, 1.0), max_in_window(ts, 10.0)
        if m1 > lim1 or m10 > lim10:
            bad[key] = (m1, m10)
    return bad


class LiveAudit:
    """The same bounds checked as requests start, per politeness key
    (a worker audits its own shard: leases make it the only fetcher of the
    shard's keys).

    :meth:`record` takes a request's start time (seconds) and says whether
    it put its key over either bound; start times may arrive slightly out
    of order.  Keys idle for 10 s are forgotten, so memory follows the keys
    fetched in the last 10 s.
    """

    def __init__(self, rps: float):
        self.lim1, self.lim10 = limits(rps)
        self._times: dict[str, list[float]] = {}
        self._n = 0

    def record(self, key: str, t: float) -> bool:
        ts = self._times.setdefault(key, [])
        bisect.insort(ts, t)
        latest = ts[-1]
        cut = bisect.bisect_left(ts, latest - 10.0)
        if cut:
            del ts[:cut]
        self._n += 1
        if self._n % 1024 == 0:
            self._forget(t - 10.0)
        lo = bisect.bisect_left(ts, t - 10.0)
        hi = bisect.bisect_right(ts, t + 10.0)
        if self._max_around(ts, t, 10.0, lo, hi) > self.lim10:
            return True
        lo = bisect.bisect_left(ts, t - 1.0)
        hi = bisect.bisect_right(ts, t + 1.0)
        return self._max_around(ts, t, 1.0, lo, hi) > self.lim1

    @staticmethod
    def _max_around(ts: list[float], t: float, window: float, lo: int, hi: int) -> int:
        """Most timestamps in a closed ``window`` that contains ``t``."""
        best = 0
        for i in range(lo, hi):
            s = ts[i]
            if s > t:
                break
            best = max(best, bisect.bisect_right(ts, s + window, i, hi) - i)
        return best

    def _forget(self, before: float) -> None:
        for key in [k for k, ts in self._times.items() if not ts or ts[-1] < before]:
            del self._times[key]
