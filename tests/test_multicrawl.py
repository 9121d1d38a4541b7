"""Several crawls served by ONE ``crawld`` daemon at once, fairly.

A worker serves its shard of every crawl in Redis and shares its pool of
``NUM_WORKERS`` greenlets among them: a large, fast crawl that alone would
saturate the pool must not starve a small one.  A crawl with fewer shards
than the daemon serves is simply not served by the extra shards' workers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import redis

from conftest import MACHINE_ENV, crawlctl
from crawld import keys
from crawld.crawls import load_crawl
from crawld.frontier import Frontier, crawl_finished
from crawld.localredis import RedisServer
from crawld.ratecheck import limits, max_in_window
from crawld.sitesrv import SiteServer, SyntheticSite

DRAIN_TIMEOUT_S = 10.0


@pytest.fixture
def redis_srv():
    srv = RedisServer().start()
    try:
        yield srv
    finally:
        srv.stop()


def start_daemon(redis_url: str, proxy: str, log_path: Path, shards: str = "0-1",
                 num_workers: int = 4) -> subprocess.Popen:
    """``crawld --shards SHARDS`` serving every crawl in Redis; its
    (JSON-lines) log goes to ``log_path``."""
    env = {k: v for k, v in os.environ.items() if k not in MACHINE_ENV}
    env.update(REDIS_URL=redis_url, NUM_WORKERS=str(num_workers), CRAWLD_PROXY=proxy,
               CRAWLD_CONFIG="/nonexistent/crawld-test-config.json", LEASE_TTL_S="5",
               CRAWLD_LOG_LEVEL="info", DRAIN_TIMEOUT_S=str(DRAIN_TIMEOUT_S), METRICS_PORT="0")
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-m", "crawld.daemon", "--shards", shards], env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def stop_daemon(proc: subprocess.Popen) -> tuple[int, float]:
    """SIGTERM; returns (exit code, seconds it took).  Kills it if it
    overstays the drain timeout and kill grace (then the code is None)."""
    if proc.poll() is not None:
        return proc.returncode, 0.0
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=DRAIN_TIMEOUT_S + 10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, time.monotonic() - t0
    return proc.returncode, time.monotonic() - t0


def log_events(log_path: Path) -> list[dict]:
    out = []
    for line in log_path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"event": "non_json_line", "level": "error", "line": line})
    return out


def assert_clean_log(log_path: Path) -> list[dict]:
    """No errors, no tracebacks, no child restarts in the daemon's log."""
    text = log_path.read_text()
    assert "Traceback" not in text, text[-4000:]
    events = log_events(log_path)
    bad = [e for e in events if e.get("level") == "error"
           or e.get("event") in ("child_exited", "child_crash_loop", "child_killed", "child_exit_code",
                                 "drain_timeout", "drain_commit_unfinished", "lease_lost")]
    assert not bad, bad[:10]
    return events


class Watch:
    """Polls the frontier of each crawl; ``done[crawl_id]`` is the wall
    time (time.time()) at which crawl_finished first held."""

    def __init__(self, client: redis.Redis, crawl_ids: list[str]):
        self.frontiers = {c: Frontier(client, load_crawl(client, c)) for c in crawl_ids}
        self.prev: dict[str, list] = {}
        self.done: dict[str, float] = {}

    def poll(self) -> None:
        for cid, f in self.frontiers.items():
            if cid in self.done:
                continue
            snaps = f.snapshots()
            if crawl_finished(self.prev.get(cid), snaps):
                self.done[cid] = time.time()
            self.prev[cid] = snaps

    def acked(self, cid: str) -> int:
        return sum(s.stats.get("acked", 0) for s in self.frontiers[cid].snapshots())


def merged_rows(crawl_id: str, redis_url: str) -> list[dict]:
    p = crawlctl("merge", "--crawl-id", crawl_id, "--redis-url", redis_url)
    assert p.returncode == 0, p.stderr
    m = re.search(r"artifact=(\S+) rows=(\d+) duplicates_dropped=(\d+)", p.stdout)
    assert m, p.stdout
    rows = pq.read_table(m.group(1)).to_pylist()
    assert len(rows) == int(m.group(2))
    return rows


def site_urls(host: str, site: SyntheticSite) -> list[str]:
    return [f"http://{host}{p}" for p in site.paths()]


def assert_artifact(rows: list[dict], crawl_id: str, expected: list[str]) -> None:
    urls = [r["url"] for r in rows]
    assert len(urls) == len(set(urls)), "a URL has more than one row"
    missing, foreign = set(expected) - set(urls), set(urls) - set(expected)
    assert not missing and not foreign, (sorted(missing)[:5], sorted(foreign)[:5])
    assert {r["crawl_id"] for r in rows} == {crawl_id}
    assert {(r["outcome"], r["status"]) for r in rows} == {("fetched", 200)}


BIG_HOSTS = [f"www.big-crawl{i}.com" for i in range(10)]
BIG_SITE = SyntheticSite(pages=60)
BIG_RPS = 40
SMALL_HOST = "www.small-crawl.org"
SMALL_SITE = SyntheticSite(pages=15)
SMALL_RPS = 10


@pytest.mark.slow
def test_one_daemon_serves_a_big_and_a_small_crawl_fairly(tmp_path, redis_srv):
    url = redis_srv.url
    synthetic = {h: BIG_SITE for h in BIG_HOSTS} | {SMALL_HOST: SMALL_SITE}
    srv = SiteServer(("127.0.0.1", 0), synthetic=synthetic, delay_s=0.05)
    srv.serve_in_thread()
    client = redis.Redis.from_url(url)
    daemon = None
    try:
        big = crawlctl("seed", "--crawl-id", "big", *[f"http://{h}/" for h in BIG_HOSTS], "--shards", "2",
                       "--max-rps-per-host", str(BIG_RPS), "--out", str(tmp_path / "big-out"), "--redis-url", url)
        small = crawlctl("seed", "--crawl-id", "small", f"http://{SMALL_HOST}/", "--shards", "2",
                         "--max-rps-per-host", str(SMALL_RPS), "--out", str(tmp_path / "small-out"),
                         "--redis-url", url)
        assert big.returncode == 0 and small.returncode == 0, big.stderr + small.stderr
        watch = Watch(client, ["big", "small"])
        log_path = tmp_path / "crawld.log"
        t_start = time.time()
        daemon = start_daemon(url, srv.url, log_path)
        big_acked_when_small_done = None
        deadline = time.monotonic() + 60
        while len(watch.done) < 2 and time.monotonic() < deadline:
            assert daemon.poll() is None, f"crawld exited {daemon.returncode}:\n{log_path.read_text()[-4000:]}"
            watch.poll()
            if "small" in watch.done and big_acked_when_small_done is None:
                big_acked_when_small_done = watch.acked("big")
                big_running_when_small_done = "big" not in watch.done
            time.sleep(0.1)
        assert len(watch.done) == 2, f"not finished within 60 s: {sorted(watch.done)}"
        code, stop_s = stop_daemon(daemon)
        assert code == 0, f"crawld exited {code} after SIGTERM ({stop_s:.1f} s):\n{log_path.read_text()[-4000:]}"
        assert stop_s < DRAIN_TIMEOUT_S
        hits = srv.hits()
        counts = srv.counts()
        big_rows = merged_rows("big", url)
        small_rows = merged_rows("small", url)
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        client.close()
        srv.shutdown()
        srv.server_close()

    n_big = len(BIG_HOSTS) * len(BIG_SITE.paths())
    n_small = len(SMALL_SITE.paths())
    small_hits = sorted(h.t for h in hits if h.host == SMALL_HOST)
    big_hits = sorted(h.t for h in hits if h.host in BIG_HOSTS)
    # SMALL alone at its rate: its requests (pages + robots.txt) need at least
    lower_s = (len(small_hits) - 1) / SMALL_RPS
    small_s = watch.done["small"] - small_hits[0]
    report = (f"small: first hit {small_hits[0] - t_start:.2f} s after start, finished {small_s:.2f} s later "
              f"(lower bound {lower_s:.2f} s); big: first hit {big_hits[0] - t_start:.2f} s, finished "
              f"{watch.done['big'] - t_start:.2f} s after start, {big_acked_when_small_done} of {n_big} pages "
              f"done when small finished")
    print(report)
    # the big crawl did not starve the small one: it ran at (nearly) its own rate ...
    assert small_s < 3 * lower_s + 1.0, report
    # ... while the big one was still going (both crawls were served at once)
    assert big_running_when_small_done and big_acked_when_small_done < n_big, report
    assert big_hits[-1] > watch.done["small"], report
    # and the small crawl kept its rate limit (the server's clock)
    assert max_in_window(small_hits, 1.0) <= limits(SMALL_RPS)[0], report
    # every page of each crawl is in its own artifact, once; nothing of the other's
    assert_artifact(big_rows, "big", [u for h in BIG_HOSTS for u in site_urls(h, BIG_SITE)])
    assert_artifact(small_rows, "small", site_urls(SMALL_HOST, SMALL_SITE))
    assert len(big_rows) == n_big and len(small_rows) == n_small
    # the server saw no URL twice: each page and each robots.txt once
    assert max(counts.values()) == 1, [k for k, v in counts.items() if v > 1][:10]
    assert len(hits) == n_big + n_small + len(BIG_HOSTS) + 1
    events = assert_clean_log(log_path)
    served = {(e.get("shard"), e.get("crawl_id")) for e in events if e.get("event") == "crawl_served"}
    assert served == {(0, "big"), (1, "big"), (0, "small"), (1, "small")}


ONE_HOSTS = ["www.one-shard-a.net", "www.one-shard-b.net"]
TWO_HOSTS = ["www.two-shard-x.net", "www.two-shard-y.net"]
SITE = SyntheticSite(pages=10)


def test_crawl_with_fewer_shards_is_not_served_by_the_extra_shard(tmp_path, redis_srv):
    """The daemon serves shards 0-1; crawl ONE has a single shard, crawl TWO
    two.  Worker 1 serves only TWO; ONE completes on worker 0 and nothing
    breaks.  ONE is created after the daemon started (discovery)."""
    url = redis_srv.url
    srv = SiteServer(("127.0.0.1", 0), synthetic={h: SITE for h in ONE_HOSTS + TWO_HOSTS})
    srv.serve_in_thread()
    client = redis.Redis.from_url(url)
    daemon = None
    try:
        two = crawlctl("seed", "--crawl-id", "two", *[f"http://{h}/" for h in TWO_HOSTS], "--shards", "2",
                       "--max-rps-per-host", "50", "--out", str(tmp_path / "out"), "--redis-url", url)
        assert two.returncode == 0, two.stderr
        log_path = tmp_path / "crawld.log"
        daemon = start_daemon(url, srv.url, log_path)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
                e.get("event") == "worker_started" and e.get("shard") == 1 for e in log_events(log_path)):
            assert daemon.poll() is None, log_path.read_text()[-4000:]
            time.sleep(0.1)
        one = crawlctl("seed", "--crawl-id", "one", *[f"http://{h}/" for h in ONE_HOSTS], "--shards", "1",
                       "--max-rps-per-host", "50", "--out", str(tmp_path / "out"), "--redis-url", url)
        assert one.returncode == 0, one.stderr
        watch = Watch(client, ["one", "two"])
        deadline = time.monotonic() + 45
        while len(watch.done) < 2 and time.monotonic() < deadline:
            assert daemon.poll() is None, f"crawld exited {daemon.returncode}:\n{log_path.read_text()[-4000:]}"
            watch.poll()
            time.sleep(0.1)
        assert len(watch.done) == 2, f"not finished within 45 s: {sorted(watch.done)}"
        time.sleep(2.5)  # a discovery round (every 2 s) more of worker 1 with crawl ONE in Redis
        assert daemon.poll() is None, log_path.read_text()[-4000:]
        # worker 1 never took a lease of (or wrote anything for) a shard 1 of ONE
        assert client.keys(keys.crawl_shard_prefix("one", 1) + "*") == []
        code, stop_s = stop_daemon(daemon)
        assert code == 0, f"crawld exited {code} after SIGTERM:\n{log_path.read_text()[-4000:]}"
        counts = srv.counts()
        one_rows = merged_rows("one", url)
        two_rows = merged_rows("two", url)
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        client.close()
        srv.shutdown()
        srv.server_close()
    assert_artifact(one_rows, "one", [u for h in ONE_HOSTS for u in site_urls(h, SITE)])
    assert_artifact(two_rows, "two", [u for h in TWO_HOSTS for u in site_urls(h, SITE)])
    assert {r["shard"] for r in one_rows} == {0}
    assert max(counts.values()) == 1
    assert sorted(d.name for d in (tmp_path / "out" / "parts" / "one").iterdir()) == ["shard-0000"]
    events = assert_clean_log(log_path)
    served = {(e.get("shard"), e.get("crawl_id")) for e in events if e.get("event") == "crawl_served"}
    assert served == {(0, "two"), (1, "two"), (0, "one")}
