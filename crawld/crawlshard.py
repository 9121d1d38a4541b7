"""One crawl's shard inside a worker process: everything about visiting
its URLs.

A :class:`CrawlShard` holds the per-crawl state of a worker: the crawl's
config, frontier, router and link planner, robots.txt cache, HTTP session
(its user agent and address policy are the crawl's), part writers, the
shard's lease, and the work not yet committed (rows, pushes, acks).  The
worker (:mod:`crawld.worker`) runs the greenlets and decides which crawl
claims next; this module says what happens to each claimed URL:

* a URL to record without fetching (the entry's mode says why) becomes a
  ``skipped`` or ``blocked`` row;
* a URL to visit goes through the address policy, robots.txt (fetched once
  per origin, taking this claim's politeness slot and booking another for
  the page), the fetch, and then its row and the pushes of its links
  (:mod:`crawld.links`); a failure worth retrying gives the claim back.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import defaultdict
from typing import Callable

import gevent
import redis

from . import keys, logs, metrics
from .config import CrawlConfig
from .crawls import load_scope
from .extract import HTML_TYPES, parse_content_type, parse_html
from .fetcher import FetchResult, fetch, make_session
from .frontier import Claim, Entry, Frontier, HostReport, LeaseLost, PushItem, StaleConfig
from .links import LinkPlanner, Push, origin_of, robots_directives
from .netpolicy import AddressPolicy
from .outcomes import DEFER, RECORD, disposition, host_report
from .politeness import SendPacer
from .ratecheck import LiveAudit
from .output import PartWriter
from .storage import is_remote, open_storage, part_key, recover_spool, spool_dir
from .robots import MAX_ROBOTS_BYTES, UNREACHABLE, RobotsCache, RobotsFetch, agent_token

#: redirects followed when fetching a robots.txt (RFC 9309 section 2.3.1.2)
ROBOTS_MAX_REDIRECTS = 5
from .rows import ROBOTS_UNREACHABLE, REDIRECT_STATUSES, make_row, outcome_of_mode

#: the ``error`` of a link recorded instead of queued while Redis memory is
#: above the crawl's ``memory_high_watermark`` (outcome ``skipped``)
SPILL_REASON = "memory_backpressure"
#: back-pressure ends when used memory falls this share of maxmemory below
#: the watermark (hysteresis: no flapping around it)
BACKPRESSURE_HYSTERESIS = 0.02
from .scope import Router
from .sitemaps import parse_sitemap
from .urls import clean_href, resolve, resolve_link
from .redisconn import ERRORS as REDIS_ERRORS


class CrawlShard:
    """Shard ``shard`` of the crawl ``config``, as served by one worker.

    ``lease_token`` identifies the worker's supervisor to the shard lease;
    ``sync(fd)`` makes a part durable; ``wake()`` is called when a fetch
    ends (its slot may let the claimer claim again); ``pacer`` spaces the
    worker's sends per registered domain (one for all its crawls).

    With an ``s3://`` output, parts are written under ``spool`` (default
    :func:`crawld.storage.spool_dir`) and each closed part is handed to
    ``shipper`` (a :class:`crawld.storage.PartShipper`); parts left in the
    spool by an earlier worker of this shard are handed over at once.
    """

    def __init__(self, client: redis.Redis, config: CrawlConfig, shard: int, *, concurrency: int,
                 proxy: str | None, lease_token: str, sync: Callable[[int], None],
                 wake: Callable[[], None], commit_batch: int = 256, log=None, shipper=None, spool=None,
                 epoch: int | None = None, pacer: SendPacer | None = None):
        self.client = client
        self.pacer = pacer or SendPacer()
        #: the crawl's rebalance generation ``config`` was read at (None: no
        #: check); once a rebalance moves the shard, the lease is refused and
        #: ``stale`` turns True: the worker drops this and reloads the crawl
        self.epoch = epoch
        self.stale = False
        self.config = config
        self.crawl_id = config.crawl_id
        self.shard = shard
        self.lease_token = lease_token
        self.leased = False
        self._lease_known = False
        self.frontier = Frontier(client, config)
        scope = load_scope(client, config.crawl_id)
        self.scope_size = len(scope)
        self.router = Router(config, scope=scope)
        self.session = make_session(config, concurrency, proxy)
        self.policy = AddressPolicy(config.allow_loopback, config.allow_private_networks)
        self.agent = agent_token(config.user_agent)
        self.robots = RobotsCache(client, self._robots_key, self.agent, config.robots_ttl_s,
                                  config.robots_retry_s, self._fetch_robots, self._robots_lock,
                                  on_cut=self._robots_cut)
        self.links = LinkPlanner(config, self.router, self._robots_allows)
        self.shipper = shipper
        self.spool = spool_dir() if spool is None else spool
        self.storage = open_storage(config.output) if is_remote(config.output) else None
        root, on_close = (self.spool, self._ship) if self.storage is not None else (config.output, None)
        self.writer = PartWriter(root, config.crawl_id, shard, sync=sync, on_close=on_close)
        self.skip_writer = PartWriter(root, config.crawl_id, shard, sync=sync, kind="skip", on_close=on_close)
        self.log = log or logs.setup(crawl_id=config.crawl_id, shard=shard, proc="worker")
        self._wake = wake
        self._rand = random.Random()
        self.commit_batch = commit_batch
        self.commit_wanted = False
        self._fetched: list[bytes] = []  # tokens whose in-flight slot can be given back
        self._reports: list[HostReport] = []  # host outcomes for the next claim call
        self._rows: list[dict] = []
        self._skip_rows: list[dict] = []
        self._acks: list[bytes] = []
        self._ack_outcomes: list[str] = []
        self._pushes: dict[int, dict[bytes, PushItem]] = defaultdict(dict)
        self._in_commit = 0  # rows of the commit under way
        self.held: set[bytes] = set()
        self.pages = 0
        self.audit = LiveAudit(config.max_rps_per_host)
        lab = (config.crawl_id, str(shard))
        self.m = {name: getattr(metrics, name).labels(*lab) for name in (
            "FETCH_SECONDS", "RESPONSE_BYTES", "LINKS_DISCOVERED", "LINKS_PUSHED", "LINKS_QUEUED",
            "DEDUP_HITS", "CLAIMS", "ACKS", "NACKS", "ROBOTS_BLOCKS", "RATE_LIMIT_WAITS",
            "POLITENESS_BREACHES", "LEASE_HELD", "DEAD_LETTERS", "LINKS_SPILLED", "MEMORY_BACKPRESSURE",
            "CRAWL_PAUSED", "DEFERRALS", "ROBOTS_CUT")}
        self._labels = lab
        # claim pacing, kept by the worker
        self.next_claim = 0.0
        self.idle = 0.01
        # crawlctl pause|resume|cancel (keys.crawl_state), followed by the worker
        self.state = "active"
        self._claiming = False  # a claim call is under way
        # Redis memory back-pressure: links are spilled as rows, not pushed
        self.backpressure = False
        self._spilled: set[bytes] = set()  # dedup keys already spilled by this worker
        if self.storage is not None:
            for path in recover_spool(self.spool, self.crawl_id, shard):
                self.log.info("part_recovered", part=path.name, action="shipping it")
                self._ship(path)

    def reload_scope(self, size: int) -> None:
        """The crawl's scope set now holds ``size`` domains: read it again
        (seeds were added with ``crawlctl seed``)."""
        if size == self.scope_size:
            return
        scope = load_scope(self.client, self.crawl_id)
        self.router.widen(scope)
        self.scope_size = len(scope)
        self.log.info("scope_widened", domains=self.scope_size)

    # -- parts -------------------------------------------------------------------
    def _ship(self, path) -> None:
        """Hand a closed spooled part to the shipper (none: it stays
        spooled until the next start)."""
        if self.shipper is None or self.storage is None:
            return
        lab = self._labels
        self.shipper.add(path, self.storage, part_key(self.spool, path),
                         on_ship=lambda n: (metrics.PARTS_SHIPPED.labels(*lab).inc(),
                                            metrics.PART_BYTES_SHIPPED.labels(*lab).inc(n)),
                         on_failure=metrics.PART_SHIP_FAILURES.labels(*lab).inc)

    def rotate_parts(self) -> None:
        """Close parts past their age even when no row comes (they ship)."""
        self.writer.rotate_if_old()
        self.skip_writer.rotate_if_old()

    # -- operator state and memory -----------------------------------------------
    @property
    def claimable(self) -> bool:
        """Whether the worker may claim for this crawl now."""
        return self.leased and self.state == "active"

    def set_state(self, state: str) -> bool:
        """Follow the crawl's state (``active``, ``paused``, ``cancelled``,
        ``rebalancing``: claim nothing, like paused);
        logs a change.  Returns whether it changed."""
        if state not in keys.STATES:
            state = "active"
        if state == self.state or self.state == "cancelled":
            return False
        self.state = state
        self.m["CRAWL_PAUSED"].set(1 if state in ("paused", "rebalancing") else 0)
        event = {"active": "crawl_resumed", "paused": "crawl_paused", "cancelled": "crawl_cancelled",
                 "rebalancing": "crawl_rebalancing"}[state]
        self.log.info(event, in_flight=len(self.held),
                      action={"active": "claiming again", "paused": "claiming nothing, finishing what is held",
                              "cancelled": "stopped claiming for good, finishing what is held",
                              "rebalancing": "claiming nothing, finishing what is held, then giving the "
                                             "lease up until the rebalance is over"}[state])
        return True

    def quiet(self) -> bool:
        """Nothing claimed, being claimed, or waiting to be committed."""
        return not (self.held or self._claiming or self.has_uncommitted() or self.pending_rows())

    def observe_memory(self, used: int, maxmemory: int) -> None:
        """Turn back-pressure on at ``memory_high_watermark`` of Redis
        ``maxmemory`` (never without a maxmemory), off a little below it;
        logs each transition once."""
        wm = self.config.memory_high_watermark
        if wm <= 0 or maxmemory <= 0:
            over = False
        elif self.backpressure:
            over = used >= (wm - BACKPRESSURE_HYSTERESIS) * maxmemory
        else:
            over = used >= wm * maxmemory
        if over == self.backpressure:
            return
        self.backpressure = over
        self.m["MEMORY_BACKPRESSURE"].set(1 if over else 0)
        fields = dict(used_memory=used, maxmemory=maxmemory, watermark=wm,
                      used_share=round(used / maxmemory, 4) if maxmemory else None)
        if over:
            self.log.warning("memory_backpressure_on", **fields,
                             action=f"new links recorded as skipped ({SPILL_REASON}), not queued")
        else:
            self.log.info("memory_backpressure_off", **fields, action="queueing new links again")

    def _spill(self, pushes: dict[int, dict[bytes, PushItem]]) -> list[dict]:
        """Rows for links that are not pushed because of back-pressure: a
        URL to fetch becomes ``skipped`` with :data:`SPILL_REASON`, a URL to
        record gets its own reason.  The row's shard is the URL's owner (a
        fetched row of the same URL wins at merge: skip parts come last)."""
        rows = []
        now = time.time()
        if len(self._spilled) > 500_000:
            self._spilled.clear()
        for shard, items in pushes.items():
            for key, item in items.items():
                if key in self._spilled:
                    continue
                self._spilled.add(key)
                e = Entry.from_payload(item.payload)
                mode = item.mode.decode() if isinstance(item.mode, bytes) else item.mode
                rows.append(make_row(crawl_id=self.crawl_id, url=e.url, canonical_url=e.canonical,
                                     outcome=outcome_of_mode(mode) if mode else "skipped",
                                     error=mode or SPILL_REASON, shard=shard, attempt=0, depth=e.depth,
                                     referrer=e.referrer, host=self.links.row_host(e, mode or ""),
                                     fetched_at=now, response_ms=0.0, redirect_chain=e.redirect_chain))
        return rows

    # -- claiming --------------------------------------------------------------
    def claim(self, n: int) -> tuple[float, list[Claim]]:
        """Claim up to ``n`` entries, handing back finished slots and host
        outcomes.  Raises ``redis.RedisError`` (the handed-back work is kept
        for the next call) and :class:`LeaseLost` (``leased`` turns False)."""
        fetched, self._fetched = self._fetched, []
        reports, self._reports = self._reports, []
        self._claiming = True
        try:
            wait, claims = self.frontier.claim(self.shard, n, fetched, reports, self.lease_token)
        except LeaseLost:
            self.leased = False
            self._fetched.extend(fetched)
            raise
        except REDIS_ERRORS:
            self._fetched.extend(fetched)  # giving a slot back is idempotent: retry
            self._reports.extend(reports)
            raise
        finally:
            self._claiming = False
        self.held.update(c.token for c in claims)
        if claims:
            self.m["CLAIMS"].inc(len(claims))
        elif wait >= 0:
            self.m["RATE_LIMIT_WAITS"].inc()
        return wait, claims

    def pending_rows(self) -> int:
        """Rows not yet durable (back-pressure)."""
        return len(self._rows) + len(self._skip_rows) + self._in_commit

    def has_uncommitted(self) -> bool:
        return bool(self._rows or self._skip_rows or self._acks or self._pushes)

    def renew_lease(self, ttl_s: float) -> bool:
        """Take or renew this shard's lease; logs changes.  Returns whether
        this worker serves the shard now."""
        try:
            ok = self.frontier.lease(self.shard, self.lease_token, ttl_s, self.epoch)
        except StaleConfig:
            if not self.stale:
                self.log.info("crawl_rebalanced", epoch=self.epoch, action="reloading the crawl")
            self.stale, ok = True, False
        if ok != self.leased or not self._lease_known:
            self._lease_known = True
            if ok:
                self.log.info("lease_acquired")
            else:
                holder = self.frontier.leaseholder(self.shard)
                self.log.warning("lease_held_elsewhere", holder=holder, action="standing by")
        self.leased = ok
        self.m["LEASE_HELD"].set(1 if ok else 0)
        return ok

    def extend_claims(self) -> None:
        """Heartbeat: keep the claims being worked on from expiring."""
        held = list(self.held)
        if held:
            self.frontier.extend(self.shard, held)

    def close(self) -> None:
        """Close the parts and give the lease up (after the last commit)."""
        self.writer.close()
        self.skip_writer.close()
        self.session.close()
        self.release_lease()

    def release_lease(self) -> None:
        """Give the shard's lease up (nothing may be claimed after this)."""
        self.m["LEASE_HELD"].set(0)
        self.leased = False
        try:
            if self.frontier.release(self.shard, self.lease_token):
                self.log.info("lease_released")
        except REDIS_ERRORS as exc:
            self.log.warning("lease_release_failed", error=_one_line(exc))

    # -- one entry -----------------------------------------------------------
    def process(self, claim: Claim) -> None:
        """Work on one claimed entry (a greenlet's entry point); never raises."""
        try:
            entry = Entry.from_payload(claim.payload)
        except (ValueError, KeyError, TypeError) as exc:
            self._slot_done(claim)
            self._give_back(claim, f"bad_entry: {exc}")
            return
        try:
            if claim.mode:
                self._record(entry, claim, claim.mode)
            else:
                self._visit(entry, claim)
        except Exception as exc:  # noqa: BLE001 - a page must never kill the worker
            self.log.exception("process_failed", url=entry.url)
            self._slot_done(claim)
            self._give_back(claim, f"internal: {type(exc).__name__}: {exc}")

    def _slot_done(self, claim: Claim) -> None:
        """The politeness slot of ``claim`` is no longer used."""
        if not claim.mode:
            self._fetched.append(claim.token)
            self._wake()

    def _give_back(self, claim: Claim, error: str, count: bool = True, report: HostReport | None = None,
                   payload: bytes | None = None) -> None:
        """Nack ``claim`` with ``error``, applying the host outcome
        ``report`` in the same script call (``payload``: the entry's new
        payload)."""
        self.held.discard(claim.token)
        try:
            r = self.frontier.nack(self.shard, claim.token, error, count, report, payload)
            self.m["NACKS"].inc()
            if r == 2:
                self.m["DEAD_LETTERS"].inc()
        except REDIS_ERRORS as exc:
            # the claim expires and comes back through reclaim; the host
            # outcome goes with the next claim call
            if report is not None:
                self._reports.append(report)
            self.log.error("nack_failed", error=_one_line(exc))

    def _finish(self, claim: Claim, row: dict, pushes: list[Push] = (), skip: bool = False) -> None:
        (self._skip_rows if skip else self._rows).append(row)
        self._acks.append(claim.token)
        self._ack_outcomes.append(row["outcome"])
        if row.get("outlinks"):
            self.m["LINKS_DISCOVERED"].inc(len(row["outlinks"]))
        for shard, key, item in pushes:
            self._pushes[shard][key] = item
        self.pages += 1
        if len(self._rows) + len(self._skip_rows) >= self.commit_batch:
            self.commit_wanted = True

    def _base_row(self, entry: Entry, claim: Claim, fetched_at: float, mode: str = "") -> dict:
        return dict(crawl_id=self.config.crawl_id, url=entry.url, canonical_url=entry.canonical,
                    shard=self.shard, attempt=claim.attempts, depth=entry.depth, referrer=entry.referrer,
                    host=self.links.row_host(entry, mode), fetched_at=fetched_at, response_ms=0.0,
                    redirect_chain=entry.redirect_chain, retry=entry.retry)

    def _record(self, entry: Entry, claim: Claim, mode: str, skip: bool = True) -> None:
        """A row for a URL that is not fetched, and why."""
        row = make_row(outcome=outcome_of_mode(mode), error=mode, **self._base_row(entry, claim, time.time(), mode))
        self._finish(claim, row, skip=skip)

    def _visit(self, entry: Entry, claim: Claim) -> None:
        cfg = self.config
        route = self.router.route(entry.canonical)
        blocked = self.policy.check_host(route.host)
        if blocked:
            self._slot_done(claim)
            return self._record(entry, claim, f"address_blocked: {blocked}", skip=False)
        origin = origin_of(entry.canonical)
        pol = self.robots.cached(origin)
        fetched_robots = False
        if pol is None:
            pol, fetched_robots = self.robots.fetch(origin)
            if fetched_robots:
                self._after_robots(origin, route.pkey, route.in_scope, pol)
        if pol.state == UNREACHABLE:
            # RFC 9309 2.3.1.4: complete disallow for now; the URL waits,
            # spending no attempt, until robots.txt can be read
            self._slot_done(claim)
            why = f"{ROBOTS_UNREACHABLE}: {pol.record.error or f'HTTP {pol.record.status}'}"
            if entry.deferrals >= cfg.max_deferrals:
                return self._record(entry, claim, why, skip=False)
            if fetched_robots:
                # this claim's own request failed: a failure of the host, which
                # backs it off, probes it one request at a time and gives it up
                # only after host_give_up_s (its URLs then become rows)
                report = HostReport(route.pkey, "f", self._rand.random(), why)
            else:
                # found so by another request moments ago: wait for its retry
                left = cfg.robots_retry_s - (time.time() - pol.record.fetched_at)
                report = HostReport(route.pkey, "h", max(left, 0.05), why)
            deferred = dataclasses.replace(entry, deferrals=entry.deferrals + 1)
            return self._give_back(claim, why, count=False, report=report, payload=deferred.to_payload())
        if not pol.allowed(entry.url):
            self._slot_done(claim)
            self.m["ROBOTS_BLOCKS"].inc()
            return self._record(entry, claim, "robots_disallowed", skip=False)
        if fetched_robots:
            # the robots.txt request took this claim's politeness slot
            wait = self.frontier.reserve(self.shard, route.pkey)
            if wait > 0:
                gevent.sleep(wait)
        self._pace(route.pkey, claim.interval_s)
        res = fetch(self.session, entry.url, cfg)
        self._slot_done(claim)
        self._observe(route.pkey, res)
        report = host_report(route.pkey, res, cfg, self._rand)
        action = disposition(res, claim.attempts, entry.deferrals, cfg)
        if action != RECORD:
            # the host's hold (Retry-After, backoff) and the requeue in one
            # step: a claim call under way cannot take the URL back early
            why = res.error or f"HTTP {res.status}"
            if action == DEFER:
                self.m["DEFERRALS"].inc()
                deferred = dataclasses.replace(entry, deferrals=entry.deferrals + 1)
                return self._give_back(claim, why, count=False, report=report, payload=deferred.to_payload())
            return self._give_back(claim, why, report=report)
        if report is not None:
            self._reports.append(report)
        row, pushes = self._outcome(entry, claim, res)
        self._finish(claim, row, pushes)

    def _observe(self, pkey: str, res: FetchResult) -> None:
        """Metrics of one page request, and the live politeness audit."""
        metrics.FETCHES.labels(*self._labels, metrics.status_class(res.status), res.error_kind or "").inc()
        self.m["FETCH_SECONDS"].observe(res.elapsed_ms / 1000.0)
        self.m["RESPONSE_BYTES"].observe(len(res.body or b""))
        if res.started_at and res.error_kind != "blocked":
            self.audit_request(pkey, res.started_at)

    def audit_request(self, pkey: str, started_at: float) -> None:
        """The live politeness audit of one request sent to ``pkey``."""
        if self.audit.record(pkey, started_at):
            self.m["POLITENESS_BREACHES"].inc()
            self.log.error("politeness_breach", pkey=pkey, max_rps_per_host=self.config.max_rps_per_host)

    def _after_robots(self, origin: str, pkey: str, in_scope: bool, pol) -> None:
        """First sight of an origin's robots.txt: honour Crawl-delay, and
        seed its sitemaps when the crawl asks for them."""
        cfg = self.config
        if pol.crawl_delay_s and pol.crawl_delay_s > 1.0 / cfg.max_rps_per_host:
            self.frontier.slow_down(self.shard, pkey, pol.crawl_delay_s)
            self.log.info("crawl_delay", origin=origin, delay_s=pol.crawl_delay_s)
        if cfg.sitemaps and in_scope and pol.state != UNREACHABLE:
            pushes = []
            for sm in [*pol.sitemaps, origin + "/sitemap.xml"]:
                url = resolve(None, sm)  # sitemap URLs are absolute (sitemaps.org)
                canon = self.router.canonical(url) if url else None
                if canon is not None:
                    p = self.links.plan(url, canon, 0, origin + "/robots.txt", kind="sitemap")
                    if p is not None:
                        pushes.append(p)
            by_shard: dict[int, list[PushItem]] = defaultdict(list)
            for shard, _, item in pushes:
                by_shard[shard].append(item)
            for shard, items in by_shard.items():
                self.frontier.push(shard, items)

    def _pace(self, pkey: str, interval_s: float = 0.0) -> None:
        """Wait until a request to ``pkey`` may leave this process
        (:class:`crawld.politeness.SendPacer`, shared by the worker's crawls):
        the interval in force (the claim's, at least the crawl's own) less
        the GCRA tolerance after the last one."""
        cfg = self.config
        now = time.monotonic()
        t = max(interval_s, 1.0 / cfg.max_rps_per_host)
        at = self.pacer.send_at(pkey, now, t * (2.0 - cfg.burst))
        if at > now:
            gevent.sleep(at - now)

    def _origin_shard(self, origin: str) -> int:
        return self.router.route(origin + "/").shard

    def _robots_key(self, origin: str) -> str:
        return keys.shard_keys(self.crawl_id, self._origin_shard(origin)).robots

    def _robots_lock(self, origin: str) -> str:
        return keys.robots_lock(self._origin_shard(origin), origin)

    def _robots_cut(self, origin: str, got: RobotsFetch) -> None:
        self.m["ROBOTS_CUT"].inc()
        try:
            self.client.hincrby(keys.shard_keys(self.crawl_id, self.shard).stats, "robots_cut", 1)
        except REDIS_ERRORS:
            pass
        self.log.warning("robots_txt_cut", origin=origin, max_bytes=MAX_ROBOTS_BYTES,
                         action="rules read up to the last complete line before the cut")

    def _fetch_robots(self, origin: str, via: tuple[str, ...] = ()) -> RobotsFetch:
        """GET ``origin``/robots.txt, following up to
        :data:`ROBOTS_MAX_REDIRECTS` redirects (RFC 9309 section 2.3.1.2:
        at least five; more is "unavailable", 2.3.1.3).  The first request
        uses the politeness slot of the claim that needed the file; every
        hop after it books its own slot with its host's registered domain
        (``reserve``) and waits until it conforms, like any request.  A
        redirect to another origin's ``/robots.txt`` (a bare domain to its
        ``www.``) takes that origin's answer: from the cache, or from its
        own one fetch (so the file is requested once however many origins
        redirect to it); ``via`` are the origins waiting on this one (a
        redirect back to one of them is a loop: "unavailable")."""
        url, hops = origin + "/robots.txt", 0
        pkey = self.router.route(origin + "/").pkey
        while True:
            self._pace(pkey)
            res = fetch(self.session, url, self.config, max_bytes=MAX_ROBOTS_BYTES)
            metrics.ROBOTS_FETCHES.labels(*self._labels, metrics.status_class(res.status)).inc()
            if res.started_at and res.error_kind != "blocked":
                self.audit_request(self.router.route(self.router.canonical(url) or origin + "/").pkey,
                                   res.started_at)
            location = res.headers.get("location") if res.status in REDIRECT_STATUSES else None
            if not location:
                break
            target = resolve(url, location)
            canon = self.router.canonical(target) if target else None
            if canon is None:
                return RobotsFetch(None, error=f"bad_redirect: Location {location[:200]!r}", error_kind="redirects")
            hops += 1
            if hops > ROBOTS_MAX_REDIRECTS:
                return RobotsFetch(None, error=f"redirects: more than {ROBOTS_MAX_REDIRECTS}", error_kind="redirects")
            hop_origin = origin_of(canon)
            other = canon == hop_origin + "/robots.txt" and hop_origin != origin
            if other and hop_origin in via:
                return RobotsFetch(None, error=f"redirects: a loop back to {hop_origin}/robots.txt",
                                   error_kind="redirects")
            if other:
                pol = self.robots.cached(hop_origin)
                if pol is not None:
                    return RobotsFetch.of(pol.record)
            route = self.router.route(canon)
            wait = self.frontier.reserve(route.shard, route.pkey)
            if wait > 0:
                gevent.sleep(wait)
            if other:
                # its fetch takes the slot just booked (or, done elsewhere meanwhile, none)
                pol, _ = self.robots.fetch(hop_origin, via=(*via, origin))
                return RobotsFetch.of(pol.record)
            url, pkey = target, route.pkey
        ok = res.status is not None and 200 <= res.status < 300
        body = res.body.decode("utf-8", errors="replace") if ok else ""
        return RobotsFetch(res.status, body, res.error, res.error_kind, cut=ok and res.truncated)

    def _robots_allows(self, origin: str, url: str) -> bool | None:
        pol = self.robots.known(origin)
        if pol is None or pol.state == UNREACHABLE:
            return None
        return pol.allowed(url)

    def _outcome(self, entry: Entry, claim: Claim, res: FetchResult) -> tuple[dict, list[Push]]:
        cfg = self.config
        common = self._base_row(entry, claim, res.started_at)
        common["response_ms"] = res.elapsed_ms
        if res.status is None:
            kind = "blocked" if res.error_kind == "blocked" else "error"
            return make_row(outcome=kind, error=_attempts_note(res.error, claim), **common), []
        mime, charset = parse_content_type(res.headers.get("content-type"))
        error = res.error
        if res.truncated and not error:
            error = f"truncated: body over {cfg.max_body_bytes} bytes"
        elif res.status in (429,) or res.status >= 500:
            error = _attempts_note(error, claim) if claim.attempts > 1 else error
        common.update(status=res.status, content_type=mime, content_length=len(res.body),
                      truncated=res.truncated, error=error, x_robots_tag=res.headers.get("x-robots-tag"))
        if res.status in REDIRECT_STATUSES:
            if res.headers.get("location"):
                return self._redirect(entry, res, common)
            common["error"] = common["error"] or "redirect_without_location"
        ok = 200 <= res.status < 300 and res.body
        if ok and entry.kind == "sitemap":
            return self._sitemap(entry, res, common)
        if ok and mime in HTML_TYPES:
            page = parse_html(res.body, charset)
            base = entry.url
            if page.base_href:
                base = resolve(entry.url, page.base_href) or entry.url
            # the X-Robots-Tag field lines one by one: joined, an unscoped
            # line after a scoped one would read as scoped
            directives = robots_directives(page.meta_robots, res.x_robots_tag, self.agent)
            nofollow_all = cfg.honour_robots_meta and "nofollow" in directives
            outlinks, pushes = self.links.page_links(entry.url, base, page.hrefs, page.nofollow,
                                                     entry.depth, nofollow_all)
            canonical_link = resolve(base, page.canonical_link) if page.canonical_link else None
            fields = dict(title=page.title, meta_robots=page.meta_robots, canonical_link=canonical_link,
                          outlinks=outlinks)
            if page.refresh_delay is not None:
                # <meta http-equiv=refresh>: its URL is parsed against the
                # document's base URL (an empty or fragment-only one is that
                # base URL).  Another URL than the page's own is followed as
                # a redirect hop, whatever the delay (see crawld.rows);
                # the page's own links are pushed all the same.
                common["refresh_delay_s"] = page.refresh_delay
                url = page.refresh_url
                if url is not None:
                    cleaned = clean_href(url)
                    location = url if cleaned and cleaned[0] != "#" else base
                    target = resolve(base, location)
                    if target is None or self.router.canonical(target) != entry.canonical:
                        row, hop = self._redirect(entry, res, common, location, base=base, kind="meta_refresh",
                                                  **fields)
                        if hop:
                            # the hop first and alone under its key: its
                            # entry (with the redirect chain) is the one kept
                            pushes = hop + [p for p in pushes if p[1] != hop[0][1]]
                        return row, pushes
            return make_row(outcome="fetched", **fields, **common), pushes
        return make_row(outcome="fetched", **common), []

    def _redirect(self, entry: Entry, res: FetchResult, common: dict, location: str | None = None, *,
                  base: str | None = None, kind: str = "http", **fields) -> tuple[dict, list[Push]]:
        """The row of a URL that redirects, and the push of its target as a
        hop of the redirect chain (scoped, deduplicated, rate-limited on its
        own shard): ``location`` (default the Location header) resolved
        against ``base`` (default the URL).  ``kind`` is the row's
        ``redirect_kind``; ``fields`` go to the row as they are."""
        if location is None:
            location = res.headers["location"]
        common = dict(common, redirect_kind=kind, **fields)
        target, why = resolve_link(base or entry.url, location)
        canon = self.router.canonical(target) if target else None
        if canon is None:
            what = "Location" if kind == "http" else "meta refresh URL"
            common["error"] = f"bad_redirect: {what} {location[:200]!r}" + (f" ({why})" if why else "")
            return make_row(outcome="error", **common), []
        chain = entry.redirect_chain + (entry.url,)
        earlier = {self.router.canonical(u) for u in chain}
        if canon in earlier:
            common["error"] = f"redirect_loop: back to {target[:200]}"
            return make_row(outcome="error", final_url=target, **common), []
        if len(chain) > self.config.max_redirects:
            common["error"] = f"too_many_redirects: more than {self.config.max_redirects}"
            return make_row(outcome="error", final_url=target, **common), []
        p = self.links.plan(target, canon, entry.depth, entry.referrer, redirect_chain=chain, kind=entry.kind)
        return make_row(outcome="redirect", final_url=target, **common), [p] if p else []

    def _sitemap(self, entry: Entry, res: FetchResult, common: dict) -> tuple[dict, list[Push]]:
        sm = parse_sitemap(res.body)
        pushes: list[Push] = []
        listed: list[str] = []
        # an index's sitemaps are one nesting level deeper (the entry's
        # depth; crawld.links stops them at crawld.sitemaps.MAX_NESTING); the
        # pages a sitemap lists start at depth 0, as seeds do
        child_kind = "sitemap" if sm.kind == "sitemapindex" else "page"
        child_depth = entry.depth + 1 if child_kind == "sitemap" else 0
        for loc in sm.locs:
            url = resolve(None, loc)  # a <loc> is an absolute URL (sitemaps.org)
            canon = self.router.canonical(url) if url else None
            if canon is None:
                continue
            listed.append(canon)
            p = self.links.plan(url, canon, child_depth, entry.url, kind=child_kind)
            if p is not None:
                pushes.append(p)
        if sm.error:
            common["error"] = common["error"] or f"sitemap: {sm.error}"
        return make_row(outcome="fetched", outlinks=listed, **common), pushes

    # -- group commit ----------------------------------------------------------
    def commit(self) -> None:
        """Write pending rows (fdatasync), then push and ack in one round trip;
        retried until it succeeds (rows are cut back on a failed write)."""
        rows, skip_rows, acks, pushes = self._rows, self._skip_rows, self._acks, self._pushes
        outcomes = self._ack_outcomes
        if not rows and not skip_rows and not acks and not pushes:
            return
        self._rows, self._skip_rows, self._acks, self._pushes = [], [], [], defaultdict(dict)
        self._ack_outcomes = []
        if self.backpressure and pushes:
            # Redis is near maxmemory: record the links instead of queueing them
            spilled = self._spill(pushes)
            self.m["LINKS_SPILLED"].inc(sum(len(items) for items in pushes.values()))
            skip_rows, pushes = [*skip_rows, *spilled], defaultdict(dict)
        written: dict[str, int] = defaultdict(int)
        for r in (*rows, *skip_rows):
            written[r["outcome"]] += 1
        self._in_commit = len(rows) + len(skip_rows)
        errors = 0
        while True:
            try:
                if rows:
                    self.writer.write(rows)
                    rows = []
                if skip_rows:
                    self.skip_writer.write(skip_rows)
                    skip_rows = []
                acked, (queued, _, dups) = self.frontier.commit(
                    {s: list(items.values()) for s, items in pushes.items()}, {self.shard: acks},
                    {self.shard: outcomes})
                break
            except (*REDIS_ERRORS, OSError) as exc:
                errors += 1
                self.log.error("commit_failed", error=_one_line(exc), consecutive=errors)
                gevent.sleep(min(0.2 * 2 ** min(errors, 5), 5.0))
        self._in_commit = 0
        for outcome, n in written.items():
            metrics.ROWS.labels(*self._labels, outcome).inc(n)
        self.m["ACKS"].inc(acked)
        self.m["LINKS_PUSHED"].inc(sum(len(items) for items in pushes.values()))
        self.m["LINKS_QUEUED"].inc(queued)
        local, self.links.local_dups = self.links.local_dups, 0
        self.m["DEDUP_HITS"].inc(dups + local)
        for t in acks:
            self.held.discard(t)
        for items in pushes.values():
            self.links.remember(items.keys())


def _one_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _attempts_note(error: str | None, claim: Claim) -> str | None:
    if claim.attempts <= 1:
        return error
    return f"{error or 'failed'} (gave up after {claim.attempts} attempts)"
