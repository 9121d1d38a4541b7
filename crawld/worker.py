"""The shard worker: one process serving one shard of every active crawl.

Run as ``python -m crawld.worker --shard N [--crawl-id ID ...]`` (the
supervisor does).  The process is gevent monkey-patched before anything
else is imported, then runs these greenlets:

* discovery: every few seconds, the crawls to serve (``--crawl-id``, or
  every crawl registered in Redis whose shard count covers this shard),
  each as a :class:`crawld.crawlshard.CrawlShard`;
* leases: take and renew this shard's lease of each crawl (SET NX with a
  time to live, fenced: the claim script refuses a worker whose token does
  not hold the lease); a crawl leased by another machine is served by it,
  this worker stands by and takes over when that lease lapses;
* the claimer: shares the free slots of one greenlet pool fairly among the
  leased crawls with work (each gets an equal share per round, so a large
  crawl cannot starve a small one), and spawns a greenlet per claimed
  entry; a crawl with nothing due sleeps until its next politeness key is
  due (the claim script says when), or backs off to ``idle_max_s``;
* the committer, every ``commit_interval_s`` or ``commit_batch`` rows,
  writes each crawl's rows to its NDJSON parts and fdatasyncs them, then
  pushes the links and acks the tokens in one pipelined round trip (group
  commit: an ack always follows the durable row and the pushes of its page);
* the heartbeat extends the visibility deadline of every claim still held,
  and stops the worker if its supervisor died;
* control, every second: each served crawl's state (``crawlctl pause``:
  claim nothing for it; ``resume``; ``cancel`` or ``purge``: finish and
  commit what is held, then stop serving it), and every two seconds Redis
  ``INFO memory``: above a crawl's ``memory_high_watermark`` of maxmemory,
  its new links are recorded as rows instead of pushed (back-pressure).

SIGTERM or SIGINT drains: stop claiming, let in-flight fetches finish
(within ``drain_timeout_s``), commit, close the parts, give the leases up,
exit 0.  Fetches cut off by the drain timeout are not acked; their claims
come back through reclaim after the visibility timeout.
"""

if __name__ == "__main__":  # patch before requests, redis or ssl are imported
    from gevent import monkey

    monkey.patch_all()

import os
import signal
import socket
import sys
import time
import uuid

import gevent
import gevent.event
import gevent.pool
import redis

from . import exitcodes, keys, logs, metrics
from .cliargs import Parser, crawl_id_arg, int_range, positive_float, proxy_url
from .config import ConfigError, CrawlConfig
from .crawlshard import CrawlShard
from .frontier import LeaseLost
from .politeness import SendPacer
from .storage import PartShipper
from .redisconn import RedisUnfit, check, connect, primaries_info, redis_url
from .redisconn import ERRORS as REDIS_ERRORS


def default_lease_token() -> str:
    """A token naming this machine and process: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Worker:
    """Serves ``shard`` of the crawls ``crawl_ids`` (None: every registered
    crawl) until :meth:`stop`.

    ``concurrency`` is the number of entry greenlets (concurrent requests),
    shared by all crawls; ``proxy`` an HTTP proxy URL for every request;
    ``lease_token`` the token this worker holds leases with (the supervisor
    passes the same one to a restarted worker, so it resumes its leases at
    once).  Times are seconds.
    """

    def __init__(self, client: redis.Redis, shard: int, *, crawl_ids: list[str] | None = None,
                 concurrency: int = 32, proxy: str | None = None, lease_token: str | None = None,
                 lease_ttl_s: float = 15.0, commit_interval_s: float = 0.2, commit_batch: int = 256,
                 drain_timeout_s: float = 30.0, idle_max_s: float = 0.5, discover_every_s: float = 2.0,
                 log=None):
        self.client = client
        self.shard = shard
        self.crawl_ids = crawl_ids
        self.concurrency = concurrency
        self.proxy = proxy
        self.lease_token = lease_token or default_lease_token()
        self.lease_ttl_s = lease_ttl_s
        self.commit_interval_s = commit_interval_s
        self.commit_batch = commit_batch
        self.max_pending_rows = max(4 * commit_batch, 2 * concurrency)
        self.drain_timeout_s = drain_timeout_s
        self.idle_max_s = idle_max_s
        self.discover_every_s = discover_every_s
        self.log = log or logs.setup(shard=shard, proc="worker")
        self.pool = gevent.pool.Pool(concurrency)
        self.crawls: dict[str, CrawlShard] = {}
        self._rr = 0  # round-robin start
        self._stopping = gevent.event.Event()
        self._wake = gevent.event.Event()  # set by stop() and by finished fetches
        self._commit_wake = gevent.event.Event()
        self._committing_done = False
        self.draining = False  # crawlctl drain: hold no claims, no leases
        self._unservable: dict[str, float] = {}  # crawl id -> when its failure was last logged
        self._retiring: set[str] = set()  # cancelled crawls being finished off
        self._memory: tuple[int, int] | None = None  # last (used_memory, maxmemory)
        hub = gevent.get_hub()
        self._sync = lambda fd: hub.threadpool.apply(os.fdatasync, (fd,))
        # closed parts of s3:// outputs, uploaded in the background
        self.shipper = PartShipper(self.log)
        self.pacer = SendPacer()  # every crawl's sends, per registered domain

    @property
    def pages(self) -> int:
        return sum(c.pages for c in self.crawls.values())

    # -- control -------------------------------------------------------------
    def stop(self) -> None:
        """Begin the drain (idempotent; safe from a signal handler)."""
        self._stopping.set()
        self._wake.set()

    def run(self) -> int:
        """Serve until stopped; returns an exit code."""
        ppid = os.getppid()
        self.discover()
        self.renew_leases()
        self.check_drain()
        try:
            self.check_memory()
        except REDIS_ERRORS as exc:
            self.log.error("check_memory_failed", error=_one_line(exc))
        loops = [gevent.spawn(self._every, self.discover_every_s, self.discover),
                 gevent.spawn(self._every, self.lease_ttl_s / 3.0, self.renew_leases),
                 gevent.spawn(self._every, 1.0, self.check_drain),
                 gevent.spawn(self._every, 1.0, self.check_crawls),
                 gevent.spawn(self._every, 2.0, self.check_memory)]
        committer = gevent.spawn(self._commit_loop)
        beat = gevent.spawn(self._heartbeat_loop, ppid)
        shipping = gevent.spawn(self.shipper.run)
        self.log.info("worker_started", concurrency=self.pool.size, pid=os.getpid(), crawls=sorted(self.crawls))
        t_stop = time.monotonic()
        try:
            self._claim_loop()
        finally:
            # one drain budget: in-flight fetches get most of it, the last
            # commit (write, fsync, push, ack) keeps at least 2 s of it
            t_stop = time.monotonic()
            deadline = t_stop + self.drain_timeout_s
            for g in loops:
                g.kill()
            self.pool.join(timeout=max(deadline - time.monotonic() - 2.0, 0.1))
            if len(self.pool):
                self.log.warning("drain_timeout", unfinished=len(self.pool))
                self.pool.kill(block=True, timeout=1)
            self._committing_done = True
            self._commit_wake.set()
            committer.join(timeout=max(deadline - time.monotonic(), 1.0))
            if not committer.dead:
                self.log.warning("drain_commit_unfinished",
                                 crawls=[c.crawl_id for c in self.crawls.values() if c.has_uncommitted()])
                committer.kill()
            beat.kill()
            for c in list(self.crawls.values()):
                c.close()
            # ship the parts just closed; what is left stays in the spool
            # and is shipped at the next start
            if not self.shipper.flush(max(deadline - time.monotonic(), 3.0)):
                self.log.warning("parts_left_in_spool", parts=self.shipper.pending(),
                                 action="shipped at the next start")
            shipping.kill()
        drain_s = time.monotonic() - t_stop
        metrics.DRAIN_SECONDS.labels(str(self.shard)).observe(drain_s)
        self.log.info("worker_stopped", pages=self.pages, drain_s=round(drain_s, 3))
        return exitcodes.OK

    def _every(self, interval_s: float, fn) -> None:
        while True:
            gevent.sleep(interval_s)
            try:
                fn()
            except REDIS_ERRORS as exc:
                self.log.error(f"{fn.__name__}_failed", error=_one_line(exc))
            except Exception as exc:  # noqa: BLE001 - a periodic task must outlive any one failure
                self.log.error(f"{fn.__name__}_failed", error=f"{type(exc).__name__}: {_one_line(exc)}")

    # -- crawls and leases -------------------------------------------------------
    def discover(self) -> None:
        """Start serving crawls that appeared (and cover this shard)."""
        ids = self.crawl_ids
        if ids is None:
            ids = sorted(x.decode() for x in self.client.smembers(keys.CRAWLS))
        for cid in ids:
            if cid in self.crawls or cid in self._retiring:
                continue
            # the epoch first: a rebalance stores the config before it
            # increments the epoch, so the config read is at least as new
            epoch, raw, state = self.client.pipeline(transaction=False).get(keys.crawl_epoch(cid)).get(
                keys.crawl_config(cid)).get(keys.crawl_state(cid)).execute()
            if raw is None or state in (b"cancelled", b"rebalancing"):
                continue
            try:
                config = CrawlConfig.from_json(raw)
            except ConfigError as exc:
                self.log.error("bad_crawl_config", crawl_id=cid, error=str(exc))
                continue
            if self.shard >= config.num_shards:
                continue
            try:
                self.crawls[cid] = CrawlShard(
                    self.client, config, self.shard, concurrency=self.concurrency, proxy=self.proxy,
                    lease_token=self.lease_token, sync=self._sync, wake=self._wake.set,
                    commit_batch=self.commit_batch, log=self.log.bind(crawl_id=cid), shipper=self.shipper,
                    epoch=int(epoch or 0), pacer=self.pacer)
            except OSError as exc:
                # one crawl's unwritable output must not keep the others from being served
                now = time.monotonic()
                if now - self._unservable.get(cid, -1e9) >= 60.0:
                    self._unservable[cid] = now
                    self.log.error("crawl_not_served", crawl_id=cid, output=config.output,
                                   error=f"{exc.filename or ''}: {exc.strerror or exc}",
                                   action="retrying every few seconds")
                continue
            if state:
                self.crawls[cid].set_state(state.decode())
            if self._memory:
                self.crawls[cid].observe_memory(*self._memory)
            self.log.info("crawl_served", crawl_id=cid, num_shards=config.num_shards,
                          state=self.crawls[cid].state)

    def renew_leases(self) -> None:
        """Take or renew the lease of every served crawl's shard."""
        if self._stopping.is_set() or self.draining:
            return
        for c in list(self.crawls.values()):
            if c.renew_lease(self.lease_ttl_s):
                self._wake.set()

    def check_drain(self) -> None:
        """Follow ``crawlctl drain``: when this shard (or "all") is in
        :data:`crawld.keys.DRAIN`, stop claiming, finish and commit what is
        held, give the leases up and wait; resume when it is removed."""
        wanted = any(self.client.hmget(keys.DRAIN, "all", str(self.shard)))
        if wanted and not self.draining:
            self.draining = True
            self.log.info("drain_requested", in_flight=len(self.pool))
            gevent.spawn(self._drain_out)
        elif not wanted and self.draining:
            self.draining = False
            self.log.info("drain_cancelled", action="serving again")
            self.renew_leases()
            self._wake.set()

    def check_crawls(self) -> None:
        """Follow ``crawlctl pause|resume|cancel|purge`` through each served
        crawl's :func:`crawld.keys.crawl_state` (one pipelined read): a
        paused crawl is not claimed from; a cancelled one (or one whose
        config is gone: purged) is finished off and no longer served; so is
        a rebalancing one (``crawlctl rebalance``: its lease is given up
        once nothing is held), or one whose lease was refused because a
        rebalance moved the shard (``stale``): :meth:`discover` serves it
        again with its new config once it is active."""
        served = [c for c in self.crawls.values() if c.crawl_id not in self._retiring]
        if not served:
            return
        pipe = self.client.pipeline(transaction=False)
        for c in served:
            pipe.get(keys.crawl_state(c.crawl_id)).exists(keys.crawl_config(c.crawl_id)).get(
                keys.crawl_epoch(c.crawl_id)).scard(keys.crawl_scope(c.crawl_id))
        res = pipe.execute()
        for i, c in enumerate(served):
            state, exists, epoch, scope = res[4 * i], res[4 * i + 1], res[4 * i + 2], res[4 * i + 3]
            c.reload_scope(int(scope or 0))
            state = "cancelled" if not exists else (state.decode() if state else "active")
            if c.epoch is not None and int(epoch or 0) != c.epoch:
                c.stale = True  # rebalanced meanwhile: serve it again with its new config
            if c.set_state(state) and state == "active":
                self._wake.set()
            if c.state in ("cancelled", "rebalancing") or c.stale:
                self._retiring.add(c.crawl_id)
                gevent.spawn(self._retire, c)

    def _retire(self, c: CrawlShard) -> None:
        """Stop serving a cancelled crawl once its fetches in flight are
        done and committed: close its parts, give its lease up."""
        t0 = time.monotonic()
        while not c.quiet():
            if self._stopping.is_set():
                return  # the worker's own drain closes it
            self._commit_wake.set()
            gevent.sleep(0.05)
        if self._stopping.is_set() or self.crawls.get(c.crawl_id) is not c:
            return
        del self.crawls[c.crawl_id]
        c.close()
        self._retiring.discard(c.crawl_id)
        why = c.state if c.state != "active" else "rebalanced"
        c.log.info("crawl_retired", pages=c.pages, drain_s=round(time.monotonic() - t0, 3),
                   action=f"no longer served ({why})")

    def check_memory(self) -> None:
        """Read Redis ``INFO memory`` and let every served crawl turn its
        back-pressure on or off (each against its own watermark)."""
        if not self.crawls:
            return
        self._memory = memory_reading(primaries_info(self.client, "memory"))
        for c in list(self.crawls.values()):
            c.observe_memory(*self._memory)

    def _drain_out(self) -> None:
        t0 = time.monotonic()
        self.pool.join()
        while self.draining and any(c.has_uncommitted() or c.pending_rows() for c in self.crawls.values()):
            self._commit_wake.set()
            gevent.sleep(0.05)
        if not self.draining or self._stopping.is_set():
            return
        for c in self.crawls.values():
            if c.leased:
                c.release_lease()
        self.log.info("drained", drain_s=round(time.monotonic() - t0, 3), action="waiting for the drain to be cancelled")

    # -- claiming ------------------------------------------------------------
    def _claim_loop(self) -> None:
        while not self._stopping.is_set():
            free = self.pool.free_count()
            if free <= 0:
                self.pool.wait_available(timeout=0.5)
                continue
            now = time.monotonic()
            ready = [] if self.draining else [
                c for c in self.crawls.values()
                if c.claimable and c.next_claim <= now and c.pending_rows() < self.max_pending_rows]
            if not ready:
                later = [c.next_claim for c in self.crawls.values() if c.claimable]
                delay = min([self.idle_max_s, *(t - now for t in later)])
                self._wake.clear()
                self._wake.wait(max(delay, 0.001))
                continue
            self._wake.clear()
            self._rr = (self._rr + 1) % len(ready)
            ready = ready[self._rr:] + ready[:self._rr]
            share = max(1, free // len(ready))
            for c in ready:
                n = min(share, self.pool.free_count())
                if n <= 0:
                    break
                self._claim_from(c, n)

    def _claim_from(self, c: CrawlShard, n: int) -> None:
        now = time.monotonic()
        try:
            wait, claims = c.claim(n)
        except LeaseLost:
            c.log.warning("lease_lost", action="stopped claiming")
            return
        except REDIS_ERRORS as exc:
            c.idle = min(max(c.idle * 2, 0.2), 5.0)
            c.next_claim = now + c.idle
            c.log.error("claim_failed", error=_one_line(exc), retry_in_s=round(c.idle, 2))
            return
        for claim in claims:
            self.pool.spawn(c.process, claim)
        if len(claims) == n:
            c.idle, c.next_claim = 0.01, now
        elif wait >= 0:
            c.idle, c.next_claim = 0.01, now + min(wait, self.idle_max_s)
        else:
            c.next_claim = now + c.idle
            c.idle = min(c.idle * 2, self.idle_max_s)

    # -- group commit ----------------------------------------------------------
    def _commit_loop(self) -> None:
        while True:
            self._commit_wake.wait(timeout=self.commit_interval_s)
            self._commit_wake.clear()
            done = self._committing_done
            for c in list(self.crawls.values()):
                c.commit_wanted = False
                c.commit()
                c.rotate_parts()  # by age, even when idle (here: never during a write)
            if done and not any(c.has_uncommitted() for c in self.crawls.values()):
                return

    # -- heartbeat -------------------------------------------------------------
    def _heartbeat_loop(self, ppid: int) -> None:
        last = time.monotonic()
        while True:
            gevent.sleep(0.2)
            if any(c.commit_wanted for c in self.crawls.values()):
                self._commit_wake.set()
            if os.getppid() != ppid:
                self.log.warning("parent_died", old_ppid=ppid)
                self.stop()
            vt = min([c.config.visibility_timeout_s for c in self.crawls.values()] or [30.0])
            if time.monotonic() - last < max(vt / 3.0, 0.2):
                continue
            last = time.monotonic()
            for c in list(self.crawls.values()):
                try:
                    c.extend_claims()
                except REDIS_ERRORS as exc:
                    c.log.error("heartbeat_failed", error=_one_line(exc))


def memory_reading(info: dict) -> tuple[int, int]:
    """``(used_memory, maxmemory)`` from ``INFO memory``; for a cluster
    client's per-node answer, those of the node nearest its maxmemory."""
    if "used_memory" in info or not info:
        return int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
    nodes = [(int(v.get("used_memory", 0)), int(v.get("maxmemory", 0)))
             for v in info.values() if isinstance(v, dict)]
    return max(nodes, key=lambda um: um[0] / um[1] if um[1] else 0.0, default=(0, 0))


def _one_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """Entry point of a worker process; returns its exit code."""
    p = Parser(prog="crawld-worker", description="Serve one shard of every active crawl (started by crawld).")
    p.add_argument("--crawl-id", type=crawl_id_arg, action="append",
                   help="serve only this crawl (repeatable; default: every crawl in Redis)")
    p.add_argument("--shard", type=int_range(0, 4095), required=True)
    p.add_argument("--redis-url", default=None, help="default: $REDIS_URL")
    p.add_argument("--concurrency", type=int_range(1, 1000), default=os.environ.get("NUM_WORKERS", "32"),
                   help="concurrent fetches (default: $NUM_WORKERS or 32)")
    p.add_argument("--proxy", type=proxy_url, default=os.environ.get("CRAWLD_PROXY") or None)
    p.add_argument("--drain-timeout", type=positive_float, default=30.0)
    p.add_argument("--lease-ttl", type=positive_float, default=os.environ.get("LEASE_TTL_S", "15"),
                   help="seconds a shard lease lives unless renewed (default $LEASE_TTL_S or 15)")
    args = p.parse_args(argv)
    log = logs.setup(shard=args.shard, proc="worker")
    url = redis_url(args.redis_url)
    if not url:
        log.error("boot_failed", error="REDIS_URL is not set")
        return exitcodes.CONFIG
    try:
        client = connect(url, max_connections=16)
        check(client, url)
        worker = Worker(client, args.shard, crawl_ids=args.crawl_id, concurrency=args.concurrency,
                        proxy=args.proxy, lease_token=os.environ.get("CRAWLD_LEASE_TOKEN") or None,
                        lease_ttl_s=args.lease_ttl, drain_timeout_s=args.drain_timeout, log=log)
        worker.discover()
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
