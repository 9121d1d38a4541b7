"""One politeness state per registered domain for the whole fleet, shared by
every crawl (DESIGN.md promise 2: "whatever the number of workers, crawls,
restarts or overlapping processes").

Two crawls on one Redis claim URLs of the same domain through their own
frontiers; the claim script of each reads and charges the one GCRA
timestamp, in-flight count, Retry-After hold and adapted rate of the domain.
Claim times are Redis server times (each claim's deadline minus the
visibility timeout), so the windows are exact.
"""

from __future__ import annotations

import time

import pytest

from crawld import keys
from crawld.config import CrawlConfig
from crawld.crawls import SharedDomainConflict, create_crawl, seed
from crawld.frontier import Claim, Entry, Frontier, HostReport, PushItem
from crawld.sharding import shard_for
from crawld.urls import fingerprint

DOMAIN = "shared.example"
VT_US = 30_000_000


def frontier(rds, crawl_id: str, **over) -> Frontier:
    cfg = CrawlConfig.from_dict({"crawl_id": crawl_id, "num_shards": 1, "visibility_timeout_s": VT_US / 1e6,
                                 "max_inflight_per_host": 8, **over})
    return Frontier(rds, cfg)


def push(f: Frontier, n: int, pkey: str = DOMAIN) -> None:
    items = []
    for i in range(n):
        url = f"http://{pkey}/{f.config.crawl_id}/{i}"
        items.append(PushItem(fingerprint(url), pkey, pkey, "", "", Entry(url, url).to_payload()))
    assert f.push(0, items)[0] == n


def claimed_at_us(rds, f: Frontier, c: Claim) -> int:
    deadline = rds.zscore(keys.shard_keys(f.config.crawl_id, 0).claimed, c.token)
    return int(deadline) - VT_US


def server_us(rds) -> int:
    s, us = rds.time()
    return s * 1_000_000 + us


def eager_claims(rds, frontiers: list[Frontier], seconds: float) -> dict[str, list[int]]:
    """Every crawl claims (and finishes at once) as often as it can, in the
    same order each round, for ``seconds``; returns the claim times of each."""
    times: dict[str, list[int]] = {f.config.crawl_id: [] for f in frontiers}
    done: dict[str, list[bytes]] = {f.config.crawl_id: [] for f in frontiers}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for f in frontiers:
            cid = f.config.crawl_id
            _, cl = f.claim(0, 4, fetched=done[cid])
            if done[cid]:
                f.ack(0, done[cid])
            done[cid] = [c.token for c in cl]
            times[cid] += [claimed_at_us(rds, f, c) for c in cl]
        time.sleep(0.002)
    return times


def most_in_window(ts: list[int], window_us: int) -> int:
    ts = sorted(ts)
    best, j = 0, 0
    for i in range(len(ts)):
        while ts[i] - ts[j] >= window_us:
            j += 1
        best = max(best, i - j + 1)
    return best


def test_two_crawls_of_one_domain_share_its_rate_and_take_turns(rds):
    a, b = frontier(rds, "crawl-a", max_rps_per_host=10), frontier(rds, "crawl-b", max_rps_per_host=10)
    push(a, 60)
    push(b, 60)
    times = eager_claims(rds, [a, b], 2.5)
    both = times["crawl-a"] + times["crawl-b"]
    # GCRA of the union, burst 1: at most w / T + 1 requests in any window w
    assert most_in_window(both, 1_000_000) <= 11
    assert most_in_window(both, 2_000_000) <= 21
    assert len(both) >= 20  # and it ran near its rate
    # fair share: crawl-a always asks first, yet each gets about half
    na, nb = len(times["crawl-a"]), len(times["crawl-b"])
    assert min(na, nb) >= 0.4 * (na + nb), (na, nb)


def test_the_slower_crawls_rate_binds_the_faster_one_on_a_shared_domain(rds):
    slow, fast = frontier(rds, "slow", max_rps_per_host=4), frontier(rds, "fast", max_rps_per_host=40)
    push(slow, 40)
    push(fast, 200)
    times = eager_claims(rds, [fast, slow], 2.5)
    both = times["slow"] + times["fast"]
    # while the 4 r/s crawl is at work the domain gets 4 r/s, not 40
    assert most_in_window(both, 1_000_000) <= 5
    assert times["slow"], "the slow crawl got no turn"


def test_the_in_flight_cap_is_shared_and_a_freed_slot_reaches_the_other_crawl(rds):
    a = frontier(rds, "cap-a", max_rps_per_host=1000, max_inflight_per_host=2)
    b = frontier(rds, "cap-b", max_rps_per_host=1000, max_inflight_per_host=2)
    push(a, 5)
    push(b, 5)
    held = []
    for _ in range(20):
        held += a.claim(0, 2)[1]
        time.sleep(0.002)
    assert len(held) == 2
    assert b.claim(0, 2)[1] == []  # the domain's two slots are crawl-a's
    a.claim(0, 0, fetched=[held[0].token])  # one fetch ends
    got, deadline = [], time.monotonic() + 2.0
    while not got and time.monotonic() < deadline:
        got = b.claim(0, 2)[1]
        a.claim(0, 0)  # crawl-a looks too: it must leave the slot to crawl-b, who waits
        time.sleep(0.01)
    assert len(got) == 1


def test_a_retry_after_seen_by_one_crawl_holds_the_domain_for_every_crawl(rds):
    a, b = frontier(rds, "ra-a", max_rps_per_host=100), frontier(rds, "ra-b", max_rps_per_host=100)
    push(a, 2)
    push(b, 2)
    before = server_us(rds)
    a.claim(0, 0, reports=[HostReport(DOMAIN, "r", 0.5, "HTTP 429 with Retry-After 0s")])
    wait, cl = b.claim(0, 4)
    assert cl == [] and 0.3 < wait <= 0.5
    got = []
    while not got:
        got = b.claim(0, 4)[1]
        time.sleep(0.01)
    assert claimed_at_us(rds, b, got[0]) >= before + 500_000


def test_a_crawl_routing_a_shared_domain_elsewhere_is_refused_until_the_other_is_done(rds):
    seeds = ["http://www.shared-site.com/"]
    pkey = "shared-site.com"
    first = CrawlConfig.from_dict({"crawl_id": "first", "seeds": seeds, "num_shards": 4})
    create_crawl(rds, first, seeds)
    seed(rds, first, seeds)
    n = next(n for n in range(2, 64) if shard_for(pkey, n) != shard_for(pkey, 4))
    other = CrawlConfig.from_dict({"crawl_id": "second", "seeds": seeds, "num_shards": n})
    with pytest.raises(SharedDomainConflict) as err:
        create_crawl(rds, other, seeds)
    assert "crawl first" in str(err.value) and "--shards 4" in str(err.value)
    assert not rds.exists(keys.crawl_config("second"))
    # the same routing is fine
    create_crawl(rds, CrawlConfig.from_dict({"crawl_id": "third", "seeds": seeds, "num_shards": 4}), seeds)
    # once the first crawl has nothing queued or claimed, it fetches nothing: fine too
    f = Frontier(rds, first)
    shard = shard_for(pkey, 4)
    _, cl = f.claim(shard, 10)
    assert len(cl) == 1
    f.ack(shard, [c.token for c in cl])
    rds.delete(keys.crawl_config("third"))
    rds.srem(keys.CRAWLS, "third")
    create_crawl(rds, other, seeds)


def test_purging_a_crawl_gives_its_in_flight_slots_back_to_the_others(rds, run_crawlctl, redis_server):
    a = frontier(rds, "gone", max_rps_per_host=1000, max_inflight_per_host=2)
    b = frontier(rds, "stays", max_rps_per_host=1000, max_inflight_per_host=2)
    rds.set(keys.crawl_config("gone"), a.config.to_json())
    rds.sadd(keys.CRAWLS, "gone")
    push(a, 3)
    push(b, 3)
    held = []
    for _ in range(20):
        held += a.claim(0, 2)[1]
        time.sleep(0.002)
    assert len(held) == 2 and b.claim(0, 2)[1] == []
    proc = run_crawlctl("purge", "--crawl-id", "gone", "--force", "--wait", "0.1", "--redis-url", redis_server.url)
    assert proc.returncode == 0, proc.stderr
    got, deadline = [], time.monotonic() + 2.0
    while len(got) < 2 and time.monotonic() < deadline:
        got += b.claim(0, 2)[1]
        time.sleep(0.01)
    assert len(got) == 2


def test_crawls_that_disagree_on_the_psl_private_section_cannot_share_a_site(rds):
    # with the private section a.github.io is a site; without it github.io is:
    # the same servers under two politeness keys, two rate budgets
    seeds = ["https://a.github.io/"]
    create_crawl(rds, CrawlConfig.from_dict({"crawl_id": "sites", "seeds": seeds}), seeds)
    seed(rds, CrawlConfig.from_dict({"crawl_id": "sites", "seeds": seeds}), seeds)
    whole = CrawlConfig.from_dict({"crawl_id": "whole", "seeds": ["https://b.github.io/"],
                                   "psl_private_domains": False})
    with pytest.raises(SharedDomainConflict, match="psl_private_domains"):
        create_crawl(rds, whole, ["https://b.github.io/"])
    # a crawl of another site with the other setting is fine
    create_crawl(rds, CrawlConfig.from_dict({"crawl_id": "other", "seeds": ["https://www.example.org/"],
                                             "psl_private_domains": False}), ["https://www.example.org/"])


def test_the_psl_private_section_decides_what_is_in_scope():
    from crawld.scope import Router
    on = Router(CrawlConfig.from_dict({"crawl_id": "on", "seeds": ["https://a.github.io/"]}))
    off = Router(CrawlConfig.from_dict({"crawl_id": "off", "seeds": ["https://a.github.io/"],
                                        "psl_private_domains": False}))
    assert on.route("https://b.github.io/").in_scope is False
    assert on.route("https://a.github.io/x").pkey == "a.github.io"
    assert off.route("https://b.github.io/").in_scope is True
    assert off.route("https://a.github.io/x").pkey == "github.io"


def test_an_adapted_rate_shows_in_status_and_metrics(rds, run_crawlctl, redis_server):
    from crawld import status
    from crawld.metrics import RedisCollector

    seeds = ["http://www.busy-site.com/"]
    cfg = CrawlConfig.from_dict({"crawl_id": "slowed", "seeds": seeds, "num_shards": 2, "max_rps_per_host": 8})
    create_crawl(rds, cfg, seeds)
    seed(rds, cfg, seeds)
    f = Frontier(rds, cfg)
    shard = shard_for("busy-site.com", 2)
    f.claim(shard, 0, reports=[HostReport("busy-site.com", "a", 0.0, "HTTP 429")])
    st = status.crawl_status(f)
    assert [(d["domain"], d["rate_rps"], d["shard"]) for d in st["slowed"]] == [("busy-site.com", 1.0, shard)]
    proc = run_crawlctl("status", "--crawl-id", "slowed", "--redis-url", redis_server.url)
    assert "slowed down after 429/503: busy-site.com" in proc.stdout and "at 1 req/s" in proc.stdout, proc.stdout
    fams = {fam.name: fam for fam in RedisCollector(rds, lambda: {"slowed": f}, None)._read()}
    assert [(s.labels, s.value) for s in fams["crawld_domain_adapted_rate_rps"].samples] == [
        ({"shard": str(shard), "domain": "busy-site.com"}, 1.0)]
    assert {s.labels["shard"]: s.value for s in fams["crawld_domains_rate_adapted"].samples} == {
        str(shard): 1.0, str(1 - shard): 0.0}


def test_two_crawls_of_one_site_at_2_rps_each_send_it_2_rps_in_all(tmp_path, redis_server, run_crawlctl):
    """End to end, as the site sees it: two ``crawlctl run`` of two crawl ids
    on one Redis, each at --max-rps-per-host 2, crawl the same site at the
    same time; the server's log holds no 1 s or 10 s window above 2 r/s for
    the two together, and each crawl got its share."""
    import threading

    from sitegraph import group_hits

    from crawld.ratecheck import rate_violations
    from crawld.sitesrv import SiteServer, SyntheticSite

    host = "www.twice-crawled.com"
    with SiteServer(("127.0.0.1", 0), synthetic={host: SyntheticSite(pages=12, extra_links=1)}) as srv:
        procs: dict[str, object] = {}

        def run(cid: str) -> None:
            procs[cid] = run_crawlctl("run", f"http://{host}/", "--crawl-id", cid, "--shards", "2",
                                      "--max-rps-per-host", "2", "--proxy", srv.url, "--redis-url", redis_server.url,
                                      "--out", str(tmp_path / cid), "--json")
        threads = [threading.Thread(target=run, args=(cid,)) for cid in ("twice-a", "twice-b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        hits = srv.hits()
    for cid, proc in procs.items():
        assert proc.returncode == 0, (cid, proc.stderr[-2000:])
    pages = [h for h in hits if h.path != "/robots.txt"]
    assert len(pages) == 2 * 13  # each crawl fetched every page once
    assert sum(1 for h in hits if h.path == "/robots.txt") == 1  # one robots.txt for the fleet
    assert rate_violations(group_hits(hits, lambda h: "twice-crawled.com"), 2.0) == {}
    span = max(h.t for h in hits) - min(h.t for h in hits)
    assert span >= (len(hits) - 1) / 2.0 * 0.95 - 0.05
