"""crawld on a real Redis Cluster (three masters on loopback).

Three ``redis-server`` processes in cluster mode, joined by
``redis-cli --cluster create``; ``REDIS_URL`` names one of them and crawld
recognises the cluster by itself (``INFO cluster`` -> ``cluster_enabled:1``).
The end-to-end crawl of the Python docs runs on it with the assertions of
``test_e2e_pydocs.py``, then the test checks that the shards really were
spread over several masters and that the operator commands work on it.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter

import pyarrow.parquet as pq
import pytest
import redis as redis_mod
from redis.cluster import RedisCluster

from conftest import MACHINE_ENV, PYDOCS_HOST, crawlctl, summary_of
from sitegraph import group_hits, reachable_files, url_to_rel

from crawld import keys
from crawld.config import CrawlConfig
from crawld.frontier import Frontier
from crawld.localredis import RedisServer
from crawld.ratecheck import rate_violations
from crawld.redisconn import RedisUnfit, check, connect, is_cluster
from crawld.sharding import politeness_key

CRAWL_ID = "e2e-cluster"
SHARDS = 4
RPS = 400.0


def _cluster_ok(port: int) -> bool:
    try:
        info = redis_mod.Redis(port=port, socket_timeout=2).cluster("info")
    except redis_mod.RedisError:
        return False
    return info.get("cluster_state") == "ok"


def _cluster_port() -> int:
    """A free loopback port whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        port = random.randint(20000, 55535)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


@pytest.fixture(scope="module")
def cluster():
    """Three masters, no replicas, every slot assigned; yields the servers."""
    cli = shutil.which("redis-cli")
    if not cli:
        pytest.fail("redis-cli is not installed (it comes with redis-server: apt-get install redis-tools)")
    servers = [RedisServer(port=_cluster_port(), extra_args=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                       "--cluster-node-timeout", "5000"]) for _ in range(3)]
    try:
        for s in servers:
            s.start()
        proc = subprocess.run([cli, "--cluster", "create", *(f"127.0.0.1:{s.port}" for s in servers),
                               "--cluster-replicas", "0", "--cluster-yes"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        deadline = time.monotonic() + 30
        while not all(_cluster_ok(s.port) for s in servers):
            assert time.monotonic() < deadline, "the cluster did not reach cluster_state:ok within 30 s"
            time.sleep(0.1)
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture(scope="module")
def cluster_url(cluster) -> str:
    return f"redis://127.0.0.1:{cluster[0].port}/"


@pytest.fixture(scope="module")
def cluster_crawl(tmp_path_factory, pydocs, cluster_url):
    """One crawl of the docs on the cluster, shared by the checks below."""
    from crawld.sitesrv import SiteServer

    out = tmp_path_factory.mktemp("e2e-cluster")
    t0 = time.monotonic()
    with SiteServer(("127.0.0.1", 0), {PYDOCS_HOST: pydocs}) as srv:
        proc = crawlctl("run", f"http://{PYDOCS_HOST}/index.html", "--crawl-id", CRAWL_ID,
                        "--shards", str(SHARDS), "--workers", "16", "--max-rps-per-host", str(int(RPS)),
                        "--max-inflight-per-host", "8", "--proxy", srv.url, "--redis-url", cluster_url,
                        "--out", str(out), "--json")
        counts, hits = srv.counts(), srv.hits()
    summary = summary_of(proc)
    table = pq.read_table(summary["artifact"])
    return {"summary": summary, "counts": counts, "hits": hits, "rows": table.to_pylist(), "out": out,
            "stderr": proc.stderr, "wall_s": time.monotonic() - t0}


def _node_client(server: RedisServer) -> redis_mod.Redis:
    return redis_mod.Redis(host="127.0.0.1", port=server.port)


# -- recognising a cluster -----------------------------------------------------

def test_connect_recognises_a_cluster_and_a_single_redis(cluster, cluster_url, redis_server):
    c = connect(cluster_url)
    assert is_cluster(c) and isinstance(c, RedisCluster)
    info = check(c, cluster_url)
    assert info["cluster_masters"] == 3
    # any node, with or without /0, names the same cluster
    assert is_cluster(connect(f"redis://127.0.0.1:{cluster[2].port}/0"))
    single = connect(redis_server.url)
    assert not is_cluster(single) and "cluster_masters" not in check(single, redis_server.url)


def test_a_cluster_url_with_another_database_is_refused(cluster):
    with pytest.raises(RedisUnfit, match="Redis Cluster"):
        connect(f"redis://127.0.0.1:{cluster[1].port}/3")


# -- the end-to-end crawl, with the assertions of test_e2e_pydocs ----------------

def test_coverage_of_reachable_pages_is_at_least_99_percent(cluster_crawl, pydocs):
    truth = reachable_files(pydocs, PYDOCS_HOST)
    assert len(truth) > 400
    fetched = {url_to_rel(r["url"]) for r in cluster_crawl["rows"] if r["status"] == 200}
    coverage = len(truth & fetched) / len(truth)
    assert coverage >= 0.99, f"coverage {coverage:.4f}; missing e.g. {sorted(truth - fetched)[:20]}"


def test_no_url_fetched_twice_by_the_server_count(cluster_crawl):
    counts = cluster_crawl["counts"]
    twice = {k: n for k, n in counts.items() if n > 1}
    assert not twice, f"fetched more than once: {list(twice.items())[:10]}"
    fetched_rows = [r for r in cluster_crawl["rows"] if r["status"] is not None]
    assert counts[(PYDOCS_HOST, "/robots.txt")] == 1
    assert sum(counts.values()) == len(fetched_rows) + 1


def test_no_rate_violation_on_the_server_side(cluster_crawl):
    by_domain = group_hits(cluster_crawl["hits"], politeness_key)
    bad = rate_violations(by_domain, RPS)
    assert not bad, f"rate exceeded (max in 1 s, max in 10 s) per domain: {bad}"


def test_artifact_has_one_row_per_url(cluster_crawl):
    rows = cluster_crawl["rows"]
    canon = Counter(r["canonical_url"] for r in rows)
    assert len(canon) == len(rows)
    assert cluster_crawl["summary"]["duplicates_dropped"] == 0
    assert all(r["crawl_id"] == CRAWL_ID for r in rows)
    index = [r for r in rows if r["url"] == f"http://{PYDOCS_HOST}/index.html"]
    assert index and index[0]["depth"] == 0 and "Documentation" in (index[0]["title"] or "")
    assert all(r["fetched_at"] is not None and r["response_ms"] >= 0 for r in rows)
    deep = [r for r in rows if r["depth"] >= 2]
    assert deep and all(r["referrer"] for r in deep)
    by_url = {r["canonical_url"]: r for r in rows}
    missing = {link for r in rows for link in (r["outlinks"] or []) if link not in by_url}
    assert not missing, sorted(missing)[:10]
    s = cluster_crawl["summary"]
    assert s["rows"] == len(rows) and s["statuses"].get("2xx", 0) > 400
    assert "Traceback" not in cluster_crawl["stderr"]


# -- the keys really are spread over the masters ----------------------------------

def test_shard_keys_landed_on_more_than_one_master(cluster_crawl, cluster):
    shards_on: dict[int, set[int]] = {}
    for i, srv in enumerate(cluster):
        node = _node_client(srv)
        for key in node.scan_iter(match=keys.crawl_patterns(CRAWL_ID)[1], count=1000):
            shard = int(key.decode().split("{s", 1)[1].split("}", 1)[0])
            shards_on.setdefault(shard, set()).add(i)
    assert set(shards_on) == set(range(SHARDS)), shards_on
    # every shard whole on one master (the hash tag), the shards on several
    assert all(len(nodes) == 1 for nodes in shards_on.values()), shards_on
    assert len({n for nodes in shards_on.values() for n in nodes}) > 1, shards_on
    # and the server agrees on where each shard's slot is
    node = _node_client(cluster[0])
    for shard in range(SHARDS):
        slot = node.cluster("keyslot", keys.shard_keys(CRAWL_ID, shard).seen)
        owner = next(iter(shards_on[shard]))
        assert _node_client(cluster[owner]).cluster("countkeysinslot", slot) > 0


# -- operator commands against the cluster ----------------------------------------

def test_queue_depth_and_claimed_set_are_zero_at_the_end(cluster_crawl, cluster_url):
    proc = crawlctl("queue-depth", "--crawl-id", CRAWL_ID, "--redis-url", cluster_url, "--per-shard")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("total=0 claimed=0"), proc.stdout
    assert len([ln for ln in lines if ln.startswith("shard=")]) == SHARDS
    client = connect(cluster_url)
    config = CrawlConfig.from_json(client.get(keys.crawl_config(CRAWL_ID)))
    snaps = Frontier(client, config).snapshots()
    assert sum(s.stats.get("acked", 0) for s in snaps) == cluster_crawl["summary"]["rows"]
    for snap in snaps:
        assert snap.queued == 0 and snap.claimed == 0 and snap.dead == 0
        assert client.hlen(keys.shard_keys(CRAWL_ID, snap.shard).claims) == 0


def test_status_on_the_cluster(cluster_crawl, cluster_url):
    import json

    proc = crawlctl("status", "--crawl-id", CRAWL_ID, "--redis-url", cluster_url, "--json")
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    assert st["finished"] and st["num_shards"] == SHARDS and len(st["shards"]) == SHARDS
    t = st["totals"]
    assert t["queued"] == t["claimed"] == t["expired"] == t["dead"] == 0
    assert t["fetched"] + t["errors"] + t["recorded"] == cluster_crawl["summary"]["rows"]
    text = crawlctl("status", "--crawl-id", CRAWL_ID, "--redis-url", cluster_url)
    assert text.returncode == 0 and "finished" in text.stdout.splitlines()[0], text.stdout + text.stderr


def _crawld(*args: str) -> subprocess.CompletedProcess:
    import os

    e = {k: v for k, v in os.environ.items() if k not in MACHINE_ENV}
    e["CRAWLD_CONFIG"] = "/nonexistent/crawld-test-config.json"
    return subprocess.run([sys.executable, "-m", "crawld.daemon", *args], capture_output=True, text=True,
                          timeout=60, env=e)


def test_crawld_check_on_the_cluster_verifies_every_master(cluster_crawl, cluster, cluster_url):
    ok = _crawld("--check", "--shards", f"0-{SHARDS - 1}", "--crawl-id", CRAWL_ID, "--redis-url", cluster_url)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"crawld: ok: shards 0-{SHARDS - 1} of {CRAWL_ID}"), ok.stdout
    # one evicting master is enough to refuse, and the message names it
    last = _node_client(cluster[2])
    last.config_set("maxmemory-policy", "allkeys-lru")
    try:
        bad = _crawld("--check", "--shards", "0", "--redis-url", cluster_url)
        assert bad.returncode == 69, bad.stdout + bad.stderr
        err = bad.stderr.strip().splitlines()
        assert len(err) == 1 and "allkeys-lru" in err[0] and f"127.0.0.1:{cluster[2].port}" in err[0], err
        q = crawlctl("queue-depth", "--crawl-id", CRAWL_ID, "--redis-url", cluster_url)
        assert q.returncode == 69 and "noeviction" in q.stderr, q.stderr
    finally:
        last.config_set("maxmemory-policy", "noeviction")


@pytest.mark.parametrize("old,new", [(2, 4), (4, 2)])
def test_rebalance_a_live_crawl_on_the_cluster(tmp_path, cluster, cluster_url, old, new):
    """crawlctl rebalance on the cluster while a daemon crawls, with
    test_rebalance.py's assertions (no URL lost or fetched twice, polite,
    one row each, crawlctl verify passes), across masters: the moves are
    copy-then-delete between slots, never a multi-slot command; after a
    shrink no key of a removed shard is left on any master."""
    from test_rebalance import live_rebalance

    cid = f"rb-{old}-{new}"
    client = connect(cluster_url)
    masters = {client.get_node_from_key(keys.shard_keys(cid, s).queue).name for s in range(max(old, new))}
    assert len(masters) > 1
    live_rebalance(tmp_path, cluster_url, old, new)
    for srv in cluster:
        node = _node_client(srv)
        left = [k for s in range(new, old) for k in node.scan_iter(match=f"crawld:{{{cid}:{s}}}:*")]
        assert left == [], (srv.port, left)


def test_purge_deletes_the_crawls_keys_on_every_master(cluster_crawl, cluster, cluster_url):
    """Last in the module: it deletes the crawl."""
    proc = crawlctl("purge", "--crawl-id", CRAWL_ID, "--redis-url", cluster_url, "--wait", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"purged crawl {CRAWL_ID}: deleted "), proc.stdout
    for srv in cluster:
        node = _node_client(srv)
        left = [k for pattern in keys.crawl_patterns(CRAWL_ID) for k in node.scan_iter(match=pattern)]
        assert left in ([], [keys.crawl_state(CRAWL_ID).encode()]), left
    assert not connect(cluster_url).sismember(keys.CRAWLS, CRAWL_ID)
