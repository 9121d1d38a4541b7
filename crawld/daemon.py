"""``crawld``: the daemon; serves a set of shards of a crawl on this machine.

``crawld --shards 0-3`` (or ``crawld@0-3.service``: the instance name is the
shard set) runs one worker process per listed shard plus a reclaim process
under :class:`crawld.supervisor.Supervisor`, until SIGTERM.
"""

from __future__ import annotations

import os
import sys

from . import __version__, exitcodes, logs
from .config import ConfigError
from .crawls import load_crawl
from .output import check_writable
from .redisconn import RedisUnfit, check, connect, redis_url
from .cliargs import Parser, crawl_id_arg, positive_float
from .supervisor import Supervisor, crawl_children


#: the largest num_shards a crawl may have (see crawld.config).
MAX_SHARDS = 4096


def parse_shard_set(text: str) -> list[int]:
    """Shards named like ``0-3``, ``0,2,5`` or ``0-3,8`` (systemd instance
    names too), sorted and unique.

    Raises:
        ConfigError: malformed text or a negative shard.
    """
    out: set[int] = set()
    try:
        for part in text.replace(" ", "").split(","):
            if not part:
                continue
            lo, _, hi = part.partition("-")
            lo_i, hi_i = int(lo), int(hi or lo)
            if not 0 <= lo_i <= hi_i < MAX_SHARDS:
                raise ValueError
            out.update(range(lo_i, hi_i + 1))
    except ValueError:
        raise ConfigError(f"shards: {text!r} is not a shard set like '0-3' or '0,2,5' "
                          f"(shards are 0..{MAX_SHARDS - 1})") from None
    if not out:
        raise ConfigError(f"shards: {text!r} names no shard")
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="crawld", description="Serve shards of a crawl on this machine.",
                                epilog="Environment: REDIS_URL, CRAWL_ID, NUM_WORKERS (concurrent fetches per "
                                       "shard worker), CRAWLD_PROXY.")
    p.add_argument("--version", action="version", version=f"crawld {__version__}")
    p.add_argument("--shards", default=os.environ.get("CRAWLD_SHARDS"), help="shard set, e.g. 0-3 or 0,2,5")
    p.add_argument("--crawl-id", type=crawl_id_arg, default=os.environ.get("CRAWL_ID"))
    p.add_argument("--redis-url", default=None)
    p.add_argument("--drain-timeout", type=positive_float, default=os.environ.get("DRAIN_TIMEOUT_S", "30"),
                   metavar="S", help="seconds children get to drain on SIGTERM (default $DRAIN_TIMEOUT_S or 30)")
    args = p.parse_args(argv)
    log = logs.setup(proc="crawld")
    try:
        if not args.shards:
            raise ConfigError("shards: give --shards (e.g. 0-3) or $CRAWLD_SHARDS")
        shards = parse_shard_set(args.shards)
        if not args.crawl_id:
            raise ConfigError("CRAWL_ID: not set (or pass --crawl-id)")
        url = redis_url(args.redis_url)
        if not url:
            raise ConfigError("REDIS_URL: not set")
        client = connect(url)
        check(client, url)
        config = load_crawl(client, args.crawl_id)
        bad = [s for s in shards if s >= config.num_shards]
        if bad:
            raise ConfigError(f"shards: {bad} not in 0..{config.num_shards - 1} (crawl has {config.num_shards})")
        check_writable(config.output)
    except ConfigError as exc:
        print(f"crawld: error: {exc}", file=sys.stderr)
        return exitcodes.CONFIG
    except RedisUnfit as exc:
        print(f"crawld: error: {exc}", file=sys.stderr)
        return exitcodes.UNAVAILABLE
    except OSError as exc:
        print(f"crawld: error: output {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return exitcodes.CANTCREAT
    env = {"REDIS_URL": url}
    wargs = ["--crawl-id", config.crawl_id, "--drain-timeout", str(args.drain_timeout)]
    specs = crawl_children(shards, wargs, [], env)
    sup = Supervisor(specs, drain_timeout_s=args.drain_timeout, log=log.bind(crawl_id=config.crawl_id))
    workers = {s.name for s in specs if s.name.startswith("worker-")}
    # serve until stopped; give up (and let the service manager see a
    # failure) only when every worker is crash-looping
    sup.run(until=lambda: workers <= set(sup.gave_up))
    if sup.gave_up:
        log.error("crawld_failed", gave_up=sup.gave_up)
        return exitcodes.SOFTWARE
    return exitcodes.OK


if __name__ == "__main__":
    sys.exit(main())
