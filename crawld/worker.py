"""The shard worker: one process serving one shard of one crawl.

Run as ``python -m crawld.worker --crawl-id ID --shard N`` (the supervisor
does).  The process is gevent monkey-patched before anything else is
imported, then runs four kinds of greenlet:

* the claimer asks the frontier for as many entries as the pool has free
  slots (one Lua call, which also gives back the in-flight slots of
  finished fetches and applies host outcomes: backoff, parking) and spawns
  a greenlet per entry; when nothing is due it sleeps until the next
  politeness key is due (the claim script says when), until a fetch ends,
  or, when the shard is empty, up to ``idle_max_s``;
* entry greenlets either record a URL without fetching it (the entry's
  mode says why) or visit it: address policy, robots.txt (fetched once per
  origin, taking this claim's politeness slot and booking another for the
  page), fetch, parse, plan the links (:mod:`crawld.links`) and queue a
  row, the pushes and the token to ack; a failure worth retrying gives the
  claim back instead;
* the committer, every ``commit_interval_s`` or ``commit_batch`` rows,
  writes the rows to the shard's NDJSON parts and fdatasyncs them, then
  pushes the links and acks the tokens in one pipelined round trip (group
  commit: an ack always follows the durable row and the pushes of its page);
* the heartbeat extends the visibility deadline of every claim still held.

SIGTERM or SIGINT drains: stop claiming, let in-flight fetches finish
(within ``drain_timeout_s``), commit, close the parts, exit 0.  Fetches cut
off by the drain timeout are not acked; their claims come back through
reclaim after the visibility timeout.
"""

if __name__ == "__main__":  # patch before requests, redis or ssl are imported
    from gevent import monkey

    monkey.patch_all()

import os
import random
import signal
import sys
import time
from collections import defaultdict

import gevent
import gevent.event
import gevent.pool
import redis

from . import exitcodes, keys, logs
from .cliargs import Parser, crawl_id_arg, int_range, positive_float, proxy_url
from .config import ConfigError, CrawlConfig
from .crawls import load_crawl
from .extract import HTML_TYPES, parse_content_type, parse_html
from .fetcher import FetchResult, fetch, make_session
from .frontier import Claim, Entry, Frontier, HostReport, PushItem
from .links import LinkPlanner, Push, origin_of, robots_directives
from .netpolicy import AddressPolicy
from .outcomes import host_report, retry_url
from .output import PartWriter
from .redisconn import RedisUnfit, check, connect, redis_url
from .robots import MAX_ROBOTS_BYTES, UNREACHABLE, RobotsCache, agent_token
from .rows import REDIRECT_STATUSES, make_row, outcome_of_mode
from .scope import Router
from .sitemaps import parse_sitemap
from .urls import resolve


class Worker:
    """Serves ``shard`` of the crawl ``config`` until :meth:`stop`.

    ``concurrency`` is the number of entry greenlets (concurrent requests);
    ``proxy`` an HTTP proxy URL for every request.  Times are seconds.
    """

    def __init__(self, client: redis.Redis, config: CrawlConfig, shard: int, *,
                 concurrency: int = 32, proxy: str | None = None, commit_interval_s: float = 0.2,
                 commit_batch: int = 256, drain_timeout_s: float = 30.0, idle_max_s: float = 0.5,
                 log=None):
        if not 0 <= shard < config.num_shards:
            raise ConfigError(f"shard: {shard} is not in 0..{config.num_shards - 1}")
        self.client = client
        self.config = config
        self.shard = shard
        self.frontier = Frontier(client, config)
        self.router = Router(config)
        self.session = make_session(config, concurrency, proxy)
        self.policy = AddressPolicy(config.allow_loopback, config.allow_private_networks)
        self.agent = agent_token(config.user_agent)
        self.robots = RobotsCache(client, keys.shard_keys(config.crawl_id, shard).robots, self.agent,
                                  config.robots_ttl_s, config.robots_retry_s, self._fetch_robots)
        self.links = LinkPlanner(config, self.router, self._robots_allows)
        self.pool = gevent.pool.Pool(concurrency)
        hub = gevent.get_hub()

        def sync(fd: int) -> None:
            hub.threadpool.apply(os.fdatasync, (fd,))
        self.writer = PartWriter(config.output, config.crawl_id, shard, sync=sync)
        self.skip_writer = PartWriter(config.output, config.crawl_id, shard, sync=sync, kind="skip")
        self.commit_interval_s = commit_interval_s
        self.commit_batch = commit_batch
        self.max_pending_rows = max(4 * commit_batch, 2 * concurrency)
        self.drain_timeout_s = drain_timeout_s
        self.idle_max_s = idle_max_s
        self.log = log or logs.setup(crawl_id=config.crawl_id, shard=shard, proc="worker")
        self._rand = random.Random()
        self._stopping = gevent.event.Event()
        self._wake = gevent.event.Event()  # set by stop() and by finished fetches
        self._fetched: list[bytes] = []  # tokens whose in-flight slot can be given back
        self._reports: list[HostReport] = []  # host outcomes for the next claim call
        self._commit_wake = gevent.event.Event()
        self._rows: list[dict] = []
        self._skip_rows: list[dict] = []
        self._acks: list[bytes] = []
        self._pushes: dict[int, dict[bytes, PushItem]] = defaultdict(dict)
        self._in_commit = 0  # rows of the commit under way
        self._committing_done = False
        self._held: set[bytes] = set()
        self.pages = 0

    # -- control -------------------------------------------------------------
    def stop(self) -> None:
        """Begin the drain (idempotent; safe from a signal handler)."""
        self._stopping.set()
        self._wake.set()

    def run(self) -> int:
        """Serve until stopped; returns an exit code."""
        ppid = os.getppid()
        committer = gevent.spawn(self._commit_loop)
        beat = gevent.spawn(self._heartbeat_loop, ppid)
        self.log.info("worker_started", concurrency=self.pool.size, pid=os.getpid())
        t_stop = time.monotonic()
        try:
            self._claim_loop()
        finally:
            # one drain budget: in-flight fetches get most of it, the last
            # commit (write, fsync, push, ack) keeps at least 2 s of it
            t_stop = time.monotonic()
            deadline = t_stop + self.drain_timeout_s
            self.pool.join(timeout=max(deadline - time.monotonic() - 2.0, 0.1))
            if len(self.pool):
                self.log.warning("drain_timeout", unfinished=len(self.pool))
                self.pool.kill(block=True, timeout=1)
            self._committing_done = True
            self._commit_wake.set()
            committer.join(timeout=max(deadline - time.monotonic(), 1.0))
            if not committer.dead:
                self.log.warning("drain_commit_unfinished", rows=len(self._rows), acks=len(self._acks))
                committer.kill()
            beat.kill()
            self.writer.close()
            self.skip_writer.close()
            self.session.close()
        self.log.info("worker_stopped", pages=self.pages, drain_s=round(time.monotonic() - t_stop, 3))
        return exitcodes.OK

    # -- claiming ------------------------------------------------------------
    def _claim_loop(self) -> None:
        idle = 0.01
        errors = 0
        while not self._stopping.is_set():
            free = self.pool.free_count()
            if free <= 0:
                self.pool.wait_available(timeout=0.5)
                continue
            if len(self._rows) + len(self._skip_rows) + self._in_commit >= self.max_pending_rows:
                # back-pressure: commits are failing (disk full, Redis
                # down); claim nothing more until rows are durable again
                self._stopping.wait(0.2)
                continue
            fetched, self._fetched = self._fetched, []
            reports, self._reports = self._reports, []
            self._wake.clear()
            try:
                wait, claims = self.frontier.claim(self.shard, free, fetched, reports)
                errors = 0
            except redis.RedisError as exc:
                self._fetched.extend(fetched)  # giving a slot back is idempotent: retry
                self._reports.extend(reports)
                errors += 1
                self.log.error("claim_failed", error=_one_line(exc), consecutive=errors)
                self._stopping.wait(min(0.2 * 2 ** min(errors, 5), 5.0))
                continue
            for c in claims:
                self._held.add(c.token)
                self.pool.spawn(self._process, c)
            if len(claims) == free:
                idle = 0.01
                continue
            if wait < 0:
                delay, idle = idle, min(idle * 2, self.idle_max_s)
            else:
                idle = 0.01
                delay = min(wait, self.idle_max_s)
            # sleep until the next politeness key is due, or until a fetch
            # ends (its slot may unpark a key), or until stopped
            if delay > 0:
                self._wake.wait(delay)
            else:
                gevent.sleep(0)

    # -- one entry -----------------------------------------------------------
    def _process(self, claim: Claim) -> None:
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
            self._wake.set()

    def _give_back(self, claim: Claim, error: str, count: bool = True) -> None:
        self._held.discard(claim.token)
        try:
            self.frontier.nack(self.shard, claim.token, error, count)
        except redis.RedisError as exc:
            # the claim expires and comes back through reclaim
            self.log.error("nack_failed", error=_one_line(exc))

    def _finish(self, claim: Claim, row: dict, pushes: list[Push] = (), skip: bool = False) -> None:
        (self._skip_rows if skip else self._rows).append(row)
        self._acks.append(claim.token)
        for shard, key, item in pushes:
            self._pushes[shard][key] = item
        self.pages += 1
        if len(self._rows) + len(self._skip_rows) >= self.commit_batch:
            self._commit_wake.set()

    def _base_row(self, entry: Entry, claim: Claim, fetched_at: float) -> dict:
        return dict(crawl_id=self.config.crawl_id, url=entry.url, canonical_url=entry.canonical,
                    shard=self.shard, attempt=claim.attempts, depth=entry.depth, referrer=entry.referrer,
                    host=self.router.route(entry.canonical).host, fetched_at=fetched_at, response_ms=0.0,
                    redirect_chain=entry.redirect_chain)

    def _record(self, entry: Entry, claim: Claim, mode: str, skip: bool = True) -> None:
        """A row for a URL that is not fetched, and why."""
        row = make_row(outcome=outcome_of_mode(mode), error=mode, **self._base_row(entry, claim, time.time()))
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
            self._slot_done(claim)
            if pol.record.failures >= cfg.robots_max_failures:
                why = pol.record.error or f"HTTP {pol.record.status}"
                return self._record(entry, claim, f"robots_unreachable: {why}", skip=False)
            # the origin counts as disallowed for now: the URL waits
            self._reports.append(HostReport(route.pkey, "h", cfg.robots_retry_s, "robots.txt unreachable"))
            return self._give_back(claim, "robots.txt unreachable", count=False)
        if not pol.allowed(entry.url):
            self._slot_done(claim)
            return self._record(entry, claim, "robots_disallowed", skip=False)
        if fetched_robots:
            # the robots.txt request took this claim's politeness slot
            wait = self.frontier.reserve(self.shard, route.pkey)
            if wait > 0:
                gevent.sleep(wait)
        res = fetch(self.session, entry.url, cfg)
        self._slot_done(claim)
        report = host_report(route.pkey, res, cfg, self._rand)
        if report is not None:
            self._reports.append(report)
        if retry_url(res, claim.attempts, cfg):
            return self._give_back(claim, res.error or f"HTTP {res.status}")
        row, pushes = self._outcome(entry, claim, res)
        self._finish(claim, row, pushes)

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
                canon = self.router.canonical(sm)
                if canon is not None:
                    p = self.links.plan(sm, canon, 0, origin + "/robots.txt", kind="sitemap")
                    if p is not None:
                        pushes.append(p)
            by_shard: dict[int, list[PushItem]] = defaultdict(list)
            for shard, _, item in pushes:
                by_shard[shard].append(item)
            for shard, items in by_shard.items():
                self.frontier.push(shard, items)

    def _fetch_robots(self, url: str):
        res = fetch(self.session, url, self.config, allow_redirects=True, max_bytes=MAX_ROBOTS_BYTES)
        body = res.body.decode("utf-8", errors="replace") if res.status and 200 <= res.status < 300 else ""
        return res.status, body, res.error, res.error_kind

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
            directives = robots_directives(page.meta_robots, common["x_robots_tag"], self.agent)
            nofollow_all = cfg.honour_robots_meta and "nofollow" in directives
            outlinks, pushes = self.links.page_links(entry.url, base, page.hrefs, page.nofollow,
                                                     entry.depth, nofollow_all)
            canonical_link = resolve(base, page.canonical_link) if page.canonical_link else None
            return make_row(outcome="fetched", title=page.title, meta_robots=page.meta_robots,
                            canonical_link=canonical_link, outlinks=outlinks, **common), pushes
        return make_row(outcome="fetched", **common), []

    def _redirect(self, entry: Entry, res: FetchResult, common: dict) -> tuple[dict, list[Push]]:
        location = res.headers["location"]
        target = resolve(entry.url, location)
        canon = self.router.canonical(target) if target else None
        if canon is None:
            common["error"] = f"bad_redirect: Location {location[:200]!r}"
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
        child_kind = "sitemap" if sm.kind == "sitemapindex" else "page"
        for loc in sm.locs:
            canon = self.router.canonical(loc)
            if canon is None:
                continue
            listed.append(canon)
            p = self.links.plan(loc, canon, 0, entry.url, kind=child_kind)
            if p is not None:
                pushes.append(p)
        if sm.error:
            common["error"] = common["error"] or f"sitemap: {sm.error}"
        return make_row(outcome="fetched", outlinks=listed, **common), pushes

    # -- group commit ----------------------------------------------------------
    def _commit_loop(self) -> None:
        while True:
            self._commit_wake.wait(timeout=self.commit_interval_s)
            self._commit_wake.clear()
            done = self._committing_done
            self._commit()
            if done and not self._rows and not self._skip_rows and not self._acks:
                return

    def _commit(self) -> None:
        rows, skip_rows, acks, pushes = self._rows, self._skip_rows, self._acks, self._pushes
        if not rows and not skip_rows and not acks and not pushes:
            return
        self._rows, self._skip_rows, self._acks, self._pushes = [], [], [], defaultdict(dict)
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
                self.frontier.commit({s: list(items.values()) for s, items in pushes.items()},
                                     {self.shard: acks})
                break
            except (redis.RedisError, OSError) as exc:
                errors += 1
                self.log.error("commit_failed", error=_one_line(exc), consecutive=errors)
                gevent.sleep(min(0.2 * 2 ** min(errors, 5), 5.0))
        self._in_commit = 0
        for t in acks:
            self._held.discard(t)
        for items in pushes.values():
            self.links.remember(items.keys())

    # -- heartbeat -------------------------------------------------------------
    def _heartbeat_loop(self, ppid: int) -> None:
        interval = max(self.config.visibility_timeout_s / 3.0, 0.2)
        last = time.monotonic()
        while True:
            gevent.sleep(min(interval, 1.0))
            if os.getppid() != ppid:
                self.log.warning("parent_died", old_ppid=ppid)
                self.stop()
            if time.monotonic() - last < interval:
                continue
            last = time.monotonic()
            held = list(self._held)
            if held:
                try:
                    self.frontier.extend(self.shard, held)
                except redis.RedisError as exc:
                    self.log.error("heartbeat_failed", error=_one_line(exc))


def _one_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _attempts_note(error: str | None, claim: Claim) -> str | None:
    if claim.attempts <= 1:
        return error
    return f"{error or 'failed'} (gave up after {claim.attempts} attempts)"


def main(argv: list[str] | None = None) -> int:
    """Entry point of a worker process; returns its exit code."""
    p = Parser(prog="crawld-worker", description="Serve one shard of a crawl (started by crawld).")
    p.add_argument("--crawl-id", type=crawl_id_arg, required=True)
    p.add_argument("--shard", type=int_range(0, 4095), required=True)
    p.add_argument("--redis-url", default=None, help="default: $REDIS_URL")
    p.add_argument("--concurrency", type=int_range(1, 1000), default=os.environ.get("NUM_WORKERS", "32"),
                   help="concurrent fetches (default: $NUM_WORKERS or 32)")
    p.add_argument("--proxy", type=proxy_url, default=os.environ.get("CRAWLD_PROXY") or None)
    p.add_argument("--drain-timeout", type=positive_float, default=30.0)
    args = p.parse_args(argv)
    log = logs.setup(crawl_id=args.crawl_id, shard=args.shard, proc="worker")
    url = redis_url(args.redis_url)
    if not url:
        log.error("boot_failed", error="REDIS_URL is not set")
        return exitcodes.CONFIG
    try:
        client = connect(url, max_connections=8)
        check(client, url)
        config = load_crawl(client, args.crawl_id)
        worker = Worker(client, config, args.shard, concurrency=args.concurrency, proxy=args.proxy,
                        drain_timeout_s=args.drain_timeout, log=log)
    except RedisUnfit as exc:
        log.error("boot_failed", error=str(exc))
        return exitcodes.UNAVAILABLE
    except ConfigError as exc:
        log.error("boot_failed", error=str(exc))
        return exitcodes.CONFIG
    except OSError as exc:
        log.error("boot_failed", error=f"output: {exc}")
        return exitcodes.CANTCREAT
    for sig in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(sig, worker.stop)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
