"""``crawlctl retry``: URLs whose row is an error are fetched again in the
same crawl (DESIGN.md promise 4: nothing lost for good), and the merged
artifact keeps the newest row of each URL and says how many it replaced.

The site (a real HTTP server on loopback, the crawler's proxy) has a home
page linking to ten pages; four of them answer 500 to their first request
and 200 after that.  With ``max_attempts=1`` the crawl ends with those four
as ``error`` rows; ``crawlctl retry --run`` then fetches exactly those four
again and the artifact holds 200 for every page."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from conftest import summary_of
from crawld.retry import RetryFilter, check_status
from hostile import HostileServer, page, respond, sequence

HOST = "www.retry-site.com"
FLAKY = {2, 5, 7, 9}


def site() -> HostileServer:
    srv = HostileServer()
    srv.route(HOST, "/", page("home", [f"/p{i}" for i in range(10)]))
    for i in range(10):
        ok = page(f"page {i}")
        srv.route(HOST, f"/p{i}", sequence(respond(500, "down"), ok) if i in FLAKY else ok)
    return srv


def rows_of(path: str) -> dict[str, dict]:
    return {r["url"]: r for r in pq.read_table(path).to_pylist()}


def test_retry_fetches_the_error_rows_again_and_the_artifact_keeps_the_newest(tmp_path, redis_server, run_crawlctl):
    common = ["--redis-url", redis_server.url]
    with site() as srv:
        first = summary_of(run_crawlctl("run", f"http://{HOST}/", "--crawl-id", "retry-1", "--shards", "2",
                                        "--max-attempts", "1", "--max-rps-per-host", "50", "--proxy", srv.url,
                                        "--out", str(tmp_path), "--json", *common))
        rows = rows_of(first["artifact"])
        assert sorted(u for u, r in rows.items() if r["status"] == 500) == sorted(f"http://{HOST}/p{i}" for i in FLAKY)
        dry = run_crawlctl("retry", "--crawl-id", "retry-1", "--dry-run", *common)
        assert dry.returncode == 0 and "4 URL(s) to retry (error=4)" in dry.stdout, dry.stdout + dry.stderr
        before = len(srv.hits())
        proc = run_crawlctl("retry", "--crawl-id", "retry-1", "--status", "5xx", "--run", "--proxy", srv.url,
                            "--json", *common)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "retry 1 queued 4 URL(s)" in proc.stdout
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        again = sorted(h.path for h in srv.hits()[before:])
    # only the four were requested again
    assert again == sorted(f"/p{i}" for i in FLAKY)
    assert summary["retried"] == 4 and summary["duplicates_dropped"] == 0
    rows = rows_of(summary["artifact"])
    assert len(rows) == 11
    assert {r["status"] for r in rows.values()} == {200}
    assert {u: r["retry"] for u, r in rows.items() if r["retry"]} == {f"http://{HOST}/p{i}": 1 for i in FLAKY}
    # nothing left to retry, and the audit checklist agrees
    assert "0 URL(s) to retry" in run_crawlctl("retry", "--crawl-id", "retry-1", "--dry-run", *common).stdout
    verify = run_crawlctl("verify", "--crawl-id", "retry-1", *common)
    assert "PASS visited_vs_rows" in verify.stdout, verify.stdout


@pytest.mark.parametrize("row,flt,expect", [
    ({"outcome": "error", "status": 503, "host": "a.example.com"}, RetryFilter(), True),
    ({"outcome": "error", "status": None, "host": "a.example.com"}, RetryFilter(statuses=("none",)), True),
    ({"outcome": "error", "status": 503, "host": "a.example.com"}, RetryFilter(statuses=("4xx",)), False),
    ({"outcome": "error", "status": 503, "host": "a.example.com"}, RetryFilter(statuses=("503",)), True),
    ({"outcome": "dead_letter", "status": None, "host": "a.example.com"}, RetryFilter(outcomes=("error",)), False),
    ({"outcome": "error", "status": 500, "host": "a.example.com"}, RetryFilter(hosts=("example.com",)), True),
    ({"outcome": "error", "status": 500, "host": "a.example.com"}, RetryFilter(hosts=("b.example.com",)), False),
    # what the crawl's rules or the site refused is never retried
    ({"outcome": "skipped", "error": "out_of_scope", "host": "x.org"}, RetryFilter(outcomes=("host_parked",)), False),
    ({"outcome": "blocked", "error": "robots_disallowed", "host": "x.org"},
     RetryFilter(outcomes=("robots_unreachable",)), False),
    ({"outcome": "skipped", "error": "host_parked: HTTP 503", "host": "x.org"},
     RetryFilter(outcomes=("host_parked",)), True),
    # an error status is an error row too: 5xx and 429 by default, any asked for
    ({"outcome": "fetched", "status": 500, "host": "x.org"}, RetryFilter(), True),
    ({"outcome": "fetched", "status": 404, "host": "x.org"}, RetryFilter(), False),
    ({"outcome": "fetched", "status": 404, "host": "x.org"}, RetryFilter(statuses=("404",)), True),
    ({"outcome": "fetched", "status": 200, "host": "x.org"}, RetryFilter(statuses=("2xx",)), False),
])
def test_retry_filter(row, flt, expect):
    assert flt.matches(row) is expect


@pytest.mark.parametrize("value,ok", [("5xx", True), ("4XX", True), ("503", True), ("none", True),
                                      ("6xx", False), ("50", False), ("x", False)])
def test_status_values(value, ok):
    if ok:
        assert check_status(value) == value.lower()
    else:
        with pytest.raises(ValueError):
            check_status(value)
