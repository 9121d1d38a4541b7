"""``crawlctl run``: an all-in-one local crawl, start to artifact.

Starts a private ``redis-server`` when no Redis URL is given, creates and
seeds the crawl, runs the supervisor (one worker per shard plus the
reclaimer) until the crawl is provably finished (see
:func:`crawld.frontier.crawl_finished`), stops it, merges the parts into
the Parquet artifact and summarises.  It drives the same
:class:`crawld.supervisor.Supervisor` as the ``crawld`` daemon.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import pyarrow.parquet as pq

from . import logs
from .config import CrawlConfig
from .crawls import create_crawl, export_dead_letters, seed
from .scope import Router
from .dedup import bloom_report
from .frontier import Frontier, ShardSnapshot, crawl_finished
from .localredis import RedisServer
from .merge import MergeResult, merge_crawl
from .redisconn import check, connect
from .storage import is_remote, merged, ship_spool, spool_dir, with_location
from .supervisor import Supervisor, crawl_children
from .verify import record_merge
from .redisconn import ERRORS as REDIS_ERRORS


class RunFailed(RuntimeError):
    """The crawl could not complete; ``str(err)`` is one line."""


class RunInterrupted(RunFailed):
    """Stopped by SIGINT/SIGTERM before the crawl finished."""


@dataclass
class RunOptions:
    """Process-level options of a local run (crawl settings live in the
    :class:`CrawlConfig`).  ``concurrency`` is fetches in flight per worker;
    ``redis_outage_s`` how long the run waits for an unreachable Redis."""

    redis_url: str | None = None
    concurrency: int = 32
    proxy: str | None = None
    drain_timeout_s: float = 30.0
    progress: bool = False
    poll_s: float = 0.5
    redis_outage_s: float = 60.0
    env: dict[str, str] = field(default_factory=dict)


#: outcomes of rows whose URL was requested
FETCH_OUTCOMES = ("fetched", "redirect", "error")


def summarize(merge: MergeResult, wall_s: float) -> dict[str, Any]:
    """Summary figures of an artifact.

    ``pages`` counts URLs requested (outcomes fetched, redirect, error);
    ``not_fetched`` the rows recorded without a request, by reason;
    ``hosts`` pages per host; ``rows`` everything in the artifact.
    """
    t = pq.read_table(merge.path, columns=["outcome", "status", "host", "error"])
    outcomes = t.column("outcome").to_pylist()
    statuses = Counter(f"{s // 100}xx" for s in t.column("status").to_pylist() if s is not None)
    hosts: Counter = Counter()
    not_fetched: Counter = Counter()
    for outcome, host, error in zip(outcomes, t.column("host").to_pylist(), t.column("error").to_pylist()):
        if outcome in FETCH_OUTCOMES:
            hosts[host] += 1
        elif outcome in ("skipped", "blocked"):
            not_fetched[(error or outcome).split(":", 1)[0]] += 1
        else:
            not_fetched[outcome] += 1
    by_outcome = Counter(outcomes)
    pages = sum(by_outcome[o] for o in FETCH_OUTCOMES)
    return {
        "artifact": str(merge.path),
        "rows": merge.rows,
        "pages": pages,
        "outcomes": dict(sorted(by_outcome.items())),
        "statuses": dict(sorted(statuses.items())),
        "errors": by_outcome["error"],
        "not_fetched": dict(not_fetched.most_common()),
        "duplicates_dropped": merge.duplicates,
        "retried": merge.retried,
        "torn_lines_skipped": merge.bad_lines,
        "hosts": dict(hosts.most_common()),
        "wall_s": round(wall_s, 3),
        "pages_per_s": round(pages / wall_s, 2) if wall_s > 0 else None,
    }


def format_summary(crawl_id: str, s: dict[str, Any]) -> str:
    """The summary as aligned text."""
    kv = lambda d: " ".join(f"{k}={v}" for k, v in d.items()) or "-"  # noqa: E731
    fetch_kinds = {k: v for k, v in s["outcomes"].items() if k in FETCH_OUTCOMES}
    lines = [
        f"crawl        {crawl_id}",
        f"artifact     {s['artifact']} ({s['rows']} rows, {s['duplicates_dropped']} duplicates dropped"
        + (f", {s['retried']} older rows of retried URLs replaced" if s.get("retried") else "") + ")",
        f"pages        {s['pages']} requested ({kv(fetch_kinds)})",
        f"statuses     {kv(s['statuses'])}",
        f"errors       {s['errors']}",
        f"not fetched  {sum(s['not_fetched'].values())} ({kv(s['not_fetched'])})",
        f"wall time    {s['wall_s']:.1f} s",
        f"pages/s      {s['pages_per_s']}",
    ]
    b = s.get("bloom")
    if b:
        lines.append(f"bloom filter {b['urls']} URLs to fetch, {b['skip_urls']} to record ({b['impl']}); "
                     f"estimated false-positive rate {b['fp_rate_est']:.3g} now "
                     f"(configured {b['fp_rate_configured']:g} at {b['capacity_per_shard']} URLs per shard)")
    for host, n in list(s["hosts"].items())[:20]:
        lines.append(f"host         {host} {n}")
    return "\n".join(lines)


class Progress:
    """A one-line live progress report on a terminal (nothing otherwise)."""

    def __init__(self, stream: TextIO, enabled: bool):
        self.stream = stream
        self.enabled = enabled
        self.t0 = time.monotonic()
        self._last = 0.0

    def update(self, snaps: list[ShardSnapshot]) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < 1.0:
            return
        self._last = now
        acked = sum(s.stats.get("acked", 0) for s in snaps)
        queued = sum(s.queued for s in snaps)
        claimed = sum(s.claimed for s in snaps)
        dead = sum(s.dead for s in snaps)
        errors = sum(s.stats.get("rows_error", 0) for s in snaps)
        el = now - self.t0
        self.stream.write(f"\r  pages {acked}  queued {queued}  in flight {claimed}  errors {errors}  "
                          f"dead {dead}  {acked / el if el else 0:.1f} pages/s  {el:.0f}s ")
        self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def run_crawl(config: CrawlConfig, opts: RunOptions, out: TextIO = sys.stdout,
              seeds: list[str] | None = None, resume: bool = False) -> dict[str, Any]:
    """Run ``config`` locally to its artifact, from ``seeds`` (default the
    config's); with ``resume``, serve the crawl as it is in Redis (created
    already: ``crawlctl retry --run``) without seeding it; returns the
    summary dict.

    Raises:
        RunFailed: a worker crash-looped, or the run was interrupted.
        crawld.redisconn.RedisUnfit, crawld.localredis.RedisServerError:
            no usable Redis.
        crawld.crawls.CrawlExists: the crawl id is taken.
    """
    log = logs.setup(crawl_id=config.crawl_id, proc="run")
    t0 = time.monotonic()
    server = None
    url = opts.redis_url
    if not url:
        server = RedisServer(die_with_parent=True).start()
        url = server.url
    try:
        client = connect(url)
        check(client, url)
        if not is_remote(config.output):
            Path(config.output).mkdir(parents=True, exist_ok=True)
        if not resume:
            seeds = list(config.seeds if seeds is None else seeds)
            router = Router(config, max_cache=max(200_000, 2 * len(seeds)))  # one canonical form per seed
            create_crawl(client, config, seeds, router)
            seeded = seed(client, config, seeds, router)
            log.info("crawl_created", seeds=seeded, shards=config.num_shards)
        frontier = Frontier(client, config)
        env = {"REDIS_URL": url, **opts.env}
        worker_args = ["--crawl-id", config.crawl_id, "--concurrency", str(opts.concurrency),
                       "--drain-timeout", str(opts.drain_timeout_s)]
        if opts.proxy:
            worker_args += ["--proxy", opts.proxy]
        specs = crawl_children(list(range(config.num_shards)), worker_args, ["--crawl-id", config.crawl_id], env)
        sup = Supervisor(specs, drain_timeout_s=opts.drain_timeout_s, log=log.bind(proc="supervisor"))
        progress = Progress(sys.stderr, opts.progress)
        state: dict[str, Any] = {"prev": None, "finished": False}

        def finished() -> bool:
            if sup.gave_up:
                return True
            try:
                snaps = frontier.snapshots()
            except REDIS_ERRORS as exc:
                # workers ride out a Redis outage (they retry); so does the
                # run, for up to redis_outage_s
                since = state.setdefault("redis_down_since", time.monotonic())
                if time.monotonic() - since > opts.redis_outage_s:
                    raise RunFailed(f"Redis unreachable for {opts.redis_outage_s:g}s: "
                                    f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
                state["prev"] = None
                return False
            state.pop("redis_down_since", None)
            progress.update(snaps)
            done = crawl_finished(state["prev"], snaps)
            state["prev"] = snaps
            state["finished"] = done
            return done

        sup.run(until=finished, every_s=opts.poll_s)
        progress.done()
        if sup.gave_up:
            raise RunFailed(f"worker(s) {', '.join(sup.gave_up)} kept crashing; see the log above")
        if not state["finished"]:
            where = ("the private Redis is discarded" if server is not None
                     else f"its state stays in Redis as crawl {config.crawl_id!r}")
            raise RunInterrupted(f"interrupted before the crawl finished; {where}")
        dead = export_dead_letters(client, config)
        if is_remote(config.output):
            # parts the workers could not ship before they exited
            spool = spool_dir({**os.environ, **opts.env})
            n, nbytes = ship_spool(spool, config.output, config.crawl_id, config.num_shards)
            if n:
                log.info("spool_shipped", parts=n, bytes=nbytes)
            # parts downloaded to a temporary directory, artifact uploaded
            with merged(config.output, config.crawl_id, config.created_at) as (merge, artifact):
                summary = summarize(merge, time.monotonic() - t0)
                merge = with_location(merge, artifact)
            summary["artifact"] = artifact
            record_merge(client, config, merge)  # for 'crawlctl verify' (row count vs the previous crawl)
        else:
            merge = merge_crawl(config.output, config.crawl_id, config.created_at)
            record_merge(client, config, merge)  # for 'crawlctl verify' (row count vs the previous crawl)
            summary = summarize(merge, time.monotonic() - t0)
        summary["dead_letters"] = dead
        summary["crawl_id"] = config.crawl_id
        if config.dedup == "redis_bloom":
            # a false positive is a page silently not crawled: say how likely
            summary["bloom"] = bloom_report(client, config)
        return summary
    finally:
        if server is not None:
            server.stop()


def print_summary(summary: dict[str, Any], as_json: bool, out: TextIO = sys.stdout) -> None:
    """Print the summary as text or one JSON object."""
    if as_json:
        out.write(json.dumps(summary, sort_keys=True) + "\n")
    else:
        out.write(format_summary(summary["crawl_id"], summary) + "\n")
        if summary.get("dead_letters"):
            out.write(f"dead letters {summary['dead_letters']} (rows with outcome=dead_letter, reason in 'error')\n")
