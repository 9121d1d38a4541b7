"""What a fetch result means for its host and for its URL (pure).

* :func:`host_report` — how the politeness key is treated next: success
  resets its failure count and lets an adapted rate creep back up; 429 and
  503 mean "slower", not "broken" (RFC 9110 section 15.6.4, RFC 6585
  section 4): the domain's rate is cut (crawld.politeness) and, with
  Retry-After (seconds or HTTP-date), the host is held at least that long
  (beyond ``max_retry_after_s`` it is given up for that long); other 5xx,
  connection errors and time-outs are failures that back it off
  exponentially (the claim script does the arithmetic, with "equal
  jitter" as in AWS's "Exponential Backoff and Jitter", 2015); a host
  failing in a row for ``host_give_up_s`` is given up for as long.
* :func:`disposition` — what becomes of the URL itself: recorded now
  (``record``), tried again spending one of its ``max_attempts``
  (``retry``), or put back without spending one (``defer``): a 429 or 503
  says nothing against the page, and a connection that could not be made
  never carried the request.  A URL is deferred at most ``max_deferrals``
  times; after that, deferrals count as attempts, so every URL ends.
"""

from __future__ import annotations

import random

from .config import CrawlConfig
from .fetcher import FetchResult, parse_retry_after
from .frontier import HostReport

#: statuses worth another attempt later, spending one
RETRY_STATUSES = frozenset({500, 502, 504})
#: statuses that ask the crawler to slow down: the URL is deferred
SLOW_DOWN_STATUSES = frozenset({429, 503})
#: fetch errors that say something about the host's health
HOST_FAILURE_KINDS = frozenset({"connect", "timeout", "deadline", "protocol"})

RECORD, RETRY, DEFER = "record", "retry", "defer"


def host_report(pkey: str, res: FetchResult, config: CrawlConfig,
                rand: random.Random | None = None) -> HostReport | None:
    """The :class:`HostReport` for a fetch of ``pkey``, or None when the
    result says nothing about the host (a bad URL, a blocked address)."""
    status = res.status
    if status is None:
        if res.error_kind in HOST_FAILURE_KINDS:
            return HostReport(pkey, "f", (rand or random).random(), res.error or res.error_kind or "error")
        return None
    if status in SLOW_DOWN_STATUSES:
        wait = parse_retry_after(res.headers.get("retry-after"))
        if wait is not None:
            if wait > config.max_retry_after_s:
                return HostReport(pkey, "p", wait, f"Retry-After {wait:.0f}s over max_retry_after_s")
            return HostReport(pkey, "r", wait, f"HTTP {status} with Retry-After {wait:.0f}s")
        return HostReport(pkey, "a", 0.0, f"HTTP {status}")
    if status >= 500:
        return HostReport(pkey, "f", (rand or random).random(), f"HTTP {status}")
    return HostReport(pkey, "o", 0.0, "")


def disposition(res: FetchResult, attempts: int, deferrals: int, config: CrawlConfig) -> str:
    """:data:`RECORD`, :data:`RETRY` or :data:`DEFER` for the URL of ``res``
    after its ``attempts``-th claim, deferred ``deferrals`` times before."""
    if res.status is None:
        if res.unsent and res.error_kind in HOST_FAILURE_KINDS:
            kind = DEFER
        elif res.retryable:
            kind = RETRY
        else:
            return RECORD
    elif res.status in SLOW_DOWN_STATUSES:
        kind = DEFER
    elif res.status in RETRY_STATUSES:
        kind = RETRY
    else:
        return RECORD
    if kind == DEFER and deferrals < config.max_deferrals:
        return DEFER
    return RETRY if attempts < config.max_attempts else RECORD
