"""The reclaim loop: return expired claims to their queues.

Run as ``python -m crawld.reclaim [--crawl-id ID ...]`` (the supervisor runs
one per machine).  Every ``interval`` seconds (default: a quarter of the
crawl's visibility timeout, at most 5 s) it runs the reclaim script on every
shard of every served crawl.  Several reclaimers may run against one Redis:
the script is atomic, so each expired claim is returned exactly once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import redis

from . import exitcodes, keys, logs, metrics
from .cliargs import Parser, crawl_id_arg, positive_float
from .config import ConfigError, CrawlConfig
from .frontier import Frontier
from .redisconn import RedisUnfit, check, connect, redis_url
from .redisconn import ERRORS as REDIS_ERRORS


def reclaim_pass(frontier: Frontier, limit: int = 1000) -> tuple[int, int]:
    """One pass over every shard of a crawl; ``(requeued, dead_lettered)``."""
    requeued = dead = 0
    cid = frontier.config.crawl_id
    for shard in range(frontier.config.num_shards):
        while True:
            r, d = frontier.reclaim(shard, limit)
            requeued += r
            dead += d
            if r:
                metrics.RECLAIMS.labels(cid, str(shard)).inc(r)
            if d:
                metrics.DEAD_LETTERS.labels(cid, str(shard)).inc(d)
            if r + d < limit:
                break
    return requeued, dead


def served_crawls(client: redis.Redis, only: list[str] | None) -> list[str]:
    """The crawl ids to serve: ``only``, or every crawl registered in Redis."""
    if only:
        return only
    return sorted(x.decode() for x in client.smembers(keys.CRAWLS))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the reclaim process; returns its exit code."""
    p = Parser(prog="crawld-reclaim", description="Return expired claims to the frontier.")
    p.add_argument("--crawl-id", type=crawl_id_arg, action="append", help="crawl to serve (repeatable; default: all)")
    p.add_argument("--redis-url", default=None, help="default: $REDIS_URL")
    p.add_argument("--interval", type=positive_float, default=None, help="seconds between passes")
    p.add_argument("--once", action="store_true", help="run one pass and exit")
    args = p.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log = logs.setup(proc="reclaim")
    url = redis_url(args.redis_url)
    if not url:
        log.error("boot_failed", error="REDIS_URL is not set")
        return exitcodes.CONFIG
    try:
        client = connect(url, max_connections=4)
        check(client, url)
    except RedisUnfit as exc:
        log.error("boot_failed", error=str(exc))
        return exitcodes.UNAVAILABLE
    frontiers: dict[str, Frontier] = {}
    ppid = os.getppid()
    while True:
        if os.getppid() != ppid:
            log.warning("parent_died", old_ppid=ppid)
            return exitcodes.OK
        interval = args.interval or 5.0
        try:
            for cid in served_crawls(client, args.crawl_id):
                # read every pass: crawlctl rebalance changes num_shards
                raw = client.get(keys.crawl_config(cid))
                if raw is None:
                    continue
                config = CrawlConfig.from_json(raw)
                f = frontiers.get(cid)
                if f is None or f.config.num_shards != config.num_shards:
                    f = frontiers[cid] = Frontier(client, config)
                if args.interval is None:
                    interval = min(interval, max(f.config.visibility_timeout_s / 4.0, 0.1))
                requeued, dead = reclaim_pass(f)
                if requeued or dead:
                    log.info("reclaimed", crawl_id=cid, requeued=requeued, dead_lettered=dead)
        except ConfigError as exc:
            log.error("bad_config", error=str(exc))
        except REDIS_ERRORS as exc:
            log.error("reclaim_failed", error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        if args.once or stop.wait(interval):
            return exitcodes.OK


if __name__ == "__main__":
    sys.exit(main())
