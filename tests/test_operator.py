"""The operator's view of a live crawl: /metrics aggregated across the
worker processes of a real crawld, ``crawlctl status``, ``crawlctl drain``
and ``crawlctl reclaim``, and the live progress line of ``crawlctl run``."""

from __future__ import annotations

import io
import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest
import redis as redis_mod
from prometheus_client.parser import text_string_to_metric_families

from conftest import crawlctl
from crawld import keys
from crawld.frontier import Frontier, PushItem, ShardSnapshot
from crawld.localredis import free_port
from crawld.runner import Progress
from crawld.sitesrv import SiteServer, SyntheticSite
from test_daemon import artifact_rows, children, seed, start_daemon, stop, wait_finished

HOSTS = ["www.alpha-metrics.com", "www.beta-metrics.org", "www.gamma-metrics.net", "www.delta-metrics.io"]
PAGES = 25


def scrape(port: int) -> dict[str, list[tuple[dict, float]]]:
    """Samples by name: [(labels, value)]."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def total(samples, name: str, **match) -> float:
    return sum(v for labels, v in samples.get(name, []) if all(labels.get(k) == w for k, w in match.items()))


def wait_for(cond, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def test_metrics_aggregate_every_worker_process_of_a_live_crawl(tmp_path, own_redis):
    client = redis_mod.Redis.from_url(own_redis.url)
    port = free_port()
    mdir = tmp_path / "prom"
    site = SyntheticSite(pages=PAGES)
    with SiteServer(("127.0.0.1", 0), synthetic={h: site for h in HOSTS}, delay_s=0.02) as srv:
        cfg = seed(own_redis.url, "metrics", tmp_path / "out", [f"http://{h}/" for h in HOSTS], "--shards", "2",
                   "--max-rps-per-host", "20")
        d = start_daemon(own_redis.url, "0-1", tmp_path / "log", CRAWLD_PROXY=srv.url, METRICS_PORT=str(port),
                         PROMETHEUS_MULTIPROC_DIR=str(mdir))
        try:
            live = wait_for(lambda: (lambda m: m if total(m, "crawld_fetches_total") > 10 else None)(
                _try_scrape(port)), what="fetches in /metrics")
            assert total(live, "crawld_shard_queued") + total(live, "crawld_shard_claimed") > 0
            wait_finished(client, cfg)
            time.sleep(0.5)  # the last group commit
            m = scrape(port)
            (tmp_path.parent / "metrics-scrape.txt").write_text(
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
            pages = len(HOSTS) * len(site.paths())
            acked = sum(int(client.hget(keys.shard_keys("metrics", s).stats, "acked") or 0) for s in range(2))
            # counters from both worker processes, summed by the supervisor
            assert {lab["shard"] for lab, _ in m["crawld_rows_written_total"]} == {"0", "1"}
            assert total(m, "crawld_rows_written_total") == acked == pages
            assert total(m, "crawld_acks_total") == acked
            assert total(m, "crawld_fetches_total", status_class="2xx") == pages
            assert total(m, "crawld_fetch_duration_seconds_count") == pages
            assert total(m, "crawld_robots_fetches_total") == len(HOSTS)
            assert total(m, "crawld_links_discovered_total") >= pages - len(HOSTS)
            assert total(m, "crawld_dedup_hits_total") > 0
            assert total(m, "crawld_politeness_breaches_total") == 0
            # gauges read from Redis at scrape time, per shard
            for shard in ("0", "1"):
                assert total(m, "crawld_shard_queued", crawl_id="metrics", shard=shard) == 0
                assert total(m, "crawld_shard_claimed", crawl_id="metrics", shard=shard) == 0
                assert total(m, "crawld_shard_leaseholder_present", crawl_id="metrics", shard=shard) == 1
                assert total(m, "crawld_lease_held", crawl_id="metrics", shard=shard) == 1
                assert total(m, "crawld_child_up", child=f"worker-{shard}") == 1
            assert total(m, "crawld_shard_acked") == acked
            assert total(m, "crawld_redis_up") == 1 and total(m, "crawld_redis_used_memory_bytes") > 0
            assert [lab["version"] for lab, _ in m["crawld_build_info"]]
            assert total(m, "crawld_worker_restarts_total") == 0
            # a worker killed: restarted, counted, its counters kept and its
            # live gauges forgotten
            victim = children(d, "crawld.worker")["0"]
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: children(d, "crawld.worker").get("0") not in (None, victim), what="restart")
            wait_for(lambda: total(_try_scrape(port), "crawld_lease_held", shard="0") == 1, what="lease again")
            m2 = scrape(port)
            assert total(m2, "crawld_worker_restarts_total", child="worker-0") == 1
            assert total(m2, "crawld_rows_written_total") == pages
            assert list(mdir.glob(f"counter_{victim}.db")), "a dead worker's counters must stay"
            assert not list(mdir.glob(f"gauge_live*_{victim}.db")), "a dead worker's live gauges must go"
            assert list(mdir.glob("gauge_live*.db"))
        finally:
            assert stop(d) == 0
    assert list(mdir.glob("counter_*.db")) and not list(mdir.glob("gauge_live*.db"))


def _try_scrape(port: int) -> dict:
    try:
        return scrape(port)
    except OSError:
        return {}


def test_status_shows_every_shard_and_the_totals(tmp_path, own_redis):
    client = redis_mod.Redis.from_url(own_redis.url)
    site = SyntheticSite(pages=10)
    with SiteServer(("127.0.0.1", 0), synthetic={h: site for h in HOSTS}) as srv:
        cfg = seed(own_redis.url, "status", tmp_path / "out", [f"http://{h}/" for h in HOSTS], "--shards", "3",
                   "--max-rps-per-host", "50")
        before = crawlctl("status", "--crawl-id", "status", "--json", "--redis-url", own_redis.url)
        assert before.returncode == 0, before.stderr
        st = json.loads(before.stdout)
        assert [s["shard"] for s in st["shards"]] == [0, 1, 2]
        assert st["totals"]["queued"] == len(HOSTS) and not st["finished"] and st["totals"]["leased"] == 0
        d = start_daemon(own_redis.url, "0-2", tmp_path / "log", CRAWLD_PROXY=srv.url)
        try:
            wait_finished(client, cfg)
            time.sleep(1.0)
            after = crawlctl("status", "--crawl-id", "status", "--json", "--redis-url", own_redis.url)
            text = crawlctl("status", "--crawl-id", "status", "--redis-url", own_redis.url)
        finally:
            stop(d)
    st = json.loads(after.stdout)
    pages = len(HOSTS) * len(site.paths())
    assert st["finished"] and st["totals"]["fetched"] == pages and st["totals"]["errors"] == 0
    assert st["state"] == "active"
    assert st["totals"]["claimed"] == 0 and st["totals"]["leased"] == 3
    assert all(s["leaseholder"] for s in st["shards"])
    assert [sup["shards"] for sup in st["supervisors"].values()] == ["0-2"]
    lines = text.stdout.splitlines()
    assert lines[0] == "crawl status: active, finished (every shard empty, nothing claimed)"
    assert lines[1].split()[:4] == ["shard", "queued", "hosts", "claimed"]
    assert lines[5].split()[0] == "total" and "3/3 leased" in lines[5]
    assert "crawld " in text.stdout and "children up" in text.stdout
    missing = crawlctl("status", "--crawl-id", "nosuch", "--redis-url", own_redis.url)
    assert missing.returncode == 66 and missing.stderr.startswith("crawlctl: error: crawl_id: no crawl")


def test_drain_through_redis_then_cancel(tmp_path, own_redis):
    """``crawlctl drain --wait``: the workers stop claiming, finish what
    they hold, give their leases up; nothing is fetched until --cancel,
    then the crawl completes with every page fetched once."""
    client = redis_mod.Redis.from_url(own_redis.url)
    site = SyntheticSite(pages=40)
    with SiteServer(("127.0.0.1", 0), synthetic={h: site for h in HOSTS}, delay_s=0.2) as srv:
        cfg = seed(own_redis.url, "drainctl", tmp_path / "out", [f"http://{h}/" for h in HOSTS], "--shards", "2",
                   "--max-rps-per-host", "10")
        d = start_daemon(own_redis.url, "0-1", tmp_path / "log", CRAWLD_PROXY=srv.url)
        f = Frontier(client, cfg)
        try:
            wait_for(lambda: sum(srv.counts().values()) > 20, what="crawl under way")
            t0 = time.monotonic()
            p = crawlctl("drain", "--wait", "30", "--redis-url", own_redis.url)
            drain_s = time.monotonic() - t0
            assert p.returncode == 0, p.stderr
            assert "drained" in p.stdout
            snaps = f.snapshots()
            assert sum(s.claimed for s in snaps) == 0 and sum(s.queued for s in snaps) > 0
            assert all(f.leaseholder(s) is None for s in range(2))
            hits = sum(srv.counts().values())
            time.sleep(1.5)
            assert sum(srv.counts().values()) == hits, "fetched while drained"
            st = json.loads(crawlctl("status", "--crawl-id", "drainctl", "--json", "--redis-url", own_redis.url).stdout)
            assert st["drain_requested"] == ["all"] and st["totals"]["leased"] == 0
            assert d.poll() is None  # drained workers wait, they do not exit
            c = crawlctl("drain", "--cancel", "--redis-url", own_redis.url)
            assert c.returncode == 0, c.stderr
            wait_finished(client, cfg)
        finally:
            assert stop(d) == 0
        counts = srv.counts()
    print(f"\ndrain via Redis: {drain_s:.2f} s until no lease and nothing claimed")
    rows = artifact_rows(own_redis.url, "drainctl")
    assert sorted(r["url"] for r in rows) == sorted(f"http://{h}{p}" for h in HOSTS for p in site.paths())
    assert max(counts.values()) == 1
    assert client.hlen(keys.DRAIN) == 0


def test_reclaim_command_returns_expired_claims(tmp_path, own_redis):
    client = redis_mod.Redis.from_url(own_redis.url)
    cfg = seed(own_redis.url, "reclaimctl", tmp_path / "out", [f"http://{h}/" for h in HOSTS], "--shards", "1",
               "--visibility-timeout", "1", "--max-rps-per-host", "50")
    f = Frontier(client, cfg)
    _, claims = f.claim(0, 10)
    assert len(claims) == len(HOSTS)
    early = crawlctl("reclaim", "--crawl-id", "reclaimctl", "--redis-url", own_redis.url)
    assert early.returncode == 0 and early.stdout.strip() == "crawl reclaimctl: requeued=0 dead_lettered=0"
    time.sleep(1.2)
    p = crawlctl("reclaim", "--redis-url", own_redis.url)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"crawl reclaimctl: requeued={len(HOSTS)} dead_lettered=0"
    snap = f.snapshot(0)
    assert snap.claimed == 0 and snap.queued == len(HOSTS)


def test_progress_line_only_on_a_terminal():
    snaps = [ShardSnapshot(0, 5, 2, 3, 0, {"acked": 40, "rows_error": 2}), ShardSnapshot(1, 1, 1, 0, 1, {"acked": 10})]
    on, off = io.StringIO(), io.StringIO()
    p_on, p_off = Progress(on, True), Progress(off, False)
    p_on._last = p_off._last = -10.0
    p_on.update(snaps)
    p_off.update(snaps)
    p_on.done()
    p_off.done()
    line = on.getvalue()
    assert line.startswith("\r  pages 50  queued 6  in flight 3  errors 2  dead 1 ") and line.endswith("\n")
    assert off.getvalue() == ""


def test_crawlctl_run_without_a_terminal_prints_no_progress(tmp_path):
    with SiteServer(("127.0.0.1", 0), synthetic={HOSTS[0]: SyntheticSite(pages=3)}) as srv:
        p = crawlctl("run", f"http://{HOSTS[0]}/", "--shards", "1", "--max-rps-per-host", "50",
                     "--proxy", srv.url, "--out", str(tmp_path), timeout=120)
    assert p.returncode == 0, p.stderr
    assert "\r" not in p.stderr and "pages/s" not in p.stderr


def test_a_crawl_with_an_unwritable_output_does_not_stop_the_others(tmp_path, own_redis):
    """One crawl whose output cannot be created is logged and retried; the
    worker's periodic tasks survive it and every other crawl is served."""
    client = redis_mod.Redis.from_url(own_redis.url)
    site = SyntheticSite(pages=5)
    with SiteServer(("127.0.0.1", 0), synthetic={h: site for h in HOSTS[:2]}) as srv:
        seed(own_redis.url, "aaa-unwritable", Path("/proc/crawld-not-writable"), [f"http://{HOSTS[0]}/"],
             "--shards", "2", "--max-rps-per-host", "50")
        d = start_daemon(own_redis.url, "0-1", tmp_path / "log", CRAWLD_PROXY=srv.url)
        try:
            time.sleep(2.5)  # discovery has met the bad crawl
            good = seed(own_redis.url, "zzz-good", tmp_path / "out", [f"http://{HOSTS[1]}/"], "--shards", "2",
                        "--max-rps-per-host", "50")
            wait_finished(client, good, timeout=60)
        finally:
            assert stop(d) == 0
    text = (tmp_path / "log").read_text()
    assert "Traceback" not in text, text[-3000:]
    evs = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert any(e["event"] == "crawl_not_served" and e["crawl_id"] == "aaa-unwritable" for e in evs)
    rows = artifact_rows(own_redis.url, "zzz-good")
    assert len(rows) == len(site.paths())


def test_set_cannot_replace_the_crawl_id_or_the_seeds(own_redis, tmp_path):
    for name in ("crawl_id", "seeds"):
        p = crawlctl("seed", "http://www.a-set.com/", "--crawl-id", "setx", "--set", f"{name}=other",
                     "--out", str(tmp_path), "--redis-url", own_redis.url)
        assert p.returncode == 64 and p.stderr.startswith(f"crawlctl: error: --set {name}: give it as"), p.stderr
    assert not redis_mod.Redis.from_url(own_redis.url).exists(keys.crawl_config("other"))


def test_crawld_refuses_a_missing_config_file_named_on_the_command_line():
    from test_daemon import CRAWLD
    import subprocess
    p = subprocess.run([CRAWLD, "--check", "--shards", "0", "--config", "/nonexistent/typo.json"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 78 and p.stderr == "crawld: error: --config /nonexistent/typo.json: no such file\n"
