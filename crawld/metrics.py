"""Prometheus metrics: names, units and labels in one place.

prometheus_client in multiprocess mode (its documented recipe): the
supervisor wipes a private directory at start and starts its children with
``PROMETHEUS_MULTIPROC_DIR`` naming it; each worker and the reclaimer write
their values to files there; the supervisor serves ``/metrics``
aggregating every file (:func:`serve`) and calls :func:`process_dead` when
it reaps a child.  Without the variable (tests, a worker run by hand) a
process keeps its values in memory.  The supervisor's own figures
(restarts, children up, crash loops, build info) are read from its state at
scrape time (:class:`SupervisorCollector`).

Names follow the Prometheus conventions: a ``crawld_`` prefix, ``_total``
counters, base units (``_seconds``, ``_bytes``).  Labels are bounded:
``crawl_id``, ``shard``, a status class, an error kind, an outcome, a
child name; never a URL, and a registered domain only for the at most
:data:`SLOWED_LABELS` slowest adapted domains of a shard
(``crawld_domain_adapted_rate_rps``).

Gauges of a shard's state in Redis (queue depth, claimed, oldest claim,
leaseholder) and of Redis memory are read at scrape time by
:class:`RedisCollector`, never per request.
"""

from __future__ import annotations

import os
import platform
import shutil
import threading
import time
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from . import __version__

#: port of the supervisor's /metrics (settings: METRICS_PORT)
DEFAULT_PORT = 9410
ENV_DIR = "PROMETHEUS_MULTIPROC_DIR"

SHARD = ("crawl_id", "shard")
#: most domains per shard exported with a ``domain`` label (bounded labels)
SLOWED_LABELS = 10

# -- workers -------------------------------------------------------------------
FETCHES = Counter("crawld_fetches_total", "Page requests finished, by status class (2xx..5xx, or 'none' when no "
                  "response) and error kind (connect, timeout, deadline, reset, too_large, blocked, ...; '' "
                  "for none).", [*SHARD, "status_class", "error_kind"])
FETCH_SECONDS = Histogram("crawld_fetch_duration_seconds", "Time from sending a page request to the end of "
                          "its body, seconds.", SHARD,
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
RESPONSE_BYTES = Histogram("crawld_response_size_bytes", "Body bytes read per page response.", SHARD,
                           buckets=(0, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216))
ROBOTS_FETCHES = Counter("crawld_robots_fetches_total", "robots.txt requests, by status class.",
                         [*SHARD, "status_class"])
ROBOTS_CUT = Counter("crawld_robots_cut_total", "robots.txt files cut at 500 KiB (the rules before the cut "
                     "apply; the worker logs robots_txt_cut with the origin).", SHARD)
ROWS = Counter("crawld_rows_written_total", "Rows written durably to the parts, by outcome (fetched, "
               "redirect, error, blocked, skipped).", [*SHARD, "outcome"])
LINKS_DISCOVERED = Counter("crawld_links_discovered_total", "Links found in pages, sitemaps and redirects.", SHARD)
LINKS_PUSHED = Counter("crawld_links_pushed_total", "Links sent to their owning shards (to fetch or to record).",
                       SHARD)
LINKS_QUEUED = Counter("crawld_links_queued_total", "Pushed links that were new and queued for fetching.", SHARD)
DEDUP_HITS = Counter("crawld_dedup_hits_total", "Pushed links already seen by their shard.", SHARD)
CLAIMS = Counter("crawld_claims_total", "Frontier entries claimed.", SHARD)
ACKS = Counter("crawld_acks_total", "Claims acknowledged after their row was durable.", SHARD)
NACKS = Counter("crawld_nacks_total", "Claims given back to be retried.", SHARD)
DEFERRALS = Counter("crawld_deferrals_total", "Claims given back without spending an attempt of their URL: "
                    "the host answered 429 or 503, or no connection could be made.", SHARD)
ROBOTS_BLOCKS = Counter("crawld_robots_blocked_total", "URLs not fetched because robots.txt disallows them.", SHARD)
RATE_LIMIT_WAITS = Counter("crawld_rate_limit_waits_total", "Claims that found work queued but every due "
                           "politeness key held back by its rate or in-flight cap.", SHARD)
POLITENESS_BREACHES = Counter("crawld_politeness_breaches_total", "Requests that put a registered domain over "
                              "its rate (more than ceil(R)+1 in 1 s or 10R+ceil(R)+1 in 10 s), as seen by "
                              "the worker's own audit of its request start times.", SHARD)
LEASE_HELD = Gauge("crawld_lease_held", "1 while this worker holds the shard's lease of the crawl.", SHARD,
                   multiprocess_mode="livemax")
LINKS_SPILLED = Counter("crawld_links_spilled_total", "Links recorded as rows (skipped, memory_backpressure, "
                        "or their own skip reason) instead of pushed, because Redis memory was above the "
                        "crawl's memory_high_watermark.", SHARD)
MEMORY_BACKPRESSURE = Gauge("crawld_memory_backpressure", "1 while the worker spills new links instead of "
                            "pushing them (Redis used_memory above memory_high_watermark of maxmemory).", SHARD,
                            multiprocess_mode="livemax")
CRAWL_PAUSED = Gauge("crawld_crawl_paused", "1 while the crawl is paused (crawlctl pause) and this worker claims "
                     "nothing for it.", SHARD, multiprocess_mode="livemax")
DRAIN_SECONDS = Histogram("crawld_drain_duration_seconds", "Worker drain time after SIGTERM, seconds.",
                          ["shard"], buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120))

PARTS_SHIPPED = Counter("crawld_parts_shipped_total", "Closed parts uploaded from the local spool to the "
                        "crawl's s3:// output (then deleted locally).", SHARD)
PART_BYTES_SHIPPED = Counter("crawld_part_shipped_bytes_total", "Bytes of the parts uploaded to the crawl's "
                             "s3:// output.", SHARD)
PART_SHIP_FAILURES = Counter("crawld_part_ship_failures_total", "Failed part uploads (each is retried with "
                             "backoff; the part stays in the spool until it succeeds).", SHARD)

# -- reclaim ---------------------------------------------------------------------
RECLAIMS = Counter("crawld_reclaims_total", "Expired claims returned to their queue by reclaim.", SHARD)
DEAD_LETTERS = Counter("crawld_dead_letters_total", "Entries dead-lettered after max_attempts.", SHARD)

def status_class(status: int | None) -> str:
    """``"2xx"`` .. ``"5xx"`` for an HTTP status, ``"none"`` without one."""
    if not status:
        return "none"
    return f"{min(max(status // 100, 1), 5)}xx"


# -- the supervisor's side ---------------------------------------------------------

def prepare_dir(path: str) -> str:
    """Empty (or create) the multiprocess directory ``path``; the
    supervisor passes it to its children as ``PROMETHEUS_MULTIPROC_DIR``
    (they pick their value storage when prometheus_client is imported)."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path, mode=0o700)
    return path


def process_dead(path: str | None, pid: int) -> None:
    """Forget the live gauges of a reaped child (its counters stay)."""
    if path:
        from prometheus_client import multiprocess
        multiprocess.mark_process_dead(pid, path)


class SupervisorCollector:
    """The supervisor's own metrics, read from its state at scrape time:
    ``crawld_worker_restarts_total``, ``crawld_child_up``,
    ``crawld_child_crash_looping`` (by child name: ``worker-<shard>`` or
    ``reclaim``) and ``crawld_build_info``.  ``state()`` is
    :meth:`crawld.supervisor.Supervisor.state`."""

    def __init__(self, state: Callable[[], dict]):
        self.state = state

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        restarts = CounterMetricFamily("crawld_worker_restarts", "Children restarted after an unexpected "
                                       "exit.", labels=["child"])
        up = GaugeMetricFamily("crawld_child_up", "1 while the child process runs.", labels=["child"])
        looping = GaugeMetricFamily("crawld_child_crash_looping", "1 when a child was given up for "
                                    "crash-looping.", labels=["child"])
        for name, st in sorted(self.state().items()):
            restarts.add_metric([name], float(st["restarts"]))
            up.add_metric([name], 1.0 if st["pid"] else 0.0)
            looping.add_metric([name], 1.0 if st["gave_up"] else 0.0)
        info = GaugeMetricFamily("crawld_build_info", "Always 1; the versions of crawld and Python.",
                                 labels=["version", "python"])
        info.add_metric([__version__, platform.python_version()], 1.0)
        return iter([restarts, up, looping, info])


class RedisCollector:
    """Gauges read from Redis at scrape time, for the shards this machine
    serves of every active crawl.

    ``crawls()`` returns ``{crawl_id: Frontier}``; ``shards`` the local
    shard numbers (None: every shard).  Readings are cached ``min_interval_s``
    seconds, so several scrapers cost Redis one read.
    """

    def __init__(self, client, crawls: Callable[[], dict], shards: Iterable[int] | None,
                 min_interval_s: float = 2.0):
        self.client = client
        self.crawls = crawls
        self.shards = None if shards is None else sorted(shards)
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._cached: tuple[float, list] = (0.0, [])
        self.last_error: str | None = None  # why crawld_redis_up is 0

    def collect(self):
        with self._lock:
            at, families = self._cached
            if time.monotonic() - at >= self.min_interval_s:
                families = self._read()
                self._cached = (time.monotonic(), families)
        return iter(families)

    def describe(self):
        return []

    def _read(self) -> list:
        from .status import shard_status, slowed_domains  # the same readings as 'crawlctl status'

        up = GaugeMetricFamily("crawld_redis_up", "1 when the last read of Redis succeeded.")
        families = {
            "queued": GaugeMetricFamily("crawld_shard_queued", "URLs queued to fetch in the shard.", labels=SHARD),
            "hosts_waiting": GaugeMetricFamily("crawld_shard_hosts_scheduled", "Politeness keys with URLs "
                                               "queued, on the shard's schedule.", labels=SHARD),
            "claimed": GaugeMetricFamily("crawld_shard_claimed", "Claims outstanding (not yet acked).",
                                         labels=SHARD),
            "expired": GaugeMetricFamily("crawld_shard_claims_expired", "Claims past their visibility timeout, "
                                         "waiting for reclaim.", labels=SHARD),
            "oldest_claim_s": GaugeMetricFamily("crawld_shard_oldest_claim_age_seconds", "Age of the oldest "
                                                "outstanding claim, seconds (0 when none).", labels=SHARD),
            "skips": GaugeMetricFamily("crawld_shard_skips_queued", "URLs waiting to be recorded without a "
                                       "fetch.", labels=SHARD),
            "dead": GaugeMetricFamily("crawld_shard_dead_letters", "Entries in the dead-letter list.",
                                      labels=SHARD),
            "leased": GaugeMetricFamily("crawld_shard_leaseholder_present", "1 when some worker holds the "
                                        "shard's lease.", labels=SHARD),
            "acked": GaugeMetricFamily("crawld_shard_acked", "Claims acked so far in the crawl (Redis "
                                       "counter).", labels=SHARD),
        }
        slowed = GaugeMetricFamily("crawld_domains_rate_adapted", "Registered domains of the shard whose rate "
                                   "is adapted below the crawls' after 429/503 answers (the fleet's state, "
                                   "shared by every crawl).", labels=["shard"])
        slowest = GaugeMetricFamily("crawld_domain_adapted_rate_rps", "Adapted rate of the (at most "
                                    f"{SLOWED_LABELS}) slowest such domains of the shard, requests/s.",
                                    labels=["shard", "domain"])
        mem_used = GaugeMetricFamily("crawld_redis_used_memory_bytes", "Redis used_memory.")
        mem_max = GaugeMetricFamily("crawld_redis_maxmemory_bytes", "Redis maxmemory (0: no limit).")
        try:
            from .redisconn import primaries_info  # a cluster: the sums over its masters

            nodes = primaries_info(self.client, "memory").values()
            mem_used.add_metric([], float(sum(int(i.get("used_memory", 0)) for i in nodes)))
            mem_max.add_metric([], float(sum(int(i.get("maxmemory", 0)) for i in nodes)))
            seen: set[int] = set()
            for cid, frontier in sorted(self.crawls().items()):
                shards = range(frontier.config.num_shards) if self.shards is None else \
                    [s for s in self.shards if s < frontier.config.num_shards]
                for shard in set(shards) - seen:
                    seen.add(shard)
                    ds = slowed_domains(self.client, shard)
                    slowed.add_metric([str(shard)], float(len(ds)))
                    for d in ds[:SLOWED_LABELS]:
                        slowest.add_metric([str(shard), d["domain"]], d["rate_rps"])
                for shard in shards:
                    st = shard_status(frontier, shard)
                    labels = [cid, str(shard)]
                    st["leased"] = 1 if st["leaseholder"] else 0
                    for name, fam in families.items():
                        fam.add_metric(labels, float(st[name] or 0))
            up.add_metric([], 1.0)
            self.last_error = None
        except Exception as exc:  # noqa: BLE001 - a scrape must answer even when Redis does not
            self.last_error = f"{type(exc).__name__}: {exc}"
            up.add_metric([], 0.0)
            return [up]
        return [up, mem_used, mem_max, slowed, slowest, *families.values()]


def serve(port: int, path: str | None, collectors: Iterable = (), addr: str = "0.0.0.0") -> tuple[object, object]:
    """Serve ``/metrics`` on ``port`` from a thread: the values every
    process wrote under ``path`` (multiprocess mode; None: none) plus
    ``collectors``.  Returns prometheus_client's ``(server, thread)``.

    Raises:
        OSError: the port cannot be bound.
    """
    from prometheus_client import multiprocess, start_http_server

    registry = CollectorRegistry()
    if path:
        multiprocess.MultiProcessCollector(registry, path=path)
    for c in collectors:
        registry.register(c)
    return start_http_server(port, addr=addr, registry=registry)
