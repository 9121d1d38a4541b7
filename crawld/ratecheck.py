"""Politeness measured after the fact, from request timestamps (pure).

Used on a site server's own log (tests, demo, benchmarks) and on the
``fetched_at`` column of an artifact.  The bounds are those of DESIGN.md
promise 2 for a rate R and a bucket of at most 2 tokens: no closed 1 s
window may hold more than ceil(R)+1 requests, no 10 s window more than
10R+ceil(R)+1.
"""

from __future__ import annotations

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
