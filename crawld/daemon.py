"""``crawld``: the daemon; serves a set of shards of a crawl on this machine.

``crawld --shards 0-3`` (or ``crawld@0-3.service``: the instance name is the
shard set) runs one worker process per listed shard plus a reclaim process
under :class:`crawld.supervisor.Supervisor`, until SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__, exitcodes, logs
from .config import ConfigError
from .crawls import load_crawl
from .output import check_writable
from .redisconn import RedisUnfit, check, connect, redis_url
from .supervisor import Supervisor, python_child


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
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
    except ValueError:
        raise ConfigError(f"shards: {text!r} is not a shard set like '0-3' or '0,2,5'") from None
    if not out or min(out) < 0:
        raise ConfigError(f"shards: {text!r} names no valid shard")
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="crawld", description="Serve shards of a crawl on this machine.",
                                epilog="Environment: REDIS_URL, CRAWL_ID, NUM_WORKERS (concurrent fetches per "
                                       "shard worker), CRAWLD_PROXY.")
    p.add_argument("--version", action="version", version=f"crawld {__version__}")
    p.add_argument("--shards", default=os.environ.get("CRAWLD_SHARDS"), help="shard set, e.g. 0-3 or 0,2,5")
    p.add_argument("--crawl-id", default=os.environ.get("CRAWL_ID"))
    p.add_argument("--redis-url", default=None)
    p.add_argument("--drain-timeout", type=float, default=float(os.environ.get("DRAIN_TIMEOUT_S", "30")))
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
    specs = [python_child(f"worker-{s}", "crawld.worker", [*wargs, "--shard", str(s)], env) for s in shards]
    specs.append(python_child("reclaim", "crawld.reclaim", [], env))
    sup = Supervisor(specs, drain_timeout_s=args.drain_timeout, log=log.bind(crawl_id=config.crawl_id))
    sup.run()
    return exitcodes.OK if not sup.gave_up else exitcodes.SOFTWARE


if __name__ == "__main__":
    sys.exit(main())
