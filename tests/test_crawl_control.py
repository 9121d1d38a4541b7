"""Operating one crawl among several on a live crawld: ``crawlctl pause``,
``resume``, ``cancel`` and ``purge``, and Redis memory back-pressure
(``memory_high_watermark``), against real redis-server processes, a real
crawld daemon and the real HTTP site server."""

from __future__ import annotations

import time
import urllib.request

import redis as redis_mod
from prometheus_client.parser import text_string_to_metric_families

from conftest import crawlctl
from crawld import keys, status
from crawld.crawls import load_crawl
from crawld.frontier import Frontier, crawl_finished
from crawld.localredis import RedisServer, free_port
from crawld.sitesrv import SiteServer, SyntheticSite
from test_daemon import artifact_rows, events, seed, start_daemon, stop, wait_finished
from test_operator import wait_for


def hits_of(srv: SiteServer, hosts: list[str]) -> int:
    return sum(n for (host, _), n in srv.counts().items() if host in hosts)


def status_of(url: str, crawl_id: str) -> dict:
    """What ``crawlctl status --json`` shows (read in-process: faster)."""
    client = redis_mod.Redis.from_url(url)
    try:
        return status.crawl_status(Frontier(client, load_crawl(client, crawl_id)))
    finally:
        client.close()


def crawl_keys(client, crawl_id: str) -> set[bytes]:
    return {k for pattern in keys.crawl_patterns(crawl_id) for k in client.scan_iter(match=pattern, count=1000)}


A_HOSTS = ["www.alpha-pause.com", "www.beta-pause.org"]
B_HOSTS = ["www.gamma-pause.net", "www.delta-pause.io"]


def test_pause_stops_one_crawl_while_another_goes_on_and_resume_completes_it(tmp_path, own_redis):
    client = redis_mod.Redis.from_url(own_redis.url)
    # crawl a at 4 r/s (~10 s a site): still under way when the pause takes
    # effect, even on a loaded machine where crawlctl takes seconds to start
    a_site, b_site = SyntheticSite(pages=40), SyntheticSite(pages=120)
    sites = {**{h: a_site for h in A_HOSTS}, **{h: b_site for h in B_HOSTS}}
    with SiteServer(("127.0.0.1", 0), synthetic=sites, delay_s=0.05) as srv:
        a = seed(own_redis.url, "pause-a", tmp_path / "out", [f"http://{h}/" for h in A_HOSTS], "--shards", "2",
                 "--max-rps-per-host", "4")
        b = seed(own_redis.url, "pause-b", tmp_path / "out", [f"http://{h}/" for h in B_HOSTS], "--shards", "2",
                 "--max-rps-per-host", "10")
        d = start_daemon(own_redis.url, "0-1", tmp_path / "log", CRAWLD_PROXY=srv.url)
        try:
            wait_for(lambda: hits_of(srv, A_HOSTS) > 6, what="crawl a under way")
            p = crawlctl("pause", "--crawl-id", "pause-a", "--redis-url", own_redis.url)
            assert p.returncode == 0, p.stderr
            assert "paused" in p.stdout
            # in-flight fetches of a finish and are acked: nothing stays claimed
            fa = Frontier(client, a)
            wait_for(lambda: sum(s.claimed for s in fa.snapshots()) == 0, 10, "a's claims acked")
            time.sleep(1.0)
            a_hits, b_hits = hits_of(srv, A_HOSTS), hits_of(srv, B_HOSTS)
            time.sleep(2.0)
            assert hits_of(srv, A_HOSTS) == a_hits, "a paused crawl was fetched"
            assert hits_of(srv, B_HOSTS) > b_hits + 10, "the other crawl must go on"
            st = status_of(own_redis.url, "pause-a")
            assert st["state"] == "paused" and not st["finished"] and st["totals"]["queued"] > 0
            assert st["totals"]["leased"] == 2  # still served, only not claimed from
            text = crawlctl("status", "--crawl-id", "pause-a", "--redis-url", own_redis.url).stdout
            assert text.splitlines()[0].startswith("crawl pause-a: paused, not finished")
            r = crawlctl("resume", "--crawl-id", "pause-a", "--redis-url", own_redis.url)
            assert r.returncode == 0 and "resumed" in r.stdout, r.stderr
            wait_finished(client, a)
            wait_finished(client, b)
            assert status_of(own_redis.url, "pause-a")["state"] == "active"
        finally:
            assert stop(d) == 0
        counts = srv.counts()
    rows = artifact_rows(own_redis.url, "pause-a")
    assert sorted(r["url"] for r in rows) == sorted(f"http://{h}{p}" for h in A_HOSTS for p in a_site.paths())
    assert max(counts.values()) == 1, "a page was fetched twice"
    ev = [e["event"] for e in events(tmp_path / "log") if e.get("crawl_id") == "pause-a"]
    assert ev.count("crawl_paused") == 2 and ev.count("crawl_resumed") == 2  # once per shard worker


C_HOSTS = ["www.alpha-cancel.com", "www.beta-cancel.org"]
D_HOSTS = ["www.gamma-cancel.net"]


def test_cancel_stops_serving_a_crawl_and_purge_deletes_only_its_keys(tmp_path, own_redis):
    client = redis_mod.Redis.from_url(own_redis.url)
    c_site, d_site = SyntheticSite(pages=200), SyntheticSite(pages=30)
    sites = {**{h: c_site for h in C_HOSTS}, **{h: d_site for h in D_HOSTS}}
    with SiteServer(("127.0.0.1", 0), synthetic=sites, delay_s=0.05) as srv:
        c = seed(own_redis.url, "cancel-c", tmp_path / "out", [f"http://{h}/" for h in C_HOSTS], "--shards", "2",
                 "--max-rps-per-host", "10")
        dcfg = seed(own_redis.url, "done-d", tmp_path / "out", [f"http://{h}/" for h in D_HOSTS], "--shards", "2",
                    "--max-rps-per-host", "50")
        d = start_daemon(own_redis.url, "0-1", tmp_path / "log", CRAWLD_PROXY=srv.url)
        try:
            wait_for(lambda: hits_of(srv, C_HOSTS) > 6, what="crawl c under way")
            # an active, unfinished crawl is not purged
            refused = crawlctl("purge", "--crawl-id", "cancel-c", "--redis-url", own_redis.url)
            assert refused.returncode == 1
            assert refused.stderr.startswith("crawlctl: error: crawl cancel-c is active and not finished (")
            assert len(refused.stderr.strip().splitlines()) == 1
            assert client.sismember(keys.CRAWLS, "cancel-c")
            p = crawlctl("cancel", "--crawl-id", "cancel-c", "--redis-url", own_redis.url)
            assert p.returncode == 0 and "cancelled" in p.stdout, p.stderr
            f = Frontier(client, c)
            # the daemon finishes what it holds, then stops serving the crawl
            wait_for(lambda: all(f.leaseholder(s) is None for s in range(2)), 15, "c's leases given up")
            assert sum(s.claimed for s in f.snapshots()) == 0
            c_hits = hits_of(srv, C_HOSTS)
            wait_finished(client, dcfg)
            time.sleep(1.0)
            assert hits_of(srv, C_HOSTS) == c_hits, "a cancelled crawl was fetched"
            assert all(f.leaseholder(s) is None for s in range(2)), "a cancelled crawl is served again"
            st = status_of(own_redis.url, "cancel-c")
            assert st["state"] == "cancelled" and st["totals"]["queued"] > 0
            assert crawlctl("status", "--crawl-id", "cancel-c", "--redis-url", own_redis.url).stdout.startswith(
                "crawl cancel-c: cancelled, not finished")
            again = crawlctl("resume", "--crawl-id", "cancel-c", "--redis-url", own_redis.url)
            assert again.returncode == 1 and "is cancelled" in again.stderr
            # a cancelled crawl can still be merged
            c_rows = artifact_rows(own_redis.url, "cancel-c")
            assert 0 < len(c_rows) and len({r["url"] for r in c_rows}) == len(c_rows)

            # purge the finished crawl while the daemon runs: nothing of it
            # is left, the cancelled crawl's keys are untouched
            c_keys = crawl_keys(client, "cancel-c")
            d_keys = crawl_keys(client, "done-d")
            assert d_keys and keys.crawl_config("done-d").encode() in d_keys
            purged = crawlctl("purge", "--crawl-id", "done-d", "--redis-url", own_redis.url)
            assert purged.returncode == 0, purged.stderr
            n = int(purged.stdout.split("deleted ")[1].split()[0])
            assert n >= len(d_keys) - 2  # a lease may have expired meanwhile
            time.sleep(1.5)  # a worker that recreated a key would have done so by now
            assert crawl_keys(client, "done-d") == set()
            assert not client.sismember(keys.CRAWLS, "done-d")
            assert crawl_keys(client, "cancel-c") == c_keys
            gone = crawlctl("status", "--crawl-id", "done-d", "--redis-url", own_redis.url)
            assert gone.returncode == 66 and "no crawl 'done-d'" in gone.stderr
            # and the cancelled crawl can be purged too
            pc = crawlctl("purge", "--crawl-id", "cancel-c", "--redis-url", own_redis.url)
            assert pc.returncode == 0 and f"deleted {len(c_keys)} key(s)" in pc.stdout, pc.stdout + pc.stderr
            assert crawl_keys(client, "cancel-c") == set() and client.scard(keys.CRAWLS) == 0
            assert d.poll() is None
        finally:
            assert stop(d) == 0
        counts = srv.counts()
    assert max(counts.values()) == 1
    ev = events(tmp_path / "log")
    assert sum(1 for e in ev if e["event"] == "crawl_retired" and e.get("crawl_id") == "cancel-c") == 2
    assert not [e for e in ev if e.get("level") == "error"], [e for e in ev if e.get("level") == "error"][:3]


BP_HOSTS = ["www.alpha-memory.com", "www.beta-memory.org"]


def scrape(port: int) -> dict[str, list[tuple[dict, float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_memory_backpressure_spills_links_as_rows_and_never_hits_oom(tmp_path):
    """Redis with a small maxmemory (noeviction) and a low watermark: the
    crawl grows its frontier until the watermark, then records new links as
    ``skipped``/``memory_backpressure`` rows instead of queueing them, and
    finishes with every discovered link accounted for and no OOM error."""
    site = SyntheticSite(pages=1000, extra_links=4)
    port = free_port()
    with RedisServer() as rs, SiteServer(("127.0.0.1", 0), synthetic={h: site for h in BP_HOSTS}) as srv:
        client = redis_mod.Redis.from_url(rs.url)
        log = tmp_path / "log"
        d = start_daemon(rs.url, "0-1", log, CRAWLD_PROXY=srv.url, METRICS_PORT=str(port),
                         PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prom"))
        try:
            # 200 r/s per site: discovery (6 links a page) outruns fetching, so
            # the frontier grows past the watermark however fast the machine
            cfg = seed(rs.url, "memory", tmp_path / "out", [f"http://{h}/" for h in BP_HOSTS], "--shards", "2",
                       "--max-rps-per-host", "200", "--max-inflight-per-host", "8",
                       "--set", "memory_high_watermark=0.25")
            # Redis gets its maxmemory once the crawl runs (scripts loaded,
            # connections open): the watermark is 250 KiB above that
            wait_for(lambda: len(srv.hits()) >= 10, 30, "the crawl to start")
            base = int(client.info("memory")["used_memory"])
            maxmemory = int((base + 250 * 1024) / 0.25)
            client.config_set("maxmemory", maxmemory)
            watermark = cfg.memory_high_watermark
            f, prev, peak, t0 = Frontier(client, cfg), None, 0, time.monotonic()
            while True:
                peak = max(peak, int(client.info("memory")["used_memory"]))
                snaps = f.snapshots()
                if crawl_finished(prev, snaps):
                    break
                assert time.monotonic() - t0 < 60, f"the crawl did not finish: {snaps}"
                prev = snaps
                time.sleep(0.2)
            time.sleep(1.0)
            m = scrape(port)
        finally:
            assert stop(d) == 0
        counts = srv.counts()
        rows = artifact_rows(rs.url, "memory")
    spilled = [r for r in rows if r["error"] == "memory_backpressure"]
    fetched = [r for r in rows if r["status"] == 200]
    print(f"\nback-pressure: base {base} B, maxmemory {maxmemory} B, watermark {watermark}, peak {peak} B; "
          f"{len(fetched)} fetched, {len(spilled)} spilled rows")
    assert spilled and all(r["outcome"] == "skipped" for r in spilled)
    assert len(fetched) > 50, "the crawl expands until the watermark"
    assert peak < maxmemory
    # nothing lost: every link of every fetched page is a row
    urls = {r["canonical_url"] for r in rows}
    missing = {link for r in fetched for link in r["outlinks"]} - urls
    assert not missing, sorted(missing)[:5]
    assert max(counts.values()) == 1
    assert len(fetched) == sum(counts.values()) - len(BP_HOSTS)  # robots.txt once per host
    text = log.read_text(errors="replace")
    assert "OOM" not in text and "commit_failed" not in text
    ev = [e for e in events(log) if e.get("crawl_id") == "memory"]
    assert any(e["event"] == "memory_backpressure_on" for e in ev)
    spill_total = sum(v for lab, v in m.get("crawld_links_spilled_total", []) if lab.get("crawl_id") == "memory")
    assert spill_total >= len(spilled)
    assert "crawld_memory_backpressure" in m
