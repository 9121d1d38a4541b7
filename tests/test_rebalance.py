"""``crawlctl rebalance``: changing the shard count of a live crawl, against a
real redis-server, a real crawld daemon and the real HTTP site server; plus
the pure planning (which politeness keys move where)."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import crawlctl
from crawld import dedup, keys
from crawld.config import CrawlConfig
from crawld.crawls import load_crawl
from crawld.frontier import Entry, Frontier, PushItem
from crawld.ratecheck import rate_violations
from crawld.redisconn import connect
from crawld.rebalance import Rebalancer, RebalanceError, host_pkey, plan, target_shards
from crawld.scope import Router
from crawld.sharding import politeness_key, shard_for, shard_of
from crawld.sitesrv import SiteServer, SyntheticSite
from crawld.urls import fingerprint
from test_crawl_control import wait_for
from test_daemon import artifact_rows, seed, start_daemon, stop, wait_finished


# -- planning ---------------------------------------------------------------
def test_plan_growing_moves_keys_only_to_the_new_shards():
    domains = [f"site{i}.example" for i in range(2000)]
    moves = plan(domains, 2, 4)
    assert moves and all(a in (0, 1) and b in (2, 3) for a, b in moves.values())
    assert all(shard_of(d, 4) == (moves[d][1] if d in moves else shard_of(d, 2)) for d in domains)
    assert 0.35 < len(moves) / len(domains) < 0.65  # ~ (4 - 2) / 4
    for src in (0, 1):
        assert target_shards(src, 2, 4) == [2, 3]


def test_plan_shrinking_moves_only_the_removed_shards_keys():
    domains = [f"site{i}.example" for i in range(2000)]
    moves = plan(domains, 4, 2)
    assert {d for d in domains if shard_of(d, 4) >= 2} == set(moves)
    assert all(b in (0, 1) for _, b in moves.values())
    assert target_shards(0, 4, 2) == [] and target_shards(3, 4, 2) == [0, 1]


def test_plan_honours_overrides_and_host_fields():
    d = next(f"site{i}.example" for i in range(100) if shard_of(f"site{i}.example", 4) == 3)
    assert plan([d], 2, 4) == {d: (shard_of(d, 2), 3)}
    assert plan([d], 2, 4, {d: 1}) == {} and shard_for(d, 4, {d: 1}) == 1  # pinned keys never move
    assert plan([d], 4, 2, {d: 0}) == {}
    assert host_pkey("www.a.example.co.uk") == "example.co.uk"
    assert host_pkey("www.a.org:8080/path") == "a.org"  # variants: host[:port]/path
    assert host_pkey("http://docs.python.org:80") == "python.org"  # robots: origin
    assert host_pkey("") is None


# -- live crawl ----------------------------------------------------------------
def pick_hosts(old: int, new: int, n: int) -> list[str]:
    """Hosts of distinct domains, so that some move to every new shard
    (growing) or from every removed shard (shrinking)."""
    hosts, want = [], set(range(min(old, new), max(old, new)))
    for i in range(1000):
        h = f"www.rb{i}-site.com"
        pk = politeness_key(h)
        if shard_of(pk, max(old, new)) in want:
            hosts.append(h)
            want.discard(shard_of(pk, max(old, new)))
        if not want:
            break
    i = 0
    while len(hosts) < n:
        h = f"www.rbx{i}-site.org"
        if h not in hosts:
            hosts.append(h)
        i += 1
    return hosts


@pytest.mark.parametrize("old,new", [(2, 4), (4, 2)])
def test_rebalance_a_live_crawl(tmp_path, own_redis, old, new):
    live_rebalance(tmp_path, own_redis.url, old, new)


def live_rebalance(tmp_path, redis_url: str, old: int, new: int) -> None:
    """A crawl of 8 synthetic sites on ``old`` shards, served by a crawld
    daemon for shards 0-3, rebalanced to ``new`` shards while it runs; it
    then completes with every URL fetched once, politely, one row each
    (test_cluster.py runs it on a Redis Cluster)."""
    client = connect(redis_url)
    hosts = pick_hosts(old, new, 8)
    site = SyntheticSite(pages=40)
    rps = 10.0
    cid = f"rb-{old}-{new}"
    with SiteServer(("127.0.0.1", 0), synthetic={h: site for h in hosts}, delay_s=0.02) as srv:
        seed(redis_url, cid, tmp_path / "out", [f"http://{h}/" for h in hosts], "--shards", str(old),
             "--max-rps-per-host", str(rps))
        d = start_daemon(redis_url, "0-3", tmp_path / "log", CRAWLD_PROXY=srv.url)
        try:
            wait_for(lambda: sum(srv.counts().values()) > 40, what="crawl under way")
            t0 = time.monotonic()
            r = crawlctl("rebalance", "--crawl-id", cid, "--num-shards", str(new), "--redis-url", redis_url)
            took, t_done = time.monotonic() - t0, time.time()
            assert r.returncode == 0, r.stderr
            assert f"rebalanced from {old} to {new} shards" in r.stdout
            cfg = load_crawl(client, cid)
            assert cfg.num_shards == new
            assert (client.get(keys.crawl_state(cid)) or b"active") == b"active"
            assert not client.exists(keys.crawl_rebalance(cid))
            assert sum(srv.counts().values()) < len(hosts) * len(site.paths()), "crawl finished too early"
            wait_finished(client, cfg, timeout=60)
            leftovers = [k for s in range(new, old) for k in client.scan_iter(match=f"crawld:{{{cid}:{s}}}:*")]
            assert leftovers == []
        finally:
            assert stop(d) == 0
        hits = srv.hits()
    print(f"\nrebalance {old} -> {new}: {took:.2f} s")
    counts = srv.counts()
    assert max(counts.values()) == 1, "a URL was fetched twice"
    expected = {(h, p) for h in hosts for p in site.paths()}
    assert {k for k in counts if k[1] != "/robots.txt"} == expected
    by_domain: dict[str, list[float]] = {}
    for h in hits:
        by_domain.setdefault(politeness_key(h.host), []).append(h.t)
    assert rate_violations(by_domain, rps) == {}
    rows = artifact_rows(redis_url, cid)
    v = crawlctl("verify", "--crawl-id", cid, "--redis-url", redis_url)
    assert v.returncode == 0, v.stdout + v.stderr
    urls = [r["url"] for r in rows]
    assert sorted(urls) == sorted(f"http://{h}{p}" for h, p in expected)
    served = {r["shard"] for r in rows}
    if new > old:
        assert {2, 3} <= served, f"the new shards served nothing: {served}"
    else:
        assert {2, 3} <= served  # before the rebalance
        after = {r["shard"] for r in rows if _ts(r["fetched_at"]) > t_done + 0.5}
        assert after and after <= {0, 1}, f"shards >= 2 served after the shrink: {after}"


def _ts(v) -> float:
    return v.timestamp() if hasattr(v, "timestamp") else float(v)


# -- visited state -----------------------------------------------------------
PINNED = "pinned.example"


def _urls(n_domains: int) -> list[str]:
    return [f"http://www.d{i}.example/p/{j}" for i in range(n_domains) for j in range(5)] + \
        [f"http://{PINNED}/p/{j}" for j in range(5)]


def _push(client, cfg: CrawlConfig, urls: list[str], mode: str = "") -> tuple[int, int, int]:
    router, fr = Router(cfg), Frontier(client, cfg)
    by_shard: dict[int, list[PushItem]] = {}
    for u in urls:
        r = router.route(u)
        by_shard.setdefault(r.shard, []).append(
            PushItem(fingerprint(u), r.pkey, r.host, "", mode, Entry(u, u, 1).to_payload()))
    tot = [0, 0, 0]
    for s, its in by_shard.items():
        for i, x in enumerate(fr.push(s, its)):
            tot[i] += x
    return tuple(tot)


def _where(client, cid: str, n: int, structure: str, url: str) -> set[int]:
    pkey = politeness_key(url.split("/")[2])
    return {s for s in range(n) if dedup.contains(client, cid, s, structure, fingerprint(url), pkey)}


@pytest.mark.parametrize("old,new", [(2, 5), (5, 2)])
def test_rebalance_moves_exactly_the_visited_entries_of_the_domains_that_move(rds, old, new):
    cid = f"visited-{old}-{new}"
    cfg = CrawlConfig.from_dict({"crawl_id": cid, "num_shards": old, "expected_urls": 20_000,
                                 "shard_overrides": {PINNED: 1}})
    rds.set(keys.crawl_config(cid), cfg.to_json())
    urls = _urls(300)
    skips = [u + "?skip" for u in urls[::3]]
    assert _push(rds, cfg, urls) == (len(urls), 0, 0)
    assert _push(rds, cfg, skips, "out_of_scope") == (0, len(skips), 0)
    lines: list[str] = []
    r = Rebalancer(rds, cid, new, wait_s=5, log=lines.append).run()
    new_cfg = load_crawl(rds, cid)
    moved_domains = {politeness_key(u.split("/")[2]) for u in urls} - {PINNED}
    moved_domains = {d for d in moved_domains if shard_for(d, old) != shard_for(d, new)}
    assert moved_domains
    moved_urls = [u for u in urls if politeness_key(u.split("/")[2]) in moved_domains]
    assert r["visited_moved"] == len(moved_urls) + sum(1 for u in skips if u.split("?")[0] in moved_urls)
    for structure, us in (("seen", urls), ("skipseen", skips)):
        for u in us:
            pkey = politeness_key(u.split("/")[2])
            where = _where(rds, cid, new, structure, u)
            if pkey == PINNED:
                assert 1 in where  # pinned: never moves (a copy elsewhere is harmless)
            else:
                assert where == {shard_for(pkey, new)}, (u, structure, where)
    n = sum(dedup.info(rds, cid, s)["n"] for s in range(new))
    assert n == len(urls) + sum(len(_where(rds, cid, new, "seen", u)) - 1 for u in urls[-5:])
    # every URL seen before the rebalance is a duplicate on its new shard
    assert _push(rds, new_cfg, urls) == (0, 0, len(urls))
    assert _push(rds, new_cfg, skips, "out_of_scope") == (0, 0, len(skips))
    assert any("visited entries of seen" in line for line in lines), lines


def test_a_bloom_crawl_copies_its_filters_to_the_shards_that_receive_domains(rds):
    cid = "visited-bloom"
    cfg = CrawlConfig.from_dict({"crawl_id": cid, "num_shards": 2, "expected_urls": 20_000,
                                 "dedup": "redis_bloom"})
    rds.set(keys.crawl_config(cid), cfg.to_json())
    urls = _urls(100)
    assert _push(rds, cfg, urls) == (len(urls), 0, 0)
    r = Rebalancer(rds, cid, 4, wait_s=5).run()
    assert r["visited_moved"] == 0  # nothing removed: a filter's entries cannot be told apart
    for u in urls:
        assert shard_for(politeness_key(u.split("/")[2]), 4) in _where(rds, cid, 4, "seen", u)
    assert _push(rds, load_crawl(rds, cid), urls) == (0, 0, len(urls))


def test_shrinking_from_many_shards_leaves_no_lease_behind_and_logs_only_moves(rds):
    """1024 -> 3 shards of a crawl of 8 seeds: every lease the rebalancer
    took is gone at the end (none renewed on a removed shard), and it logs
    the shards that moved something, not every shard."""
    cid = "many-shards"
    cfg = CrawlConfig.from_dict({"crawl_id": cid, "num_shards": 1024, "expected_urls": 100_000})
    rds.set(keys.crawl_config(cid), cfg.to_json())
    rds.set(keys.crawl_state(cid), "paused")
    urls = [f"http://www.m{i}.example/" for i in range(8)]
    assert _push(rds, cfg, urls) == (8, 0, 0)
    lines: list[str] = []
    r = Rebalancer(rds, cid, 3, wait_s=5, lease_ttl_s=0.6, log=lines.append).run()
    assert r["state"] == "paused" and rds.get(keys.crawl_state(cid)) == b"paused"
    leases = list(rds.scan_iter(match=f"crawld:{{{cid}:*}}:lease", count=10_000))
    assert leases == []
    time.sleep(0.5)  # a renewal pass would have run by now
    assert list(rds.scan_iter(match=f"crawld:{{{cid}:*}}:lease", count=10_000)) == []
    assert 0 < len(lines) <= 2 * 8, lines
    assert sum(Frontier(rds, load_crawl(rds, cid)).snapshot(s).queued for s in range(3)) == 8


def test_a_bloom_crawl_can_be_rebalanced_again_after_new_shards_made_filters(rds):
    """Shard 1 gets its first URL only after 2 -> 3: its filter is sized
    like the others (the rebalance keeps the per-shard sizing), so 3 -> 5
    can OR it into the new shards."""
    cid = "bloom-again"
    cfg = CrawlConfig.from_dict({"crawl_id": cid, "num_shards": 2, "expected_urls": 20_000,
                                 "dedup": "redis_bloom"})
    rds.set(keys.crawl_config(cid), cfg.to_json())
    domains = [f"www.ba{i}.example" for i in range(400)]
    first = [f"http://{h}/" for h in domains if shard_for(politeness_key(h), 2) == 0][:20]
    assert _push(rds, cfg, first) == (len(first), 0, 0)
    Rebalancer(rds, cid, 3, wait_s=5).run()
    cfg3 = load_crawl(rds, cid)
    assert cfg3.expected_urls == 30_000  # 10,000 per shard, as before
    later = [f"http://{h}/" for h in domains if shard_for(politeness_key(h), 3) == 1][:20]
    assert later and _push(rds, cfg3, later) == (len(later), 0, 0)
    sizes = {(i["m"], i["k"]) for s in range(3) if (i := dedup.info(rds, cid, s))}
    assert len(sizes) == 1, sizes
    Rebalancer(rds, cid, 5, wait_s=5).run()
    assert _push(rds, load_crawl(rds, cid), first + later) == (0, 0, len(first) + len(later))


def test_one_rebalancer_at_a_time_and_state_changes_wait_for_its_end(rds, redis_server):
    cid = "one-at-a-time"
    cfg = CrawlConfig.from_dict({"crawl_id": cid, "num_shards": 2})
    rds.set(keys.crawl_config(cid), cfg.to_json())
    assert _push(rds, cfg, _urls(20)) == (105, 0, 0)
    # a worker holds shard 0: the first rebalancer waits for it
    rds.set(keys.shard_keys(cid, 0).lease, "some-worker", px=60_000)
    first = Rebalancer(rds, cid, 4, wait_s=30)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(first.run()))
    t.start()
    wait_for(lambda: rds.get(keys.crawl_state(cid)) == b"rebalancing", what="the first rebalance waiting")
    with pytest.raises(RebalanceError, match="another 'crawlctl rebalance' is working on it"):
        Rebalancer(rds, cid, 4, wait_s=1).run()
    r = crawlctl("pause", "--crawl-id", cid, "--redis-url", redis_server.url)
    assert r.returncode == 0 and "it will be paused when the rebalance ends" in r.stdout, r.stdout + r.stderr
    rds.delete(keys.shard_keys(cid, 0).lease)  # the worker lets go
    t.join(30)
    assert out["to"] == 4 and out["state"] == "paused"
    assert rds.get(keys.crawl_state(cid)) == b"paused"
    assert not rds.exists(keys.crawl_rebalance_lock(cid))


def test_a_removed_shards_counters_are_folded_once_even_when_rerun(rds):
    """The fold of a removed shard's counters into shard 0's is marked in
    the same script, so a rebalance killed after it and re-run does not
    count them twice (crawlctl verify would then FAIL visited_vs_rows)."""
    from crawld.frontier import register_plain_script

    fold = register_plain_script(rds, "fold_stats")
    key = keys.shard_keys("fold", 0).stats
    rds.hset(key, mapping={"acked": 5})
    for _ in range(2):
        fold(keys=[key], args=["folded:3:1", "acked", 20, "rows_fetched", 18])
    assert rds.hget(key, "acked") == b"25" and rds.hget(key, "rows_fetched") == b"18"
    fold(keys=[key], args=["folded:3:2", "acked", 1])  # the same shard removed again later
    assert rds.hget(key, "acked") == b"26"


def test_a_start_cut_short_is_begun_again(rds):
    """A progress hash with only ``to`` (a crawlctl killed between two
    writes of an older start) does not make every later run fail."""
    cid = "cut-short"
    cfg = CrawlConfig.from_dict({"crawl_id": cid, "num_shards": 2})
    rds.set(keys.crawl_config(cid), cfg.to_json())
    assert _push(rds, cfg, _urls(10)) == (55, 0, 0)
    rds.hset(keys.crawl_rebalance(cid), "to", 3)
    r = Rebalancer(rds, cid, 3, wait_s=5).run()
    assert r["to"] == 3 and load_crawl(rds, cid).num_shards == 3
    assert _push(rds, load_crawl(rds, cid), _urls(10)) == (0, 0, 55)
