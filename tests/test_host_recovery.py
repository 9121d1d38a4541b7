"""A host that is down comes back (DESIGN.md promise 4): refused connections
do not spend a URL's attempts and do not give the host up for the rest of
the crawl; after ``host_max_failures`` failures in a row it is probed one
request at a time, still backing off, and given up only after
``host_give_up_s`` of failing.

The host is a real HTTP server on a loopback port that refuses every
connection at first (the port is bound, nothing listens: the kernel answers
RST, ``ECONNREFUSED``); once the crawl has failed ``host_max_failures`` (10,
the default) times in a row on it, as the fleet's politeness state in Redis
records, it starts listening.  Settings are the defaults but for the backoff
(0.05 s doubling to 0.2 s, so the test takes seconds, not minutes) and the
rate (20 r/s: the 51 pages after the recovery)."""

from __future__ import annotations

import socket
import threading
import time

import pyarrow.parquet as pq
import redis

from conftest import summary_of
from crawld import keys
from crawld.config import CrawlConfig
from crawld.sharding import shard_for
from crawld.sitesrv import SiteServer, SyntheticSite

HOST = "127.0.0.1"
PAGES = 50


def test_a_host_refusing_its_first_10_connections_is_crawled_whole(tmp_path, redis_server, run_crawlctl):
    hold = socket.socket()
    hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    hold.bind((HOST, 0))  # bound, not listening: connections are refused
    port = hold.getsockname()[1]
    seeds = [f"http://{HOST}:{port}/"] + [f"http://{HOST}:{port}/p/{n}.html" for n in range(PAGES)]
    seeds_file = tmp_path / "seeds.txt"
    seeds_file.write_text("# the 51 URLs of the host\n" + "\n".join(seeds) + "\n")
    client = redis.Redis.from_url(redis_server.url)
    fails_key = keys.shard_keys("recovery", shard_for(HOST, 2)).fails
    state: dict = {}

    def recover() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            raw = client.hget(fails_key, HOST)
            if raw is not None and int(raw.split(b":")[0]) >= CrawlConfig.host_max_failures:
                break
            time.sleep(0.01)
        state["failures"] = int((client.hget(fails_key, HOST) or b"0").split(b":")[0])
        hold.close()
        srv = SiteServer((HOST, port), synthetic={HOST: SyntheticSite(pages=PAGES, extra_links=0)})
        srv.serve_in_thread()
        state["srv"] = srv

    t = threading.Thread(target=recover, daemon=True)
    t.start()
    try:
        summary = summary_of(run_crawlctl("run", "--seeds-file", str(seeds_file), "--crawl-id", "recovery",
                                          "--shards", "2", "--allow-loopback", "--redis-url", redis_server.url,
                                          "--max-rps-per-host", "20",
                                          "--set", "backoff_base_s=0.05", "--set", "backoff_max_s=0.2",
                                          "--out", str(tmp_path / "out"), "--json"))
    finally:
        t.join(5)
        if "srv" in state:
            state["srv"].shutdown()
            state["srv"].server_close()
    assert state["failures"] >= 10, state
    rows = pq.read_table(summary["artifact"], columns=["url", "status", "outcome", "attempt"]).to_pylist()
    assert len(rows) == PAGES + 1
    assert {r["status"] for r in rows} == {200}, [r for r in rows if r["status"] != 200][:3]
    # the refused connections spent no URL's attempts
    assert {r["attempt"] for r in rows} == {1}
