"""``crawlctl list`` (every crawl in Redis) and the unserved-shards warning
of ``crawlctl rebalance``, against a real redis-server; crawls are created
with ``crawlctl seed`` and no worker runs, so nothing is claimed or fetched."""

from __future__ import annotations

import json

from conftest import crawlctl
from crawld import exitcodes, keys
from crawld.status import render_crawls, unserved_shards

ALPHA_SEEDS = ["http://www.alpha-list.com/", "http://www.alpha-list.com/a", "http://www.other-list.org/"]
BETA_SEEDS = ["http://www.beta-list.net/"]


def seed(redis_url: str, crawl_id: str, out, seeds: list[str], *args: str) -> None:
    proc = crawlctl("seed", *seeds, "--crawl-id", crawl_id, "--redis-url", redis_url, "--out", str(out), *args)
    assert proc.returncode == 0, proc.stderr


def two_crawls(redis_url: str, tmp_path) -> None:
    """alpha: 3 seeds on 2 shards, active; beta: 1 seed on 1 shard, paused."""
    seed(redis_url, "alpha", tmp_path, ALPHA_SEEDS, "--shards", "2")
    seed(redis_url, "beta", tmp_path, BETA_SEEDS, "--shards", "1", "--set", "dedup=redis_bloom")
    paused = crawlctl("pause", "--crawl-id", "beta", "--redis-url", redis_url)
    assert paused.returncode == 0, paused.stderr


def test_list_plain(redis_server, rds, tmp_path):
    two_crawls(redis_server.url, tmp_path)
    proc = crawlctl("list", "--redis-url", redis_server.url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["crawl_id", "state", "shards", "dedup", "queued", "claimed", "fetched", "finished"]
    assert [ln.split() for ln in lines[1:]] == [
        ["alpha", "active", "2", "redis_set", "3", "0", "0", "no"],
        ["beta", "paused", "1", "redis_bloom", "1", "0", "0", "no"],
    ]
    # fixed width: text left-aligned, numbers right-aligned under their heading
    assert lines[1].index("active") == lines[2].index("paused") == lines[0].index("state")
    assert lines[1].index("redis_set") == lines[2].index("redis_bloom") == lines[0].index("dedup")
    end = lines[0].index("shards") + len("shards")
    assert (lines[1][end - 2:end], lines[2][end - 2:end]) == (" 2", " 1")
    assert lines[1].rindex("no") == lines[2].rindex("no") == lines[0].index("finished")


def test_list_json(redis_server, rds, tmp_path):
    two_crawls(redis_server.url, tmp_path)
    proc = crawlctl("list", "--json", "--redis-url", redis_server.url)
    assert proc.returncode == 0, proc.stderr
    crawls = json.loads(proc.stdout)
    assert crawls == [
        {"crawl_id": "alpha", "state": "active", "num_shards": 2, "dedup": "redis_set", "queued": 3,
         "claimed": 0, "fetched": 0, "finished": False, "error": None},
        {"crawl_id": "beta", "state": "paused", "num_shards": 1, "dedup": "redis_bloom", "queued": 1,
         "claimed": 0, "fetched": 0, "finished": False, "error": None},
    ]


def test_list_without_crawls(redis_server, rds):
    proc = crawlctl("list", "--redis-url", redis_server.url)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "no crawls in this Redis\n", "")
    proc = crawlctl("list", "--json", "--redis-url", redis_server.url)
    assert (proc.returncode, json.loads(proc.stdout)) == (0, [])


def test_list_shows_broken_registry_entries_and_goes_on(redis_server, rds, tmp_path):
    seed(redis_server.url, "alpha", tmp_path, ALPHA_SEEDS, "--shards", "2")
    rds.sadd(keys.CRAWLS, "ghost")  # registered, no config
    rds.sadd(keys.CRAWLS, "corrupt")
    rds.set(keys.crawl_config("corrupt"), b"{not json")
    proc = crawlctl("list", "--redis-url", redis_server.url)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    assert [ln.split()[:3] for ln in lines[1:4]] == [["alpha", "active", "2"], ["corrupt", "broken", "-"],
                                                     ["ghost", "broken", "-"]]
    assert lines[4].startswith("crawl corrupt is broken: crawl corrupt: its stored config: not valid JSON")
    assert lines[4].count("crawlctl purge --crawl-id corrupt --force") == 1
    assert lines[5].startswith("crawl ghost is broken: registered, but no config is stored in Redis")
    assert "crawlctl purge --crawl-id ghost --force" in lines[5]
    assert len(lines) == 6
    crawls = {c["crawl_id"]: c for c in json.loads(
        crawlctl("list", "--json", "--redis-url", redis_server.url).stdout)}
    assert crawls["ghost"]["state"] == "broken" and "no config" in crawls["ghost"]["error"]
    assert crawls["ghost"]["queued"] is None and crawls["alpha"]["queued"] == 3


def test_render_crawls_is_pure():
    assert render_crawls([]) == "no crawls in this Redis"
    text = render_crawls([
        {"crawl_id": "a", "state": "cancelled", "num_shards": 12, "dedup": "redis_set", "queued": 0,
         "claimed": 0, "fetched": 1234, "finished": True, "error": None},
        {"crawl_id": "bad id", "state": "broken", "num_shards": None, "dedup": None, "queued": None,
         "claimed": None, "fetched": None, "finished": None, "error": "invalid crawl id 'bad id'"},
    ])
    lines = text.splitlines()
    assert lines[1].split() == ["a", "cancelled", "12", "redis_set", "0", "0", "1234", "yes"]
    assert lines[2].split()[2:] == ["broken", "-", "-", "-", "-", "-", "-"]
    assert lines[3] == ("crawl bad id is broken: invalid crawl id 'bad id' "
                        "(redis-cli SREM crawld:crawls \"bad id\" unregisters it)")


# -- crawlctl rebalance: shards no crawld serves ------------------------------------
def test_unserved_shards():
    assert unserved_shards([], 3) == [0, 1, 2]
    assert unserved_shards(["0-3"], 4) == []
    assert unserved_shards(["0-1"], 6) == [2, 3, 4, 5]
    assert unserved_shards(["0,2", "3-4,9"], 6) == [1, 5]
    assert unserved_shards(["0-7"], 2) == []  # shards above the count do not matter
    assert unserved_shards(["garbage", "", "1"], 2) == [0]  # a malformed spec serves nothing
    assert unserved_shards(["0-3"], 0) == []


def register(rds, name: str, shards: str, crawl_id: str | None = None) -> None:
    rds.hset(keys.SUPERVISORS, name, json.dumps({"host": "h", "pid": 1, "shards": shards, "crawl_id": crawl_id,
                                                 "children": {}, "gave_up": []}))


def rebalance(redis_url: str, crawl_id: str, n: int):
    proc = crawlctl("rebalance", "--crawl-id", crawl_id, "--num-shards", str(n), "--wait", "10",
                    "--redis-url", redis_url, timeout=120)
    assert proc.returncode == exitcodes.OK, proc.stderr
    return proc


def test_rebalance_warns_about_shards_no_crawld_serves(redis_server, rds, tmp_path):
    seed(redis_server.url, "grow", tmp_path, ALPHA_SEEDS, "--shards", "2")
    proc = rebalance(redis_server.url, "grow", 3)  # no crawld at all
    assert "rebalanced from 2 to 3 shards" in proc.stdout
    assert proc.stderr.splitlines() == [
        "crawlctl: warning: no crawld is registered in this Redis, so no shard of crawl grow is served: start "
        "them (systemctl start crawld@0-2, or crawld --shards 0-2)"]

    register(rds, "a:1", "0-1")
    register(rds, "b:2", "5", crawl_id="grow")
    register(rds, "c:3", "2-3", crawl_id="another-crawl")  # serves another crawl only
    proc = rebalance(redis_server.url, "grow", 6)
    assert proc.stderr.splitlines() == [
        "crawlctl: warning: no crawld serves shards 2-4 of crawl grow: start them (systemctl start crawld@2-4, "
        "or crawld --shards 2-4)"]

    register(rds, "d:4", "2,4")
    proc = rebalance(redis_server.url, "grow", 6)  # already on 6: still checked
    assert "already on 6 shard(s)" in proc.stdout
    assert proc.stderr.splitlines() == [
        "crawlctl: warning: no crawld serves shard 3 of crawl grow: start them (systemctl start crawld@3, "
        "or crawld --shards 3)"]

    register(rds, "e:5", "3")
    proc = rebalance(redis_server.url, "grow", 4)
    assert "rebalanced from 6 to 4 shards" in proc.stdout
    assert proc.stderr == ""
