"""Many seeds, from the command line, a file or stdin, with no extra flag:
any number works, and a long seed list is not stored in the crawl's config
(every worker and reclaim pass reads it); its registered domains are the
crawl's scope set in Redis."""

from __future__ import annotations

import json
import subprocess

import pyarrow.parquet as pq
import pytest

from conftest import CRAWLCTL, crawlctl, summary_of
from crawld import keys
from crawld.config import default_family
from crawld.sitesrv import SiteServer, SyntheticSite


def sites(n: int) -> list[str]:
    suffixes = ("com", "org", "net", "co.uk", "de", "io")
    return [f"http://www.seed{i:05d}-site.{suffixes[i % len(suffixes)]}/" for i in range(n)]


def test_300_seed_sites_on_the_command_line_need_no_extra_flag(redis_server, rds, tmp_path):
    seeds = sites(300)
    proc = crawlctl("seed", *seeds, "--crawl-id", "many", "--redis-url", redis_server.url, "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "300 new seed(s)" in proc.stdout
    stored = json.loads(rds.get(keys.crawl_config("many")))
    assert stored["seeds"] == []  # not in every worker's config read...
    assert rds.scard(keys.crawl_scope("many")) == 300  # ...but in scope
    # the default family stays short and names the same sites every time
    assert stored["family"] == default_family(seeds) and len(stored["family"]) < 200
    assert stored["family"].endswith(f" #{stored['family'].rsplit('#', 1)[1]}")


def test_seeds_from_a_file_and_from_stdin(redis_server, rds, tmp_path):
    f = tmp_path / "seeds.txt"
    f.write_text("# audit list\n\n" + "\n".join(sites(1000)[:600]) + "\n  \n# end\n")
    proc = crawlctl("seed", "--seeds-file", str(f), "--crawl-id", "from-file", "--redis-url", redis_server.url,
                    "--out", str(tmp_path))
    assert proc.returncode == 0 and "600 new seed(s)" in proc.stdout, proc.stderr
    proc = subprocess.run([CRAWLCTL, "seed", "--seeds-file", "-", "--crawl-id", "from-stdin", "--redis-url",
                           redis_server.url, "--out", str(tmp_path)], input="\n".join(sites(1000)[600:]) + "\n",
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "400 new seed(s)" in proc.stdout, proc.stderr
    # a bad line names its file and line
    bad = tmp_path / "bad.txt"
    bad.write_text("http://www.fine-site.com/\nnot a url\n")
    proc = crawlctl("seed", "--seeds-file", str(bad), "--crawl-id", "bad", "--redis-url", redis_server.url,
                    "--out", str(tmp_path))
    assert proc.returncode != 0 and f"{bad}:2" in proc.stderr and "Traceback" not in proc.stderr
    proc = crawlctl("seed", "--crawl-id", "none", "--redis-url", redis_server.url, "--out", str(tmp_path))
    assert proc.returncode == 64 and "no seed URL given" in proc.stderr


@pytest.mark.slow
def test_100000_seeds_from_a_file(redis_server, rds, tmp_path):
    f = tmp_path / "seeds.txt"
    f.write_text("\n".join(sites(100_000)) + "\n")
    proc = crawlctl("seed", "--seeds-file", str(f), "--crawl-id", "huge", "--redis-url", redis_server.url,
                    "--out", str(tmp_path), timeout=600)
    assert proc.returncode == 0 and "100000 new seed(s)" in proc.stdout, proc.stderr
    assert rds.scard(keys.crawl_scope("huge")) == 100_000
    assert len(rds.get(keys.crawl_config("huge"))) < 4096


def test_a_run_from_a_seeds_file_crawls_every_site(tmp_path, redis_server):
    hosts = [f"www.listed{i}-site.org" for i in range(40)]
    f = tmp_path / "seeds.txt"
    f.write_text("\n".join(f"http://{h}/" for h in hosts) + "\n")
    with SiteServer(("127.0.0.1", 0), synthetic={h: SyntheticSite(pages=2, extra_links=0) for h in hosts}) as srv:
        summary = summary_of(crawlctl("run", "--seeds-file", str(f), "--crawl-id", "listed", "--shards", "2",
                                      "--proxy", srv.url, "--redis-url", redis_server.url,
                                      "--out", str(tmp_path / "out"), "--json"))
    rows = pq.read_table(summary["artifact"], columns=["host", "status"]).to_pylist()
    assert {r["host"] for r in rows if r["status"] == 200} == set(hosts)
    assert summary["rows"] == 40 * 3
