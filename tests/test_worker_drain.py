"""A worker process drains on SIGTERM: it stops claiming, finishes the
fetches in flight, writes and acks their rows, and exits 0 with nothing left
claimed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import redis as redis_mod

from crawld import keys
from crawld.config import CrawlConfig
from crawld.crawls import create_crawl, seed
from crawld.output import list_parts
from crawld.sitesrv import SiteServer, SyntheticSite


def test_sigterm_drains_in_flight_fetches(tmp_path, redis_server, rds):
    hosts = [f"www.drain{i}.com" for i in range(6)]
    srv = SiteServer(("127.0.0.1", 0), synthetic={h: SyntheticSite(pages=50) for h in hosts}, delay_s=1.0)
    srv.serve_in_thread()
    cfg = CrawlConfig.from_dict({"crawl_id": "drain", "num_shards": 1, "seeds": [f"http://{h}/" for h in hosts],
                                 "max_rps_per_host": 50, "max_inflight_per_host": 4, "output": str(tmp_path)})
    create_crawl(rds, cfg)
    seed(rds, cfg, list(cfg.seeds))
    env = dict(os.environ, REDIS_URL=redis_server.url)
    proc = subprocess.Popen([sys.executable, "-m", "crawld.worker", "--crawl-id", "drain", "--shard", "0",
                             "--concurrency", "8", "--proxy", srv.url], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    k = keys.shard_keys("drain", 0)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and int(rds.hget(k.stats, "acked") or 0) < 6:
            time.sleep(0.05)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and rds.zcard(k.claimed) < 4:
            time.sleep(0.02)
        in_flight = rds.zcard(k.claimed)
        assert in_flight >= 4, "no fetches in flight to drain"
        claimed_before = int(rds.hget(k.stats, "claimed"))
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        drain_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        srv.shutdown()
        srv.server_close()
    assert proc.returncode == 0, err[-2000:]
    assert drain_s < 5, f"drain took {drain_s:.1f}s"
    # every claim made was finished and acked; nothing left claimed
    assert rds.zcard(k.claimed) == 0 and rds.hlen(k.claims) == 0
    stats = {a.decode(): int(b) for a, b in rds.hgetall(k.stats).items()}
    assert stats["acked"] == stats["claimed"] and stats["claimed"] <= claimed_before + 8
    # and their rows are on disk, in closed parts
    parts = list_parts(tmp_path, "drain")
    assert parts and all(p.name.endswith(".ndjson") for p in parts)
    rows = [json.loads(line) for p in parts for line in p.read_text().splitlines()]
    assert len(rows) == stats["acked"]
    assert '"worker_stopped"' in err


def test_heartbeat_keeps_slow_fetches_claimed(tmp_path, redis_server, rds):
    """Responses slower than the visibility timeout are not reclaimed (and
    fetched twice) while their worker is alive: the heartbeat extends them."""
    from conftest import crawlctl, summary_of

    with SiteServer(("127.0.0.1", 0), synthetic={"www.slow-site.com": SyntheticSite(pages=6)}, delay_s=2.5) as srv:
        summary = summary_of(crawlctl(
            "run", "http://www.slow-site.com/", "--crawl-id", "slow", "--shards", "1", "--max-rps-per-host", "100",
            "--max-inflight-per-host", "8", "--visibility-timeout", "1", "--proxy", srv.url,
            "--redis-url", redis_server.url, "--out", str(tmp_path), "--json"))
        counts = srv.counts()
    assert summary["rows"] == 7
    assert max(counts.values()) == 1, counts
    stats = rds.hgetall(keys.shard_keys("slow", 0).stats)
    assert int(stats.get(b"reclaimed", 0)) == 0 and int(stats[b"acked"]) == 7
