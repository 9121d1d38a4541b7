"""The dedup backends (crawld.dedup, the push script), against a real
redis-server: sizing, the layout recorded per shard, compact encodings,
the Bloom filter's false-positive rate, settings, and a crawl end to end
with ``--set dedup=redis_bloom``.  The frontier's own tests run with both
backends (tests/test_frontier.py and tests/test_frontier_bloom.py)."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest
from redis.crc import key_slot

from conftest import PYDOCS_HOST, summary_of

from crawld import dedup, keys
from crawld.config import ConfigError, CrawlConfig
from crawld.frontier import Entry, Frontier, PushItem
from crawld.runner import format_summary
from crawld.sharding import key_slot as pkey_slot
from crawld.urls import fingerprint

CRAWL = "dd"
BACKENDS = ("redis_set", "redis_bloom")


def frontier(rds, **over) -> Frontier:
    d = {"crawl_id": CRAWL, "num_shards": 1, "max_rps_per_host": 1000, "max_pages_per_host": 0,
         "max_query_variants": 0}
    d.update(over)
    return Frontier(rds, CrawlConfig.from_dict(d))


def items(start: int, stop: int, mode: str = "", hosts: int = 100, payload: bool = True) -> list[PushItem]:
    """URLs ``start..stop-1``; without ``payload`` a stub one (never claimed)."""
    out = []
    for i in range(start, stop):
        host = f"h{i % hosts}.example"
        url = f"http://{host}/p/{i}"
        out.append(PushItem(fingerprint(url), host, host, "", mode,
                            Entry(url, url, 1).to_payload() if payload else b"-"))
    return out


def push_all(f: Frontier, its: list[PushItem], batch: int = 500) -> tuple[int, int, int]:
    """Push in batches (pipelined); the summed (queued, recorded, duplicates)."""
    tot = [0, 0, 0]
    pipe = f.client.pipeline(transaction=False)
    for i in range(0, len(its), batch):
        f.push(0, its[i:i + batch], client=pipe)
        if (i // batch) % 20 == 19:
            for r in pipe.execute():
                tot = [a + int(b) for a, b in zip(tot, r)]
    for r in pipe.execute():
        tot = [a + int(b) for a, b in zip(tot, r)]
    return tot[0], tot[1], tot[2]


def drop_queue(rds) -> None:
    sk = keys.shard_keys(CRAWL, 0)
    rds.delete(sk.queue, sk.sched, sk.skips)


# -- sizing --------------------------------------------------------------
def test_bloom_size_follows_the_textbook_formulas():
    m, k = dedup.bloom_size(1_000_000, 0.01)
    assert m == math.ceil(-1_000_000 * math.log(0.01) / math.log(2) ** 2) == 9_585_059
    assert k == 7
    assert m / 8 / 1_000_000 < 1.2  # bytes per URL of bitmap at 1 %
    assert dedup.bloom_size(1000, 0.001) == (14378, 10)
    assert dedup.estimated_fp_rate(1_000_000, m, k) == pytest.approx(0.01, rel=0.01)
    assert dedup.estimated_fp_rate(0, m, k) == 0.0
    assert dedup.estimated_fp_rate(500_000, m, k) < 0.001


def test_bucket_bits_keep_at_most_256_expected_entries_per_bucket():
    assert dedup.bucket_bits(1) == 0
    assert dedup.bucket_bits(256) == 0
    assert dedup.bucket_bits(257) == 1
    for n in (1000, 250_000, 1_000_000, 10_000_000, 10 ** 11):
        b = dedup.bucket_bits(n)
        assert 128 < n / 2 ** b <= 256


def test_push_spec_is_sized_per_shard():
    cfg = CrawlConfig.from_dict({"crawl_id": "c", "num_shards": 4, "expected_urls": 1_000_000})
    assert dedup.push_spec(cfg) == "set 10"  # 250,000 per shard / 1024 buckets = 244
    cfg = cfg.replace(dedup="redis_bloom", bloom_fp_rate=0.02)
    m, k = dedup.bloom_size(250_000, 0.02)
    assert dedup.push_spec(cfg) == f"bloom {m} {k} 250000 0.02"


def test_positions_and_buckets_use_the_fingerprint_bits():
    fp = bytes.fromhex("fb2241160c9dad06")
    assert dedup.words(fp) == (0xFB224116, 0x0C9DAD06)
    slot = pkey_slot("python.org")
    assert dedup.bucket_and_member(fp, 12, "python.org") == (0xFB2, slot * 2 ** 32 + 0x0C9DAD06)
    assert dedup.bucket_and_member(fp, 0, "python.org") == (0, slot * 2 ** 32 + 0x0C9DAD06)
    assert dedup.member_slot(slot * 2 ** 32 + 0x0C9DAD06) == slot
    assert dedup.tagged_fingerprint(fp, "python.org") == fp + slot.to_bytes(2, "big")
    m = 958_506
    assert dedup.bloom_positions(fp, m, 3) == [0xFB224116 % m, (0xFB224116 + 0x0C9DAD06) % m,
                                               (0xFB224116 + 2 * 0x0C9DAD06) % m]


# -- settings --------------------------------------------------------------
def test_settings_defaults_and_one_line_errors():
    cfg = CrawlConfig.from_dict({"crawl_id": "c"})
    assert (cfg.dedup, cfg.expected_urls, cfg.bloom_fp_rate) == ("redis_set", 1_000_000, 0.01)
    assert CrawlConfig.from_dict({"crawl_id": "c", "dedup": " redis_bloom "}).dedup == "redis_bloom"
    for data, name in (({"dedup": "bloom"}, "dedup"), ({"expected_urls": 0}, "expected_urls"),
                       ({"bloom_fp_rate": 1}, "bloom_fp_rate"),
                       # one shard's filter would not fit a Redis string (2^32 bits)
                       ({"dedup": "redis_bloom", "expected_urls": 10 ** 10, "num_shards": 4}, "expected_urls")):
        with pytest.raises(ConfigError) as info:
            CrawlConfig.from_dict({"crawl_id": "c", **data})
        msg = str(info.value)
        assert msg.startswith(f"{name}: ") and "\n" not in msg, msg
    # the same size fits with enough shards, and an exact set is not limited so
    CrawlConfig.from_dict({"crawl_id": "c", "dedup": "redis_bloom", "expected_urls": 10 ** 10, "num_shards": 64})
    CrawlConfig.from_dict({"crawl_id": "c", "expected_urls": 10 ** 10, "num_shards": 1})


def test_crawlctl_rejects_a_bad_dedup_setting(run_crawlctl, tmp_path):
    proc = run_crawlctl("run", "http://a.example/", "--set", "dedup=memcached", "--out", str(tmp_path))
    assert proc.returncode == 78, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "dedup" in err[0] and "redis_set" in err[0], err


# -- the push script -----------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_push_dedups_and_the_python_reader_agrees_with_the_script(rds, backend):
    f = frontier(rds, dedup=backend, expected_urls=10_000)
    assert push_all(f, items(0, 2000)) == (2000, 0, 0)
    assert push_all(f, items(0, 2000)) == (0, 0, 2000)
    assert push_all(f, items(1000, 3000)) == (1000, 0, 1000)
    for it in items(0, 3000)[::7]:
        assert dedup.contains(rds, CRAWL, 0, "seen", it.fp, it.pkey)
    misses = sum(dedup.contains(rds, CRAWL, 0, "seen", it.fp, it.pkey) for it in items(5000, 6000))
    assert misses <= (30 if backend == "redis_bloom" else 0)  # ~1 % false positives at the expected fill
    info = dedup.info(rds, CRAWL, 0)
    assert info["n"] == 3000
    assert info["backend"] == ("set" if backend == "redis_set" else "lua")  # no RedisBloom on the test server
    assert dedup.info(rds, CRAWL, 0, "skipseen") is None  # created on first use only


@pytest.mark.parametrize("backend", BACKENDS)
def test_skip_entries_dedup_through_skipseen(rds, backend):
    f = frontier(rds, dedup=backend, expected_urls=10_000)
    assert push_all(f, items(0, 500, "out_of_scope")) == (0, 500, 0)
    assert push_all(f, items(0, 500, "nofollow")) == (0, 0, 500)
    assert push_all(f, items(0, 500)) == (500, 0, 0)  # not yet queued for fetching: it is now
    assert push_all(f, items(500, 600)) == (100, 0, 0)
    assert push_all(f, items(500, 600, "out_of_scope")) == (0, 0, 100)  # queued for fetching before
    assert dedup.info(rds, CRAWL, 0, "skipseen")["n"] == 500
    assert all(dedup.contains(rds, CRAWL, 0, "skipseen", it.fp, it.pkey) for it in items(0, 500)[::11])


def test_redis_set_buckets_are_intsets_of_8_byte_members_that_keep_the_slot(rds):
    f = frontier(rds, expected_urls=20_000)
    push_all(f, items(0, 20_000))
    info = dedup.info(rds, CRAWL, 0)
    assert info == {"backend": "set", "n": 20_000, "bits": 7}  # 20,000 / 128 buckets = 156
    sk = keys.shard_keys(CRAWL, 0)
    buckets = list(rds.scan_iter(match=sk.seen.replace("{", "\\{").replace("}", "\\}") + ":*", count=1000))
    assert len(buckets) == 128
    pipe = rds.pipeline(transaction=False)
    for b in buckets:
        pipe.object("encoding", b)
    assert set(pipe.execute()) == {b"intset"}
    members = {int(x) for b in buckets for x in rds.smembers(b)}
    assert {dedup.member_slot(x) for x in members} == {pkey_slot(it.pkey) for it in items(0, 20_000)}
    usage = sum(rds.memory_usage(b, samples=0) for b in buckets)
    assert 8 < usage / 20_000 <= 12, usage / 20_000  # 8-byte members plus ~0.7 byte of key per URL


def test_redis_set_stays_under_16_bytes_per_url(rds):
    """The target at 10 million is measured by bench/dedup.py; here 100,000
    URLs with the default sizing of 1 million per crawl over 4 shards."""
    f = frontier(rds, num_shards=4)
    before = rds.info("memory")["used_memory"]
    n = 100_000
    push_all(f, items(0, n, payload=False))
    drop_queue(rds)
    rds.delete(keys.shard_keys(CRAWL, 0).stats, keys.shard_keys(CRAWL, 0).seq)
    m = rds.info("memory")
    grown = m["used_memory"] - before - m.get("mem_clients_normal", 0)
    assert grown / n <= 16, grown / n


def test_bloom_bitmap_is_allocated_once_at_its_size(rds):
    f = frontier(rds, dedup="redis_bloom", expected_urls=100_000)
    push_all(f, items(0, 10))
    sk = keys.shard_keys(CRAWL, 0)
    m, k = dedup.bloom_size(100_000, 0.01)
    assert rds.strlen(sk.seen + ":bits") == math.ceil(m / 8)
    info = dedup.info(rds, CRAWL, 0)
    assert (info["m"], info["k"], info["capacity"], info["p"], info["n"]) == (m, k, 100_000, 0.01, 10)
    assert rds.memory_usage(sk.seen + ":bits") / 100_000 <= 1.5


def test_bloom_false_positive_rate_is_within_20_percent_of_the_configured_one(rds):
    """Fill a filter sized for 200,000 URLs at 1 % with 200,000 URLs, then
    probe it with 50,000 new ones pushed *to be recorded*: the script only
    tests seen for them (they go to skipseen), so seen stays at its fill."""
    n, probe = 200_000, 50_000
    f = frontier(rds, dedup="redis_bloom", expected_urls=n, bloom_fp_rate=0.01)
    queued, _, dups = push_all(f, items(0, n, payload=False), batch=1000)
    drop_queue(rds)
    # while it fills, each new URL is wrongly taken as seen with the rate of the fill so far
    m, k = dedup.bloom_size(n, 0.01)
    during = sum(dedup.estimated_fp_rate(i, m, k) for i in range(0, n, 100)) * 100
    assert queued + dups == n and dups == pytest.approx(during, rel=0.25), (dups, during)
    _, recorded, fps = push_all(f, items(n, n + probe, "out_of_scope", payload=False), batch=1000)
    assert recorded + fps == probe
    rate = fps / probe
    assert 0.008 <= rate <= 0.012, rate
    est = dedup.info(rds, CRAWL, 0)["fp_rate_est"]
    assert est == pytest.approx(0.01, rel=0.05)


def test_layout_is_recorded_per_shard_and_never_changes(rds):
    """A later Frontier with other sizing (e.g. after a shard-count change)
    keeps using the shard's recorded layout."""
    f1 = frontier(rds, dedup="redis_bloom", expected_urls=10_000)
    assert push_all(f1, items(0, 100)) == (100, 0, 0)
    before = dedup.info(rds, CRAWL, 0)
    f2 = frontier(rds, dedup="redis_bloom", expected_urls=5_000_000, bloom_fp_rate=0.001, num_shards=2)
    assert push_all(f2, items(0, 200)) == (100, 0, 100)
    after = dedup.info(rds, CRAWL, 0)
    assert {k: after[k] for k in ("m", "k", "capacity", "p")} == {k: before[k] for k in ("m", "k", "capacity", "p")}
    # a redis_set shard stays a redis_set shard too
    rds.flushall()
    push_all(frontier(rds, expected_urls=1000), items(0, 10))
    assert push_all(frontier(rds, expected_urls=10 ** 8, dedup="redis_bloom"), items(0, 20)) == (10, 0, 10)
    assert dedup.info(rds, CRAWL, 0) == {"backend": "set", "n": 20, "bits": 2}


def test_a_crawl_from_before_the_backends_keeps_its_plain_sets(rds):
    sk = keys.shard_keys(CRAWL, 0)
    old = items(0, 50)
    rds.sadd(sk.seen, *[it.fp for it in old])
    rds.sadd(sk.skipseen, *[it.fp for it in items(50, 60)])
    f = frontier(rds)
    assert push_all(f, items(0, 100)) == (50, 0, 50)
    assert push_all(f, items(50, 60, "nofollow")) == (0, 0, 10)
    assert rds.type(sk.seen) == b"set" and rds.scard(sk.seen) == 100
    assert dedup.info(rds, CRAWL, 0) == {"backend": "plain", "n": 100}
    it = items(99, 100)[0]
    assert dedup.contains(rds, CRAWL, 0, "seen", it.fp, it.pkey)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_key_the_push_writes_is_in_the_shards_cluster_slot(rds, backend):
    f = Frontier(rds, CrawlConfig.from_dict({"crawl_id": CRAWL, "num_shards": 3, "dedup": backend,
                                             "expected_urls": 30_000, "max_rps_per_host": 1000}))
    for shard in range(3):
        f.push(shard, items(0, 300) + items(300, 400, "out_of_scope"))
    for shard in range(3):
        slot = key_slot(keys.shard_keys(CRAWL, shard).seen.encode())
        mine = [k for k in rds.scan_iter(match="*") if key_slot(k) == slot]
        assert len(mine) > 5
        assert all(b"{s%d}" % shard in k for k in mine)
    written = {k.decode() for k in rds.scan_iter(match="*")}
    assert all(k.startswith("crawld:{s") and ":crawl:dd:" in k for k in written)
    assert len({key_slot(k.encode()) for k in written}) == 3


# -- the run summary and a crawl end to end --------------------------------
def test_bloom_report_and_summary_line(rds):
    cfg = CrawlConfig.from_dict({"crawl_id": CRAWL, "num_shards": 2, "dedup": "redis_bloom",
                                 "expected_urls": 2000, "max_rps_per_host": 1000})
    f = Frontier(rds, cfg)
    f.push(0, items(0, 600))
    f.push(1, items(600, 1000) + items(1000, 1100, "out_of_scope"))
    rep = dedup.bloom_report(rds, cfg)
    m, k = dedup.bloom_size(1000, 0.01)
    assert rep["urls"] == 1000 and rep["skip_urls"] == 100 and rep["impl"] == "lua"
    assert rep["capacity_per_shard"] == 1000
    assert rep["fp_rate_est"] == pytest.approx(dedup.estimated_fp_rate(600, m, k))
    assert rep["fp_rate_est_skip"] == pytest.approx(dedup.estimated_fp_rate(100, m, k))
    s = {"artifact": "a.parquet", "rows": 1, "duplicates_dropped": 0, "pages": 1, "outcomes": {"fetched": 1},
         "statuses": {}, "errors": 0, "not_fetched": {}, "wall_s": 1.0, "pages_per_s": 1.0, "hosts": {},
         "bloom": rep}
    line = [x for x in format_summary("c", s).splitlines() if x.startswith("bloom filter")]
    assert line and "1000 URLs to fetch" in line[0] and "false-positive rate" in line[0]


def _crawl(run_crawlctl, srv, redis_url, out, crawl_id, *extra):
    proc = run_crawlctl("run", f"http://{PYDOCS_HOST}/index.html", "--crawl-id", crawl_id, "--shards", "3",
                        "--workers", "16", "--max-rps-per-host", "400", "--max-inflight-per-host", "8",
                        "--proxy", srv.url, "--redis-url", redis_url, "--out", str(out), "--json", *extra)
    return summary_of(proc)


@pytest.mark.slow
def test_a_bloom_crawl_of_the_python_docs_gets_the_same_pages(run_crawlctl, site_server, redis_server, tmp_path):
    import redis as redis_mod

    redis_mod.Redis.from_url(redis_server.url).flushall()
    s_set = _crawl(run_crawlctl, site_server, redis_server.url, tmp_path / "set", "dd-set")
    s_bloom = _crawl(run_crawlctl, site_server, redis_server.url, tmp_path / "bloom", "dd-bloom",
                     "--set", "dedup=redis_bloom", "--set", "expected_urls=300000")
    assert "bloom" not in s_set
    rows = {}
    for name, s in (("set", s_set), ("bloom", s_bloom)):
        t = pq.read_table(s["artifact"], columns=["canonical_url", "outcome", "status"]).to_pylist()
        rows[name] = {(r["canonical_url"], r["outcome"], r["status"]) for r in t}
        assert len(rows[name]) == len(t) == s["rows"]
    assert rows["set"] == rows["bloom"]
    assert s_bloom["pages"] == s_set["pages"] > 400
    b = s_bloom["bloom"]
    assert b["impl"] == "lua" and b["fp_rate_configured"] == 0.01
    assert b["urls"] == s_bloom["pages"]  # every fetched URL went through the seen filter once
    assert b["skip_urls"] == sum(s_bloom["not_fetched"].values())
    assert 0 <= b["fp_rate_est"] < 1e-6  # a few thousand URLs in 100,000-URL filters
    # the private summary in text form names the filter too
    assert "bloom filter" in format_summary("dd-bloom", s_bloom)
