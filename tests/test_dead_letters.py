"""Promise 4: an entry given up after max_attempts is not silently dropped:
it is in the dead-letter list with its reason, and ``crawlctl merge`` puts
it in the artifact as a ``dead_letter`` row."""

from __future__ import annotations

import time

import pyarrow.parquet as pq

from conftest import crawlctl
from crawld.config import CrawlConfig
from crawld.crawls import create_crawl, seed
from crawld.frontier import Frontier
from crawld.output import PartWriter
from crawld.rows import make_row


def test_expired_claims_end_as_dead_letter_rows(tmp_path, redis_server, rds):
    cfg = CrawlConfig.from_dict({"crawl_id": "dl", "num_shards": 2, "seeds": ["http://poison.example.com/x",
                                 "http://fine.example.org/"], "visibility_timeout_s": 1, "max_attempts": 2,
                                 "max_rps_per_host": 1000, "output": str(tmp_path)})
    create_crawl(rds, cfg)
    assert seed(rds, cfg, list(cfg.seeds)) == 2
    f = Frontier(rds, cfg)

    def fetch_fine(shard, claim):
        # the healthy URL is "fetched": its row is written, then it is acked
        w = PartWriter(tmp_path, "dl", shard)
        w.write([make_row(crawl_id="dl", url="http://fine.example.org/", canonical_url="http://fine.example.org/",
                          outcome="fetched", shard=shard, attempt=claim.attempts, depth=0, referrer=None,
                          host="fine.example.org", fetched_at=time.time(), response_ms=1.0, status=200)])
        w.close()
        assert f.ack(shard, [claim.token]) == 1

    # a worker that "dies" on every claim of the poison URL: its claims expire
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and sum(s.dead for s in f.snapshots()) == 0:
        for shard in range(2):
            _, claims = f.claim(shard, 10)
            for c in claims:
                if b"fine.example.org" in c.payload:
                    fetch_fine(shard, c)
        time.sleep(1.1)
        for shard in range(2):
            f.reclaim(shard)
    dead = [d for s in range(2) for d in f.dead_letters(s)]
    assert len(dead) == 1 and "visibility timeout" in dead[0]["reason"] and dead[0]["attempts"] == 2
    proc = crawlctl("merge", "--crawl-id", "dl", "--redis-url", redis_server.url)
    assert proc.returncode == 0, proc.stderr
    artifact = proc.stdout.split("artifact=")[1].split()[0]
    rows = {r["url"]: r for r in pq.read_table(artifact).to_pylist()}
    assert set(rows) == {"http://poison.example.com/x", "http://fine.example.org/"}
    poison = rows["http://poison.example.com/x"]
    assert poison["outcome"] == "dead_letter" and "visibility timeout" in poison["error"]
    assert poison["attempt"] == 2 and poison["host"] == "poison.example.com"
    # merging again is idempotent (the dead-letter part is rewritten, not appended)
    again = crawlctl("merge", "--crawl-id", "dl", "--redis-url", redis_server.url)
    assert "rows=2 duplicates_dropped=0" in again.stdout
