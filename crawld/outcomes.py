"""What a fetch result means for its host and for its URL (pure).

* :func:`host_report` — how the politeness key is treated next: success
  resets its failure count; 429 and 503 with Retry-After hold it for that
  long (seconds or HTTP-date; beyond ``max_retry_after_s`` the host is
  given up); other 5xx, 429 without Retry-After, connection errors and
  time-outs count as failures and back it off exponentially (the claim
  script does the arithmetic, with "equal jitter" as in AWS's "Exponential
  Backoff and Jitter", 2015), and ``host_max_failures`` in a row park it.
* :func:`retry_url` — whether the URL itself is tried again (up to
  ``max_attempts`` claims) instead of being recorded now.
"""

from __future__ import annotations

import random

from .config import CrawlConfig
from .fetcher import FetchResult, parse_retry_after
from .frontier import HostReport

#: statuses worth another attempt later
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: fetch errors that say something about the host's health
HOST_FAILURE_KINDS = frozenset({"connect", "timeout", "deadline", "protocol"})


def host_report(pkey: str, res: FetchResult, config: CrawlConfig,
                rand: random.Random | None = None) -> HostReport | None:
    """The :class:`HostReport` for a fetch of ``pkey``, or None when the
    result says nothing about the host (a bad URL, a blocked address)."""
    status = res.status
    if status is None:
        if res.error_kind in HOST_FAILURE_KINDS:
            return HostReport(pkey, "f", (rand or random).random(), res.error or res.error_kind or "error")
        return None
    if status in (429, 503):
        wait = parse_retry_after(res.headers.get("retry-after"))
        if wait is not None:
            if wait > config.max_retry_after_s:
                return HostReport(pkey, "p", 0.0, f"Retry-After {wait:.0f}s over max_retry_after_s")
            return HostReport(pkey, "r", wait, f"HTTP {status} with Retry-After {wait:.0f}s")
    if status == 429 or status >= 500:
        return HostReport(pkey, "f", (rand or random).random(), f"HTTP {status}")
    return HostReport(pkey, "o", 0.0, "")


def retry_url(res: FetchResult, attempts: int, config: CrawlConfig) -> bool:
    """Should the URL go back to the queue for another attempt?"""
    if attempts >= config.max_attempts:
        return False
    if res.status is None:
        return res.retryable
    return res.status in RETRY_STATUSES
