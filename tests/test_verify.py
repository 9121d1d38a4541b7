"""``crawlctl verify``: the audit checklist of a finished crawl.

Against real parts: a real redis-server that outlives the crawls, the real
site server with synthetic sites, ``crawlctl run ... --redis-url`` so that the
crawl's state stays in Redis; then state made wrong on purpose (a missing
shard, a leftover claim, a duplicate row, a rate breach, a crawl far smaller
than the previous one of its family) must fail exactly the intended check.
Plus unit tests of the pure check functions.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import redis

from conftest import crawlctl
from crawld import keys, verify
from crawld.config import ConfigError, CrawlConfig, default_family
from crawld.crawls import load_crawl
from crawld.localredis import RedisServer, free_port
from crawld.merge import merge_crawl
from crawld.output import shard_dir
from crawld.sharding import politeness_key, shard_of
from crawld.sitesrv import SiteServer, SyntheticSite

SHARDS = 3
#: the artifact's fetched_at are the workers' request start times, a little
#: later than the claims that GCRA spaced; 5/s leaves that jitter 200 ms
RPS = 5.0
PAGES = 15
LINE = re.compile(r"^(PASS|FAIL) (\w+): (.+)$")


def _domains() -> list[str]:
    """Six registered domains covering every one of the SHARDS shards."""
    chosen: list[str] = []
    covered: set[int] = set()
    for i in range(200):
        d = f"v{i}-verify.com"
        s = shard_of(d, SHARDS)
        if s not in covered or len(covered) == SHARDS:
            chosen.append(d)
            covered.add(s)
        if len(chosen) == 6 and len(covered) == SHARDS:
            return chosen
    raise AssertionError("no domain set covers every shard")


DOMAINS = _domains()
HOSTS = [f"www.{d}" for d in DOMAINS]
SEEDS = [f"http://{h}/" for h in HOSTS]


# -- fixtures: one Redis and one site for the module, a clean crawl --------------

@pytest.fixture(scope="module")
def vredis():
    srv = RedisServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def site():
    synthetic = {h: SyntheticSite(pages=PAGES, extra_links=3) for h in HOSTS}
    with SiteServer(("127.0.0.1", 0), synthetic=synthetic) as srv:
        yield srv


def run_crawl(crawl_id: str, out: Path, redis_url: str, proxy: str, *extra: str) -> dict:
    proc = crawlctl("run", *SEEDS, "--crawl-id", crawl_id, "--shards", str(SHARDS), "--workers", "8",
                    "--max-rps-per-host", str(RPS), "--max-inflight-per-host", "4", "--proxy", proxy,
                    "--redis-url", redis_url, "--out", str(out), "--json", *extra, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def clean(vredis, site, tmp_path_factory):
    """A finished crawl of the six sites: (crawl id, summary, output dir)."""
    out = tmp_path_factory.mktemp("verify-clean")
    summary = run_crawl("verify-clean", out, vredis.url, site.url)
    return "verify-clean", summary, out


def run_verify(crawl_id: str, redis_url: str, *extra: str):
    """``crawlctl verify``: (exit code, {check: PASS/FAIL}, lines)."""
    proc = crawlctl("verify", "--crawl-id", crawl_id, "--redis-url", redis_url, *extra, timeout=120)
    lines = proc.stdout.strip().splitlines()
    results = {}
    for line in lines[:-1]:
        m = LINE.match(line)
        assert m, f"not a check line: {line!r}\n{proc.stderr}"
        results[m.group(2)] = m.group(1)
    print(proc.stdout)
    return proc.returncode, results, lines, proc


def failed(results: dict) -> set[str]:
    return {k for k, v in results.items() if v == "FAIL"}


def copy_artifact(summary: dict, tmp_path: Path) -> tuple[pa.Table, Path]:
    dest = tmp_path / "copy.parquet"
    shutil.copy(summary["artifact"], dest)
    return pq.read_table(dest), dest


# -- against real parts -----------------------------------------------------------

def test_clean_crawl_passes_every_check(clean, vredis):
    crawl_id, summary, _ = clean
    code, results, lines, proc = run_verify(crawl_id, vredis.url)
    assert code == 0, proc.stdout + proc.stderr
    assert list(results) == list(verify.CHECK_NAMES)
    assert failed(results) == set()
    assert lines[-1] == f"OK crawl {crawl_id}: all 6 checks passed"
    # the figures say what was measured
    text = "\n".join(lines)
    assert f"no previous crawl of family {','.join(sorted(DOMAINS))!r} ({summary['rows']} rows)" in text
    assert f"vs {summary['rows']} distinct rows in artifact (+0.0 %" in text
    assert "0 of them cross-shard" in text
    # --json says the same
    proc = crawlctl("verify", "--crawl-id", crawl_id, "--redis-url", vredis.url, "--json")
    assert proc.returncode == 0
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and [c["name"] for c in doc["checks"]] == list(verify.CHECK_NAMES)
    assert doc["checks"][2]["artifact_rows"] == summary["rows"]


def test_run_stores_family_and_records_the_merge(clean, vredis):
    crawl_id, summary, out = clean
    client = redis.Redis.from_url(vredis.url)
    config = load_crawl(client, crawl_id)
    assert config.family == ",".join(sorted(DOMAINS))
    rec = json.loads(client.hget(keys.family_merges(config.family), crawl_id))
    assert rec["rows"] == summary["rows"] and rec["cross_shard_duplicates"] == 0
    assert rec["artifact"] == summary["artifact"] and rec["created_at"] == config.created_at
    # crawlctl merge records it again (same rows, a later merged_at)
    proc = crawlctl("merge", "--crawl-id", crawl_id, "--redis-url", vredis.url)
    assert proc.returncode == 0, proc.stderr
    assert "cross_shard_duplicates=0" in proc.stdout
    again = json.loads(client.hget(keys.family_merges(config.family), crawl_id))
    assert again["rows"] == rec["rows"] and again["merged_at"] > rec["merged_at"]


def test_missing_shard_fails_visited_vs_rows(clean, vredis, tmp_path):
    crawl_id, summary, _ = clean
    table, dest = copy_artifact(summary, tmp_path)
    gone = 1
    n_gone = pc.sum(pc.equal(table.column("shard"), gone)).as_py()
    assert n_gone > 0
    pq.write_table(table.filter(pc.not_equal(table.column("shard"), gone)), dest)
    code, results, lines, _ = run_verify(crawl_id, vredis.url, "--artifact", str(dest))
    assert code == 1
    assert failed(results) == {"visited_vs_rows"}
    line = next(x for x in lines if x.startswith("FAIL visited_vs_rows"))
    assert f"shard {gone} missing: " in line and "0 rows in artifact" in line
    assert lines[-1].startswith(f"FAILED crawl {crawl_id}: 1 of 6 checks failed (visited_vs_rows)")


def test_missing_part_and_remerge_fails_visited_vs_rows(vredis, site, tmp_path):
    """The other way a shard goes missing: its parts deleted, then merged."""
    crawl_id = "verify-lostpart"
    run_crawl(crawl_id, tmp_path, vredis.url, site.url, "--set", "family=lostpart")
    shutil.rmtree(shard_dir(tmp_path, crawl_id, 2))
    proc = crawlctl("merge", "--crawl-id", crawl_id, "--redis-url", vredis.url)
    assert proc.returncode == 0, proc.stderr
    code, results, lines, _ = run_verify(crawl_id, vredis.url)
    assert code == 1 and failed(results) == {"visited_vs_rows"}
    assert any("shard 2 missing" in x for x in lines)


def test_leftover_claim_fails_claimed_empty(clean, vredis):
    crawl_id, _, _ = clean
    client = redis.Redis.from_url(vredis.url)
    k = keys.shard_keys(crawl_id, 2)
    sec, usec = client.time()
    client.zadd(k.claimed, {"leftover-token": sec * 1_000_000 + usec + 120_000_000})  # a live claim
    try:
        code, results, lines, _ = run_verify(crawl_id, vredis.url)
    finally:
        client.zrem(k.claimed, "leftover-token")
    assert code == 1
    assert failed(results) == {"claimed_empty"}
    line = next(x for x in lines if x.startswith("FAIL claimed_empty"))
    assert re.search(r"shard 2 claimed=1 \(expired=0, oldest \d+\.\d s\) \(1 claim\(s\) in 1 of 3 shard\(s\)\)", line)


def test_duplicate_row_fails_no_duplicates(clean, vredis, tmp_path):
    crawl_id, summary, _ = clean
    table, dest = copy_artifact(summary, tmp_path)
    pq.write_table(pa.concat_tables([table, table.slice(3, 1)]), dest)
    code, results, lines, _ = run_verify(crawl_id, vredis.url, "--artifact", str(dest))
    assert code == 1
    assert failed(results) == {"no_duplicates"}
    line = next(x for x in lines if x.startswith("FAIL no_duplicates"))
    assert f"1 duplicate canonical_url row(s) among {summary['rows'] + 1}" in line
    assert table.column("canonical_url")[3].as_py() in line


def test_rate_breach_fails_politeness(clean, vredis, tmp_path):
    crawl_id, summary, _ = clean
    table, dest = copy_artifact(summary, tmp_path)
    victim = DOMAINS[0]
    hosts = table.column("host").to_pylist()
    outcomes = table.column("outcome").to_pylist()
    at = table.column("fetched_at").cast(pa.int64()).to_pylist()
    base, i = at[0], 0
    for row, (h, o) in enumerate(zip(hosts, outcomes)):
        if h and politeness_key(h) == victim and o in ("fetched", "redirect"):
            at[row] = base + 10 * i  # 10 ms apart
            i += 1
    assert i > RPS + 2
    col = pa.array(at, pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
    pq.write_table(table.set_column(table.schema.get_field_index("fetched_at"), table.schema.field("fetched_at"),
                                    col), dest)
    code, results, lines, _ = run_verify(crawl_id, vredis.url, "--artifact", str(dest))
    assert code == 1
    assert failed(results) == {"politeness"}
    line = next(x for x in lines if x.startswith("FAIL politeness"))
    assert f"1 domain(s) above the rate: {victim} 1s={i} 10s={i}" in line


def test_far_smaller_than_previous_crawl_fails_row_count(clean, vredis, site, tmp_path):
    crawl_id, summary, _ = clean
    small = run_crawl("verify-small", tmp_path, vredis.url, site.url, "--max-depth", "1")
    assert small["rows"] < 0.75 * summary["rows"]
    code, results, lines, _ = run_verify("verify-small", vredis.url)
    assert code == 1
    assert failed(results) == {"row_count_vs_previous"}
    line = next(x for x in lines if x.startswith("FAIL row_count_vs_previous"))
    assert f"{small['rows']} rows vs {summary['rows']} of previous crawl {crawl_id}" in line
    # a wider band lets it pass; the clean crawl still has no previous crawl
    code, results, _, _ = run_verify("verify-small", vredis.url, "--band", "90")
    assert code == 0 and failed(results) == set()
    code, results, lines, _ = run_verify(crawl_id, vredis.url)
    assert code == 0 and any("no previous crawl of family" in x for x in lines)


def test_no_artifact_and_no_redis_are_one_line_errors(clean, vredis, tmp_path):
    crawl_id, _, _ = clean
    proc = crawlctl("verify", "--crawl-id", crawl_id, "--redis-url", vredis.url,
                    "--artifact", str(tmp_path / "nope.parquet"))
    assert proc.returncode == 66
    assert proc.stderr.count("\n") == 1 and "no artifact of crawl" in proc.stderr and proc.stdout == ""
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    proc = crawlctl("verify", "--crawl-id", crawl_id, "--redis-url", vredis.url,
                    "--artifact", str(tmp_path / "junk.parquet"))
    assert proc.returncode == 66 and proc.stderr.count("\n") == 1 and "not a readable Parquet" in proc.stderr
    proc = crawlctl("verify", "--crawl-id", crawl_id, "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    assert proc.returncode == 69 and proc.stderr.count("\n") == 1
    proc = crawlctl("verify", "--crawl-id", "no-such-crawl", "--redis-url", vredis.url)
    assert proc.returncode == 66 and "no crawl" in proc.stderr
    proc = crawlctl("verify", "--crawl-id", crawl_id, "--redis-url", vredis.url, "--tolerance", "-1")
    assert proc.returncode == 64


# -- the pure checks ----------------------------------------------------------------

def shard(n, queued=0, skips=0, claimed=0, acked=10, dead=0):
    return {"shard": n, "queued": queued, "skips": skips, "claimed": claimed, "expired": 0,
            "oldest_claim_s": 0.0, "acked": acked, "dead": dead}


def test_shards_drained_names_each_busy_shard():
    assert verify.check_shards_drained([shard(0), shard(1)]).ok
    c = verify.check_shards_drained([shard(0), shard(1, queued=3), shard(2, skips=2)])
    assert not c.ok
    assert c.line() == ("FAIL shards_drained: shard 1 queued=3 to_record=0; shard 2 queued=0 to_record=2 "
                        "(2 of 3 shard(s) not drained; queued=3 to_record=2 in total)")


def test_claimed_empty_names_shards():
    assert verify.check_claimed_empty([shard(0), shard(1)]).ok
    c = verify.check_claimed_empty([shard(0), shard(1, claimed=2)])
    assert not c.ok and "shard 1 claimed=2" in c.figures and c.data["shards"] == {"1": 2}


def test_visited_vs_rows_tolerance_and_missing_shard():
    shards = [shard(0, acked=100, dead=2), shard(1, acked=50)]
    assert verify.check_visited_vs_rows(shards, {0: 102, 1: 50}).ok
    assert verify.check_visited_vs_rows(shards, {0: 100, 1: 50}).ok  # within 2 %
    c = verify.check_visited_vs_rows(shards, {0: 95, 1: 50})
    assert not c.ok and "shard 0: 102 acked+dead vs 95 rows (-6.9 %)" in c.figures
    assert verify.check_visited_vs_rows(shards, {0: 95, 1: 50}, tolerance=0.1).ok
    c = verify.check_visited_vs_rows(shards, {0: 102}, tolerance=1.0)  # missing fails whatever the tolerance
    assert not c.ok and "shard 1 missing: 50 acked+dead, 0 rows in artifact" in c.figures
    assert c.data["missing_shards"] == [1]
    c = verify.check_visited_vs_rows(shards, {0: 102, 1: 50, 7: 3})
    assert not c.ok and "shard 7: 0 acked+dead vs 3 rows" in c.figures


def test_row_count_vs_previous_band():
    assert verify.check_row_count_vs_previous(10, "f", None).figures == "no previous crawl of family 'f' (10 rows)"
    prev = ("c0", {"rows": 100, "created_at": "2026-01-01T00:00:00Z"})
    assert verify.check_row_count_vs_previous(125, "f", prev).ok
    assert verify.check_row_count_vs_previous(75, "f", prev).ok
    c = verify.check_row_count_vs_previous(74, "f", prev)
    assert not c.ok and "74 rows vs 100 of previous crawl c0" in c.figures and "-26.0 %" in c.figures
    assert verify.check_row_count_vs_previous(74, "f", prev, band=0.3).ok


def test_previous_crawl_is_most_recent_created_before():
    recs = {"a": {"created_at": "2026-01-01T00:00:00Z", "merged_at": "1"},
            "b": {"created_at": "2026-01-02T00:00:00Z", "merged_at": "2"},
            "me": {"created_at": "2026-01-03T00:00:00Z", "merged_at": "3"},
            "later": {"created_at": "2026-01-04T00:00:00Z", "merged_at": "4"}}
    assert verify.previous_crawl(recs, "me", "2026-01-03T00:00:00Z")[0] == "b"
    assert verify.previous_crawl(recs, "a", "2026-01-01T00:00:00Z") is None
    # same second: merged earlier counts as before; not yet recorded: any same-second one is before
    recs2 = {"x": {"created_at": "T", "merged_at": "1"}, "y": {"created_at": "T", "merged_at": "2"}}
    assert verify.previous_crawl(recs2, "y", "T")[0] == "x"
    assert verify.previous_crawl(recs2, "x", "T") is None
    assert verify.previous_crawl(recs2, "z", "T")[0] == "y"


def test_politeness_bounds_and_worst_first():
    ok = {"a.com": [i * 0.1 for i in range(30)], "b.com": [0.0, 0.05]}  # 10/s; a 2-token burst
    c = verify.check_politeness(ok, 10.0)
    assert c.ok and "limits 11 per 1 s window, 111 per 10 s window" in c.figures
    bad = {"a.com": [i * 0.01 for i in range(20)], "b.com": [i * 0.05 for i in range(15)],
           "c.com": [i * 0.1 for i in range(12)]}
    c = verify.check_politeness(bad, 10.0)
    assert not c.ok
    assert c.figures.startswith("2 domain(s) above the rate: a.com 1s=20 10s=20; b.com 1s=15 10s=15;")
    assert "c.com" not in c.figures.split(";")[1]


def test_no_duplicates():
    rec = {"duplicates": 2, "cross_shard_duplicates": 0}
    assert verify.check_no_duplicates(10, 0, [], rec).ok
    c = verify.check_no_duplicates(10, 0, [], {"duplicates": 2, "cross_shard_duplicates": 1})
    assert not c.ok and "merge dropped 2 duplicate(s), 1 of them cross-shard" in c.figures
    c = verify.check_no_duplicates(11, 1, ["http://x/1"], rec)
    assert not c.ok and "1 duplicate canonical_url row(s) among 11 in the artifact (e.g. http://x/1)" in c.figures
    c = verify.check_no_duplicates(10, 0, [], None)
    assert c.ok and "unknown" in c.figures


def test_artifact_facts_requests_and_distinct_rows():
    batch = {
        "canonical_url": ["http://www.a.com/", "http://www.a.com/1", "http://www.a.com/1", "http://b.a.com/x",
                          "http://www.b.com/", "http://www.b.com/2", "http://www.b.com/3"],
        "shard": [0, 0, 1, 0, 1, 1, 1],
        "outcome": ["fetched", "redirect", "fetched", "error", "error", "skipped", "error"],
        "status": [200, 301, 200, None, None, None, 503],
        "response_ms": [5.0, 3.0, 4.0, 12.0, 0.0, 0.0, 7.0],
        "host": ["www.a.com", "www.a.com", "www.a.com", "b.a.com", "www.b.com", "www.b.com", "www.b.com"],
        "fetched_at": [1000, 2000, 3000, 4000, 5000, 6000, 7000],
    }
    f = verify.artifact_facts([batch])
    assert f.rows == 7 and f.duplicate_rows == 1 and f.duplicate_examples == ["http://www.a.com/1"]
    assert f.distinct_by_shard == {0: 3, 1: 3} and f.spilled == 0
    # a link recorded under memory back-pressure stands for no claim
    spilled = {k: [*v, v[-1]] for k, v in batch.items()}
    spilled["canonical_url"][-1], spilled["outcome"][-1] = "http://www.b.com/4", "skipped"
    spilled["error"] = [None] * 7 + ["memory_backpressure"]
    g = verify.artifact_facts([spilled])
    assert g.rows == 8 and g.spilled == 1 and g.distinct_by_shard == {0: 3, 1: 3}
    # a.com: fetched, redirect, the duplicate's fetch, an error with a response time; b.com: only the 503
    assert f.request_times == {"a.com": [1.0, 2.0, 3.0, 4.0], "b.com": [7.0]}
    assert not verify.made_request("error", None, 0.0) and not verify.made_request("skipped", 200, 1.0)


def _part(out: Path, shard_no: int, urls: list[str]) -> None:
    d = shard_dir(out, "m1", shard_no)
    d.mkdir(parents=True, exist_ok=True)
    rows = [{"crawl_id": "m1", "url": u, "canonical_url": u, "outcome": "fetched", "host": "example.com",
             "fetched_at": 1_700_000_000_000, "shard": shard_no, "attempt": 1} for u in urls]
    (d / "part-x.ndjson").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_merge_counts_cross_shard_duplicates(tmp_path):
    _part(tmp_path, 0, ["http://example.com/a", "http://example.com/b", "http://example.com/a"])
    _part(tmp_path, 1, ["http://example.com/b", "http://example.com/c"])
    res = merge_crawl(tmp_path, "m1", "2026-01-01T00:00:00Z")
    assert (res.rows, res.duplicates, res.cross_shard_duplicates) == (3, 2, 1)


def test_family_setting():
    assert default_family(["http://www.b.example.co.uk/x", "https://docs.python.org/", "http://b.python.org/"]) \
        == "example.co.uk,python.org"
    c = CrawlConfig.from_dict({"crawl_id": "f", "seeds": ["http://www.z.com/", "http://a.org/"]})
    assert c.family == "" and c.family_name == "a.org,z.com"
    assert c.replace(family=" weekly-audit ").family_name == "weekly-audit"
    with pytest.raises(ConfigError, match="^family: "):
        CrawlConfig.from_dict({"crawl_id": "f", "family": "a\nb"})
    with pytest.raises(ConfigError, match="^family: "):
        CrawlConfig.from_dict({"crawl_id": "f", "family": 3})


def test_a_rebalanced_crawl_is_judged_on_its_total_rows():
    """After 2 -> 3 -> 2 -> 3 shards, rows keep the shard that wrote them
    while removed shards' counters went to shard 0: per-shard counts no
    longer line up, the total still must."""
    shards = [{"shard": 0, "acked": 221, "dead": 0}, {"shard": 1, "acked": 219, "dead": 0},
              {"shard": 2, "acked": 54, "dead": 0}]
    rows = {0: 181, 1: 219, 2: 94}
    assert not verify.check_visited_vs_rows(shards, rows).ok
    c = verify.check_visited_vs_rows(shards, rows, per_shard=False)
    assert c.ok and "per-shard counts not compared" in c.figures and c.data["shards"]["2"]["artifact"] == 94
    assert not verify.check_visited_vs_rows(shards, {0: 181, 1: 219, 2: 50}, per_shard=False).ok
