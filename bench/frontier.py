#!/usr/bin/env python3
"""Frontier throughput: claim+ack per second against the EVALSHA ceiling.

On one private redis-server (loopback, free port):

* baseline: ``redis-benchmark`` running a trivial ``EVALSHA`` (``return 1``)
  with the same number of client connections: the most script calls per
  second this server and machine can take;
* crawld: ``--hosts`` politeness keys with ``--urls`` queued URLs in one
  shard (rate limit high enough never to hold a key back), drained by
  ``--clients`` processes, each looping claim(``--batch``) then ack of the
  tokens it got, as a worker does.  Reported: entries claimed and acked per
  second, and script calls (claim + ack) per second as a fraction of the
  EVALSHA ceiling.

    python bench/frontier.py [--urls 200000] [--hosts 5000] [--clients 2] [--batch 32]

Prints a table and one JSON line.  The machines are noisy: compare the
ratio, not the absolute figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from crawld.config import CrawlConfig  # noqa: E402
from crawld.frontier import Entry, Frontier, PushItem  # noqa: E402
from crawld.localredis import RedisServer  # noqa: E402
from crawld.urls import fingerprint  # noqa: E402


def config() -> CrawlConfig:
    return CrawlConfig(crawl_id="bench-frontier", num_shards=1, max_rps_per_host=1e6,
                       max_inflight_per_host=1000, max_pages_per_host=0)


def evalsha_ceiling(port: int, clients: int, n: int) -> float:
    """Trivial EVALSHA calls/s measured by redis-benchmark."""
    sha = redis.Redis(port=port).script_load("return 1")
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-c", str(clients), "-n", str(n), "--csv",
                          "EVALSHA", sha, "0"], capture_output=True, text=True, check=True).stdout
    last = [line for line in out.splitlines() if line.startswith('"EVALSHA')][-1]
    return float(last.split(",")[1].strip('"'))


def fill(url: str, urls: int, hosts: int) -> None:
    f = Frontier(redis.Redis.from_url(url), config())
    batch: list[PushItem] = []
    for i in range(urls):
        host = f"www.h{i % hosts}.com"
        u = f"http://{host}/p/{i}"
        batch.append(PushItem(fingerprint(u), f"h{i % hosts}.com", host, "", "", Entry(u, u, 1, None).to_payload()))
        if len(batch) == 1000:
            f.push(0, batch)
            batch = []
    if batch:
        f.push(0, batch)


def drain(url: str, batch: int, out: mp.Queue) -> None:
    f = Frontier(redis.Redis.from_url(url), config())
    entries = calls = 0
    idle = 0
    while idle < 3:
        _, claims = f.claim(0, batch)
        calls += 1
        if not claims:
            idle += 1
            time.sleep(0.01)
            continue
        idle = 0
        f.ack(0, [c.token for c in claims])
        calls += 1
        entries += len(claims)
    out.put((entries, calls))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--urls", type=int, default=200_000)
    p.add_argument("--hosts", type=int, default=5000)
    p.add_argument("--clients", type=int, default=2, help="claiming processes (and redis-benchmark clients)")
    p.add_argument("--batch", type=int, default=32, help="entries per claim call")
    args = p.parse_args()
    with RedisServer() as srv:
        ceiling = evalsha_ceiling(srv.port, args.clients, 200_000)
        t0 = time.monotonic()
        fill(srv.url, args.urls, args.hosts)
        fill_s = time.monotonic() - t0
        q: mp.Queue = mp.Queue()
        procs = [mp.Process(target=drain, args=(srv.url, args.batch, q)) for _ in range(args.clients)]
        t0 = time.monotonic()
        for pr in procs:
            pr.start()
        results = [q.get() for _ in procs]
        for pr in procs:
            pr.join()
        wall = time.monotonic() - t0 - 0.03  # the idle polls at the end
        left = redis.Redis(port=srv.port)
        entries = sum(r[0] for r in results)
        calls = sum(r[1] for r in results)
        assert entries == args.urls, f"drained {entries} of {args.urls}"
        del left
    res = {"urls": args.urls, "hosts": args.hosts, "clients": args.clients, "batch": args.batch,
           "evalsha_per_s": round(ceiling), "push_per_s": round(args.urls / fill_s),
           "claim_ack_entries_per_s": round(entries / wall), "script_calls_per_s": round(calls / wall),
           "calls_vs_evalsha": round(calls / wall / ceiling, 3),
           "entries_vs_evalsha": round(entries / wall / ceiling, 3), "cpus": os.cpu_count()}
    print(f"trivial EVALSHA (redis-benchmark, {args.clients} clients)  {res['evalsha_per_s']:>9} calls/s")
    print(f"push (batches of 1000)                        {res['push_per_s']:>9} URLs/s")
    print(f"claim({args.batch})+ack, {args.clients} processes               {res['claim_ack_entries_per_s']:>9} "
          f"entries/s = {res['entries_vs_evalsha']:.2f} x the EVALSHA ceiling")
    print(f"  script calls (claim + ack)                  {res['script_calls_per_s']:>9} calls/s = "
          f"{res['calls_vs_evalsha']:.2f} of the EVALSHA ceiling")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
