"""The shard worker: one process serving one shard of one crawl.

Run as ``python -m crawld.worker --crawl-id ID --shard N`` (the supervisor
does).  The process is gevent monkey-patched before anything else is
imported, then runs three kinds of greenlet:

* the claimer asks the frontier for as many due entries as the pool has free
  slots (one Lua call) and spawns a fetch greenlet per entry; when nothing
  is due it sleeps until the next politeness key is due (the claim script
  says when) or, when the shard is empty, backs off to ``idle_max_s``;
* fetch greenlets fetch, parse, and queue a row, the links to push (grouped
  by owning shard) and the claim token to ack;
* the committer, every ``commit_interval_s`` or ``commit_batch`` rows,
  writes the rows to the shard's NDJSON part and fdatasyncs it, then pushes
  the links and acks the tokens in one pipelined round trip (group commit:
  an ack always follows the durable row and the pushes of its page);
* the heartbeat extends the visibility deadline of every claim still held.

SIGTERM or SIGINT drains: stop claiming, let in-flight fetches finish
(within ``drain_timeout_s``), commit, close the part, exit 0.  Fetches cut
off by the drain timeout are not acked; their claims come back through
reclaim after the visibility timeout.
"""

if __name__ == "__main__":  # patch before requests, redis or ssl are imported
    from gevent import monkey

    monkey.patch_all()

import os
import signal
import sys
import time
from collections import defaultdict

import gevent
import gevent.event
import gevent.pool
import redis

from . import exitcodes, logs
from .cliargs import Parser, crawl_id_arg, int_range, positive_float, proxy_url
from .config import ConfigError, CrawlConfig
from .crawls import load_crawl
from .extract import HTML_TYPES, parse_content_type, parse_html
from .fetcher import FetchResult, fetch, make_session
from .frontier import Claim, Entry, Frontier
from .output import PartWriter
from .redisconn import RedisUnfit, check, connect, redis_url
from .rows import REDIRECT_STATUSES, make_row
from .scope import Router
from .urls import fingerprint, resolve


class Worker:
    """Serves ``shard`` of the crawl ``config`` until :meth:`stop`.

    ``concurrency`` is the number of fetch greenlets (concurrent requests);
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
        self.pool = gevent.pool.Pool(concurrency)
        hub = gevent.get_hub()
        self.writer = PartWriter(config.output, config.crawl_id, shard,
                                 sync=lambda fd: hub.threadpool.apply(os.fdatasync, (fd,)))
        self.commit_interval_s = commit_interval_s
        self.commit_batch = commit_batch
        self.max_pending_rows = max(4 * commit_batch, 2 * concurrency)
        self._in_commit = 0  # rows of the commit under way
        self.drain_timeout_s = drain_timeout_s
        self.idle_max_s = idle_max_s
        self.log = log or logs.setup(crawl_id=config.crawl_id, shard=shard, proc="worker")
        self._stopping = gevent.event.Event()
        self._wake = gevent.event.Event()  # set by stop() and by finished fetches
        self._fetched: list[bytes] = []  # tokens whose in-flight slot can be given back
        self._commit_wake = gevent.event.Event()
        self._rows: list[dict] = []
        self._acks: list[bytes] = []
        self._pushes: dict[int, dict[bytes, tuple[bytes, str, bytes]]] = defaultdict(dict)
        self._held: set[bytes] = set()
        self._pushed: set[bytes] = set()  # fingerprints this worker pushed (they are in 'seen')
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
        t_stop = None
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
            if len(self._rows) + self._in_commit >= self.max_pending_rows:
                # back-pressure: commits are failing (disk full, Redis
                # down); claim nothing more until rows are durable again
                self._stopping.wait(0.2)
                continue
            fetched, self._fetched = self._fetched, []
            self._wake.clear()
            try:
                wait, claims = self.frontier.claim(self.shard, free, fetched)
                errors = 0
            except redis.RedisError as exc:
                self._fetched.extend(fetched)  # giving a slot back is idempotent: retry
                errors += 1
                self.log.error("claim_failed", error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                               consecutive=errors)
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

    # -- one URL -------------------------------------------------------------
    def _process(self, claim: Claim) -> None:
        try:
            entry = Entry.from_payload(claim.payload)
        except (ValueError, KeyError, TypeError) as exc:
            self._give_back(claim, 0.0, f"bad_entry: {exc}")
            return
        try:
            res = fetch(self.session, entry.url, self.config)
            self._fetched.append(claim.token)
            self._wake.set()
            if res.status is None and res.retryable and claim.attempts < self.config.max_attempts:
                self._give_back(claim, self.config.retry_delay_s, res.error or "retryable error")
                return
            row, pushes = self._outcome(entry, claim, res)
        except Exception as exc:  # noqa: BLE001 - a page must never kill the worker
            self.log.exception("process_failed", url=entry.url)
            self._give_back(claim, self.config.retry_delay_s, f"internal: {type(exc).__name__}: {exc}")
            return
        self._rows.append(row)
        self._acks.append(claim.token)
        for shard, fp, item in pushes:
            self._pushes[shard][fp] = item
        self.pages += 1
        if len(self._rows) >= self.commit_batch:
            self._commit_wake.set()

    def _give_back(self, claim: Claim, delay_s: float, error: str) -> None:
        self._held.discard(claim.token)
        try:
            self.frontier.nack(self.shard, claim.token, delay_s, error)
        except redis.RedisError as exc:
            # the claim expires and comes back through reclaim
            self.log.error("nack_failed", error=str(exc))

    def _outcome(self, entry: Entry, claim: Claim, res: FetchResult) -> tuple[dict, list]:
        cfg = self.config
        route = self.router.route(entry.canonical)
        mime, charset = parse_content_type(res.headers.get("content-type"))
        common = dict(crawl_id=cfg.crawl_id, url=entry.url, canonical_url=entry.canonical, shard=self.shard,
                      attempt=claim.attempts, depth=entry.depth, referrer=entry.referrer, host=route.host,
                      fetched_at=res.started_at, response_ms=res.elapsed_ms,
                      redirect_chain=entry.redirect_chain)
        pushes: list = []
        if res.status is None:
            return make_row(outcome="error", error=res.error, **common), pushes
        common.update(status=res.status, content_type=mime, content_length=len(res.body),
                      truncated=res.truncated, error=res.error)
        if res.status in REDIRECT_STATUSES and res.headers.get("location"):
            return self._redirect(entry, res, common, pushes), pushes
        if mime in HTML_TYPES and 200 <= res.status < 300 and res.body:
            page = parse_html(res.body, charset)
            base = entry.url
            if page.base_href:
                base = resolve(entry.url, page.base_href) or entry.url
            outlinks = []
            next_depth = entry.depth + 1
            follow = next_depth <= cfg.max_depth
            router = self.router
            seen_here = set()
            for href in page.hrefs:
                absolute = resolve(base, href)
                if absolute is None:
                    continue
                canon = router.canonical(absolute)
                if canon is None or canon in seen_here:
                    continue
                seen_here.add(canon)
                outlinks.append(canon)
                if not follow:
                    continue
                r = router.route(canon)
                if not r.in_scope:
                    continue
                fp = fingerprint(canon)
                if fp in self._pushed:
                    continue
                payload = Entry(absolute, canon, next_depth, entry.url).to_payload()
                pushes.append((r.shard, fp, (fp, r.pkey, payload)))
            canonical_link = resolve(base, page.canonical_link) if page.canonical_link else None
            return make_row(outcome="fetched", title=page.title, meta_robots=page.meta_robots,
                            canonical_link=canonical_link, outlinks=outlinks, **common), pushes
        return make_row(outcome="fetched", **common), pushes

    def _redirect(self, entry: Entry, res: FetchResult, common: dict, pushes: list) -> dict:
        target = resolve(entry.url, res.headers["location"])
        canon = self.router.canonical(target) if target else None
        if canon is None:
            return make_row(outcome="error", error=f"bad_redirect: Location {res.headers['location'][:200]!r}",
                            **common)
        chain = entry.redirect_chain + (entry.url,)
        if len(chain) > self.config.max_redirects:
            return make_row(outcome="error", final_url=target,
                            error=f"too_many_redirects: more than {self.config.max_redirects}", **common)
        r = self.router.route(canon)
        if r.in_scope:
            fp = fingerprint(canon)
            payload = Entry(target, canon, entry.depth, entry.referrer, chain).to_payload()
            pushes.append((r.shard, fp, (fp, r.pkey, payload)))
        return make_row(outcome="redirect", final_url=target, **common)

    # -- group commit ----------------------------------------------------------
    _committing_done = False

    def _commit_loop(self) -> None:
        while True:
            self._commit_wake.wait(timeout=self.commit_interval_s)
            self._commit_wake.clear()
            done = self._committing_done
            self._commit()
            if done and not self._rows and not self._acks:
                return

    def _commit(self) -> None:
        rows, acks, pushes = self._rows, self._acks, self._pushes
        if not rows and not acks and not pushes:
            return
        self._rows, self._acks, self._pushes = [], [], defaultdict(dict)
        self._in_commit = len(rows)
        errors = 0
        while True:
            try:
                if rows:
                    self.writer.write(rows)
                    rows = []
                self.frontier.commit({s: list(items.values()) for s, items in pushes.items()},
                                     {self.shard: acks})
                break
            except (redis.RedisError, OSError) as exc:
                errors += 1
                self.log.error("commit_failed", error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                               consecutive=errors)
                gevent.sleep(min(0.2 * 2 ** min(errors, 5), 5.0))
        self._in_commit = 0
        for t in acks:
            self._held.discard(t)
        if len(self._pushed) > 500_000:
            self._pushed.clear()
        for items in pushes.values():
            self._pushed.update(items.keys())

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
                    self.log.error("heartbeat_failed", error=str(exc))


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
