"""End to end on the real Python documentation (Debian's python3-doc).

``crawlctl run`` crawls the docs through the site server acting as its
proxy, against a real redis-server; the test compares the artifact with an
independent reachability count made from the files on disk.
"""

from __future__ import annotations

from collections import Counter

import pyarrow.parquet as pq
import pytest
import redis as redis_mod

from conftest import PYDOCS_HOST, summary_of
from sitegraph import reachable_files, url_to_rel

from crawld.config import CrawlConfig
from crawld.frontier import Frontier
from crawld import keys


@pytest.fixture(scope="module")
def pydocs_crawl(tmp_path_factory, pydocs, redis_server):
    """One crawl of the docs, shared by the checks below."""
    from conftest import crawlctl
    from crawld.sitesrv import SiteServer

    redis_mod.Redis.from_url(redis_server.url).flushall()
    out = tmp_path_factory.mktemp("e2e")
    with SiteServer(("127.0.0.1", 0), {PYDOCS_HOST: pydocs}) as srv:
        proc = crawlctl("run", f"http://{PYDOCS_HOST}/index.html", "--crawl-id", "e2e-pydocs",
                        "--shards", "3", "--workers", "16", "--max-rps-per-host", "400", "--max-inflight-per-host", "8",
                        "--proxy", srv.url, "--redis-url", redis_server.url, "--out", str(out), "--json")
        counts = srv.counts()
    summary = summary_of(proc)
    table = pq.read_table(summary["artifact"])
    return {"summary": summary, "counts": counts, "rows": table.to_pylist(), "table": table,
            "redis_url": redis_server.url, "stderr": proc.stderr}


def test_coverage_of_reachable_pages_is_at_least_99_percent(pydocs_crawl, pydocs):
    truth = reachable_files(pydocs, PYDOCS_HOST)
    assert len(truth) > 400, "the independent count found too few pages; is python3-doc complete?"
    fetched = {url_to_rel(r["url"]) for r in pydocs_crawl["rows"] if r["status"] == 200}
    covered = truth & fetched
    coverage = len(covered) / len(truth)
    missing = sorted(truth - fetched)[:20]
    assert coverage >= 0.99, f"coverage {coverage:.4f}; missing e.g. {missing}"


def test_no_url_fetched_twice_by_the_server_count(pydocs_crawl):
    counts = pydocs_crawl["counts"]
    twice = {k: n for k, n in counts.items() if n > 1}
    assert not twice, f"fetched more than once: {list(twice.items())[:10]}"
    fetched_rows = [r for r in pydocs_crawl["rows"] if r["status"] is not None]
    # every request is a row, plus the one robots.txt request
    assert counts[(PYDOCS_HOST, "/robots.txt")] == 1
    assert sum(counts.values()) == len(fetched_rows) + 1


def test_artifact_has_one_row_per_url(pydocs_crawl):
    rows = pydocs_crawl["rows"]
    canon = Counter(r["canonical_url"] for r in rows)
    assert len(canon) == len(rows)
    assert pydocs_crawl["summary"]["duplicates_dropped"] == 0
    assert all(r["crawl_id"] == "e2e-pydocs" for r in rows)
    index = [r for r in rows if r["url"] == f"http://{PYDOCS_HOST}/index.html"]
    assert index and index[0]["depth"] == 0 and "Documentation" in (index[0]["title"] or "")
    assert all(r["fetched_at"] is not None and r["response_ms"] >= 0 for r in rows)
    deep = [r for r in rows if r["depth"] >= 2]
    assert deep and all(r["referrer"] for r in deep)


def test_queue_depth_and_claimed_set_are_zero_at_the_end(pydocs_crawl, run_crawlctl):
    proc = run_crawlctl("queue-depth", "--crawl-id", "e2e-pydocs", "--redis-url", pydocs_crawl["redis_url"],
                        "--per-shard")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("total=0 claimed=0"), proc.stdout
    client = redis_mod.Redis.from_url(pydocs_crawl["redis_url"])
    config = CrawlConfig.from_json(client.get(keys.crawl_config("e2e-pydocs")))
    for snap in Frontier(client, config).snapshots():
        assert snap.queued == 0 and snap.claimed == 0 and snap.dead == 0
        assert client.hlen(keys.shard_keys("e2e-pydocs", snap.shard).claims) == 0


def test_links_not_fetched_are_accounted_for(pydocs_crawl):
    rows = pydocs_crawl["rows"]
    by_url = {r["canonical_url"]: r for r in rows}
    skipped = [r for r in rows if r["outcome"] == "skipped"]
    assert skipped and all(r["error"] == "out_of_scope" and r["status"] is None for r in skipped)
    # every outlink of every fetched page has a row of its own
    missing = {link for r in rows for link in (r["outlinks"] or []) if link not in by_url}
    assert not missing, sorted(missing)[:10]
    ext = by_url.get("https://www.python.org/")
    assert ext is not None and ext["outcome"] == "skipped" and ext["host"] == "www.python.org"


def test_summary_reports_the_crawl(pydocs_crawl):
    s = pydocs_crawl["summary"]
    assert s["rows"] == len(pydocs_crawl["rows"])
    assert s["statuses"].get("2xx", 0) > 400
    assert s["pages_per_s"] > 0 and s["wall_s"] > 0
    assert s["artifact"].endswith("/e2e-pydocs.parquet") and "/crawls/" in s["artifact"]
    assert "Traceback" not in pydocs_crawl["stderr"]
