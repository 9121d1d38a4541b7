"""Shard overrides and ``crawlctl shard-balance``: the pure balance
functions, the ``shard_overrides`` setting, and the real command against
hosts files and a crawl in a real redis-server."""

from __future__ import annotations

import json

import pytest

from conftest import crawlctl
from crawld import balance, exitcodes, keys
from crawld.config import ConfigError, CrawlConfig
from crawld.links import LinkPlanner
from crawld.scope import Router
from crawld.sharding import shard_for, shard_of

SEP = b"\x1f"


def other_shard(pkey: str, n: int) -> int:
    """A shard that is not ``pkey``'s hashed one."""
    return (shard_of(pkey, n) + 1) % n


# --- parsing ---------------------------------------------------------------

@pytest.mark.parametrize("line, expected", [
    ("example.com", ("example.com", 1.0)),
    ("  www.Example.COM   250 ", ("example.com", 250.0)),
    ("https://docs.python.org/3/library/ 1.5", ("python.org", 1.5)),
    ("http://a.b.co.uk:8080/x?y=1#frag 7", ("b.co.uk", 7.0)),
    ("127.0.0.1:8080 3", ("127.0.0.1", 3.0)),
    ("[::1] 2", ("::1", 2.0)),
    ("intranet 0", ("intranet", 0.0)),
    ("example.org 10 # trailing comment", ("example.org", 10.0)),
    ("example.org #10", ("example.org", 1.0)),
    ("", None), ("   ", None), ("# a comment", None), ("   #indented comment 5", None),
])
def test_parse_host_line(line, expected):
    assert balance.parse_host_line(line) == expected


@pytest.mark.parametrize("line, needle", [
    ("example.com lots", "not a number"),
    ("example.com -3", ">= 0"),
    ("example.com nan", "finite"),
    ("example.com inf", "finite"),
    ("example.com 1 2", "expected HOST_OR_URL [WEIGHT]"),
    ("ftp://example.com/ 3", "not a host or http(s) URL"),
    ("exa mple", "not a number"),
    ("bad_host!name", "not a host"),
])
def test_parse_host_line_rejects(line, needle):
    with pytest.raises(ValueError) as info:
        balance.parse_host_line(line)
    assert needle in str(info.value)


def test_parse_hosts_sums_a_registered_domain_and_names_the_line():
    lines = ["# sites", "www.example.com 10", "blog.example.com 5", "", "example.com", "other.org 2"]
    assert balance.parse_hosts(lines) == {"example.com": 16.0, "other.org": 2.0}
    with pytest.raises(balance.HostsError) as info:
        balance.parse_hosts(["ok.org", "ok.org two"], "hosts.txt")
    assert str(info.value).startswith("hosts.txt:2: ")


# --- loads and ratio -------------------------------------------------------

def test_shard_loads_and_ratio():
    weights = {f"site{i}.org": float(i + 1) for i in range(40)}
    loads = balance.shard_loads(weights, 4)
    assert [ld.shard for ld in loads] == [0, 1, 2, 3]
    assert sum(ld.keys for ld in loads) == 40
    assert sum(ld.weight for ld in loads) == pytest.approx(sum(weights.values()))
    for ld in loads:
        assert ld.weight == sum(w for k, w in weights.items() if shard_of(k, 4) == ld.shard)
    total = sum(weights.values())
    assert balance.imbalance_ratio(loads) == pytest.approx(max(ld.weight for ld in loads) / (total / 4))


def test_ratio_values():
    L = balance.ShardLoad
    assert balance.imbalance_ratio([L(0, 1, 5), L(1, 1, 5)]) == 1.0
    assert balance.imbalance_ratio([L(0, 1, 10), L(1, 0, 0)]) == 2.0
    assert balance.imbalance_ratio([L(0, 1, 30), L(1, 1, 10), L(2, 0, 0), L(3, 1, 0)]) == 3.0
    assert balance.imbalance_ratio([L(0, 0, 0), L(1, 0, 0)]) == 1.0  # nothing to balance
    assert balance.imbalance_ratio([L(0, 3, 7)]) == 1.0


def test_empty_shards_are_listed():
    loads = balance.shard_loads({"example.com": 3}, 6)
    assert len(loads) == 6 and sum(1 for ld in loads if ld.keys == 0) == 5


def test_override_moves_a_domain_to_its_pinned_shard():
    n = 4
    weights = {"example.com": 1000.0, **{f"small{i}.net": 1.0 for i in range(30)}}
    pinned = other_shard("example.com", n)
    before = balance.shard_loads(weights, n)
    after = balance.shard_loads(weights, n, {"example.com": pinned})
    assert after[pinned].weight == before[pinned].weight + 1000
    assert after[shard_of("example.com", n)].weight == before[shard_of("example.com", n)].weight - 1000
    # nothing else moved
    for k in weights:
        if k != "example.com":
            assert shard_for(k, n, {"example.com": pinned}) == shard_of(k, n)
    top = balance.heaviest(weights, n, {"example.com": pinned}, 1)
    assert top == [{"key": "example.com", "weight": 1000.0, "shard": pinned, "pinned": True}]


def test_pinning_can_fix_an_imbalance():
    # two big domains that hash to the same shard: pinning one elsewhere halves the worst shard
    n = 4
    names = [f"big{i}.com" for i in range(50)]
    a = names[0]
    b = next(x for x in names[1:] if shard_of(x, n) == shard_of(a, n))
    weights = {a: 100.0, b: 100.0}
    assert balance.imbalance_ratio(balance.shard_loads(weights, n)) == 4.0
    fixed = balance.shard_loads(weights, n, {b: other_shard(b, n)})
    assert balance.imbalance_ratio(fixed) == 2.0


def test_shard_for():
    assert shard_for("example.com", 8) == shard_of("example.com", 8)
    assert shard_for("example.com", 8, {}) == shard_of("example.com", 8)
    assert shard_for("example.com", 8, {"example.com": 5}) == 5
    assert shard_for("example.org", 8, {"example.com": 5}) == shard_of("example.org", 8)
    with pytest.raises(ValueError):
        shard_for("example.com", 4, {"example.com": 4})


def test_report_and_text():
    weights = {"example.com": 20.0, "python.org": 5.0, "x.org": 1.5}
    rep = balance.balance_report(weights, 2, {"example.com": 1}, top=2, found_in={"example.com": 0, "python.org":
                                                                               shard_of("python.org", 2)})
    assert rep["moved"] == {"keys": 1, "weight": 20.0}
    assert rep["weight"] == 26.5 and rep["keys"] == 3 and len(rep["top"]) == 2
    assert sum(s["share"] for s in rep["shards"]) == pytest.approx(100.0)
    text = balance.format_report(rep)
    lines = text.splitlines()
    assert lines[0].split() == ["shard", "keys", "weight", "share"]
    assert lines[1].split()[0] == "0" and lines[2].split()[0] == "1"
    assert lines[3].startswith(f"imbalance {rep['imbalance']:.2f} ")
    assert "overrides example.com=1" in text
    assert "example.com  20  shard 1  (pinned)" in text


# --- the setting -----------------------------------------------------------

def test_overrides_setting_accepted_forms():
    text = '{"example.com": 3, "python.org": 0}'
    want = (("example.com", 3), ("python.org", 0))
    for value in (text, json.loads(text), [["python.org", 0], ["example.com", 3.0]]):
        cfg = CrawlConfig.from_dict({"crawl_id": "c1", "num_shards": 4, "shard_overrides": value})
        assert cfg.shard_overrides == want
        assert cfg.shard_override_map == {"example.com": 3, "python.org": 0}
    cfg = CrawlConfig.from_dict({"crawl_id": "c1", "num_shards": 4, "shard_overrides": text})
    assert json.loads(cfg.to_json())["shard_overrides"] == {"example.com": 3, "python.org": 0}
    assert CrawlConfig.from_json(cfg.to_json()) == cfg
    assert cfg.replace(max_depth=3).shard_overrides == want
    assert CrawlConfig.from_dict({"crawl_id": "c1", "shard_overrides": ""}).shard_overrides == ()
    assert CrawlConfig(crawl_id="c1").to_dict()["shard_overrides"] == {}
    # IP addresses and intranet names are their own politeness keys
    ok = CrawlConfig.from_dict({"crawl_id": "c1", "shard_overrides": {"127.0.0.1": 1, "intranet": 2}})
    assert ok.shard_override_map == {"127.0.0.1": 1, "intranet": 2}


@pytest.mark.parametrize("value, needle", [
    ('{"example.com": 4}', "below num_shards (4)"),
    ({"example.com": -1}, "integer >= 0"),
    ({"example.com": "2"}, "integer >= 0"),
    ({"example.com": True}, "integer >= 0"),
    ({"example.com": 1.5}, "integer >= 0"),
    ({"Example.com": 1}, "lower-case"),
    ({"www.example.com": 1}, "not a registered domain (use 'example.com')"),
    ({"docs.python.org": 1}, "use 'python.org'"),
    ({"example.com.": 1}, "not a registered domain"),
    ({"bad host": 1}, "not a domain name"),
    ({" example.com": 1}, "lower-case"),
    ({"bad_host!": 1}, "not a domain name"),
    ({"": 1}, "not a domain name"),
    ("{not json", "must be a JSON object"),
    ("[1, 2, 3]", "must be a JSON object"),
    ("3", "must be a JSON object"),
    (42, "must be a JSON object"),
])
def test_invalid_overrides_rejected_naming_the_setting(value, needle):
    with pytest.raises(ConfigError) as info:
        CrawlConfig.from_dict({"crawl_id": "c1", "num_shards": 4, "shard_overrides": value})
    msg = str(info.value)
    assert msg.startswith("shard_overrides: ") and "\n" not in msg, msg
    assert needle in msg, msg


def test_router_and_link_planner_honour_overrides():
    n = 4
    pinned = other_shard("example.com", n)
    cfg = CrawlConfig.from_dict({"crawl_id": "c1", "num_shards": n, "seeds": ["http://www.example.com/"],
                                 "allow_domains": ["python.org"], "shard_overrides": {"example.com": pinned}})
    router = Router(cfg)
    for url in ("http://www.example.com/", "https://blog.example.com/a?b=1", "http://example.com:8080/"):
        assert router.route(router.canonical(url)).shard == pinned
    assert router.route(router.canonical("https://docs.python.org/")).shard == shard_of("python.org", n)
    planner = LinkPlanner(cfg, router, lambda origin, url: None)
    _, pushes = planner.page_links("http://www.example.com/", "http://www.example.com/",
                                   ["/a", "http://cdn.example.com/b", "https://docs.python.org/3/"], set(), 0, False)
    shards = {item.pkey: shard for shard, _, item in pushes}
    assert shards == {"example.com": pinned, "python.org": shard_of("python.org", n)}


# --- the command -----------------------------------------------------------

HOSTS = """\
# expected URLs per site
https://docs.python.org/3/   5000
wiki.python.org              1200
www.example.com             20000
www.example.org               800
blog.example.org              300   # same registered domain as www.example.org
127.0.0.1:8080                 50
"""


def test_cli_hosts_file(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(HOSTS)
    proc = crawlctl("shard-balance", "--hosts", str(hosts), "--num-shards", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    weights = {"python.org": 6200.0, "example.com": 20000.0, "example.org": 1100.0, "127.0.0.1": 50.0}
    assert rep["keys"] == 4 and rep["weight"] == sum(weights.values())
    for s in rep["shards"]:
        assert s["weight"] == sum(w for k, w in weights.items() if shard_of(k, 4) == s["shard"])
    assert [t["key"] for t in rep["top"]] == ["example.com", "python.org", "example.org", "127.0.0.1"]
    assert rep["imbalance"] == pytest.approx(max(s["weight"] for s in rep["shards"]) / (sum(weights.values()) / 4))

    text = crawlctl("shard-balance", "--hosts", str(hosts))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["shard", "keys", "weight", "share"] and len(lines[1:5]) == 4
    assert lines[5].startswith(f"imbalance {rep['imbalance']:.2f} ")
    assert "heaviest keys:" in lines and "example.com" in lines[lines.index("heaviest keys:") + 1]

    # pin example.com elsewhere: its weight moves there
    pinned = other_shard("example.com", 4)
    moved = crawlctl("shard-balance", "--hosts", str(hosts), "--set",
                     'shard_overrides={"example.com": %d}' % pinned, "--json")
    assert moved.returncode == 0, moved.stderr
    rep2 = json.loads(moved.stdout)
    assert rep2["shard_overrides"] == {"example.com": pinned}
    assert rep2["shards"][pinned]["weight"] >= 20000 and rep2["top"][0]["pinned"] is True

    # the CI gate: the report is printed, then a one-line error and exit 1
    over = crawlctl("shard-balance", "--hosts", str(hosts), "--max-imbalance", "1.2")
    assert over.returncode == exitcodes.FAILED
    assert over.stderr.strip().startswith("crawlctl: error: imbalance ") and "--max-imbalance 1.2" in over.stderr
    assert over.stdout.startswith("shard")  # the report is still printed
    assert crawlctl("shard-balance", "--hosts", str(hosts), "--max-imbalance", "100").returncode == 0


def test_cli_hosts_stdin(tmp_path):
    import os
    import subprocess

    from conftest import CRAWLCTL, MACHINE_ENV
    env = {k: v for k, v in os.environ.items() if k not in MACHINE_ENV}
    env["CRAWLD_CONFIG"] = str(tmp_path / "none.json")
    proc = subprocess.run([CRAWLCTL, "shard-balance", "--hosts", "-", "--json"], input=HOSTS, text=True,
                          capture_output=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["keys"] == 4


@pytest.mark.parametrize("content, args, code, needle", [
    ("example.com lots\n", [], exitcodes.DATAERR, "hosts.txt:1: weight 'lots' is not a number"),
    ("# nothing\n\n", [], exitcodes.DATAERR, "no host"),
    ("example.com\n", ["--set", 'shard_overrides={"www.example.com": 1}'], exitcodes.CONFIG,
     "shard_overrides: 'www.example.com' is not a registered domain"),
    ("example.com\n", ["--set", 'shard_overrides={"example.com": 9}'], exitcodes.CONFIG,
     "shard_overrides: shard 9 of 'example.com' must be below num_shards (4)"),
    ("example.com\n", ["--set", "max_depth=3"], exitcodes.USAGE, "shard-balance takes --set shard_overrides"),
])
def test_cli_errors(tmp_path, content, args, code, needle):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(content)
    proc = crawlctl("shard-balance", "--hosts", str(hosts), *args)
    err = proc.stderr.strip()
    assert proc.returncode == code, err
    assert len(err.splitlines()) == 1 and err.startswith("crawlctl: error: ") and needle in err, err


def test_cli_needs_a_source():
    assert crawlctl("shard-balance").returncode == exitcodes.USAGE
    assert crawlctl("shard-balance", "--hosts", "x", "--crawl-id", "c").returncode == exitcodes.USAGE
    missing = crawlctl("shard-balance", "--hosts", "/nonexistent/hosts.txt")
    assert missing.returncode == exitcodes.DATAERR and "cannot be read" in missing.stderr


def test_overrides_from_the_machine_config_file(tmp_path):
    pinned = other_shard("example.com", 4)
    conf = tmp_path / "shard_config.json"
    conf.write_text(json.dumps({"crawl": {"num_shards": 4, "shard_overrides": {"example.com": pinned}}}))
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("www.example.com 10\n")
    proc = crawlctl("shard-balance", "--hosts", str(hosts), "--json", env={"CRAWLD_CONFIG": str(conf)})
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["shard_overrides"] == {"example.com": pinned} and rep["shards"][pinned]["weight"] == 10


# --- against a crawl in a real Redis ---------------------------------------

SEEDS = ["http://www.example.com/", "http://www.example.com/a", "http://blog.example.com/b",
         "http://docs.python.org/3/", "http://example.org/", "http://127.0.0.1:8000/"]


def queued_pkeys(rds, crawl_id: str, shard: int) -> list[str]:
    """Politeness keys of the entries in a shard's queue zset."""
    return [m.split(SEP, 1)[0].decode() for m in rds.zrange(keys.shard_keys(crawl_id, shard).queue, 0, -1)]


def test_seed_with_overrides_queues_the_pinned_domain_in_its_shard(redis_server, rds, tmp_path):
    n = 4
    pinned = other_shard("example.com", n)
    proc = crawlctl("seed", *SEEDS, "--crawl-id", "pinned", "--shards", str(n), "--out", str(tmp_path),
                    "--set", 'shard_overrides={"example.com": %d}' % pinned, "--redis-url", redis_server.url)
    assert proc.returncode == 0, proc.stderr
    stored = CrawlConfig.from_json(rds.get(keys.crawl_config("pinned")))
    assert stored.shard_override_map == {"example.com": pinned}
    where = {s: queued_pkeys(rds, "pinned", s) for s in range(n)}
    assert where[pinned].count("example.com") == 3
    for s in range(n):
        if s != pinned:
            assert "example.com" not in where[s]
    # the other domains stay on their hashed shards
    for pkey in ("python.org", "example.org", "127.0.0.1"):
        assert pkey in where[shard_of(pkey, n)]
    assert sum(len(v) for v in where.values()) == len(SEEDS)


def test_cli_crawl_id(redis_server, rds, tmp_path):
    n = 4
    pinned = other_shard("example.com", n)
    seeded = crawlctl("seed", *SEEDS, "--crawl-id", "bal", "--shards", str(n), "--out", str(tmp_path),
                      "--set", 'shard_overrides={"example.com": %d}' % pinned, "--redis-url", redis_server.url)
    assert seeded.returncode == 0, seeded.stderr
    url = redis_server.url

    proc = crawlctl("shard-balance", "--crawl-id", "bal", "--json", "--redis-url", url)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["crawl_id"] == "bal" and rep["num_shards"] == n
    assert rep["shard_overrides"] == {"example.com": pinned}
    assert rep["keys"] == 4 and rep["weight"] == len(SEEDS)
    assert rep["moved"] == {"keys": 0, "weight": 0.0}
    for s in rep["shards"]:
        assert s["weight"] == len(queued_pkeys(rds, "bal", s["shard"]))
    assert rep["top"][0] == {"key": "example.com", "weight": 3.0, "shard": pinned, "pinned": True}

    # a claimed entry still counts (it left the queue zset but not the crawl)
    qkey = keys.shard_keys("bal", pinned).queue
    member = rds.zrange(qkey, 0, 0)[0]
    rds.zrem(qkey, member)
    rds.hset(keys.shard_keys("bal", pinned).claims, "999", b"c" + member.split(SEP, 1)[0] + SEP + b"1" + SEP + SEP
             + member.split(SEP, 3)[3])
    again = json.loads(crawlctl("shard-balance", "--crawl-id", "bal", "--json", "--redis-url", url).stdout)
    assert again["weight"] == len(SEEDS) and again["shards"][pinned]["weight"] == rep["shards"][pinned]["weight"]

    # what-ifs: without the override, and with 8 shards
    unpinned = json.loads(crawlctl("shard-balance", "--crawl-id", "bal", "--json", "--redis-url", url,
                                   "--set", "shard_overrides={}").stdout)
    assert unpinned["top"][0]["shard"] == shard_of("example.com", n)
    assert unpinned["moved"]["keys"] == 1 and unpinned["moved"]["weight"] == 3.0
    wider = crawlctl("shard-balance", "--crawl-id", "bal", "--num-shards", "8", "--redis-url", url)
    assert wider.returncode == 0, wider.stderr
    assert len([ln for ln in wider.stdout.splitlines()[1:] if ln.split()[0].isdigit()]) == 8
    assert "moved " in wider.stdout

    # pinned shard 3 does not fit 2 shards: a one-line error naming the setting
    if pinned >= 2:
        bad = crawlctl("shard-balance", "--crawl-id", "bal", "--num-shards", "2", "--redis-url", url)
        assert bad.returncode == exitcodes.CONFIG and bad.stderr.startswith("crawlctl: error: shard_overrides: ")
    assert crawlctl("shard-balance", "--crawl-id", "nosuch", "--redis-url", url).returncode == exitcodes.NOINPUT


def test_read_crawl_weights_uses_the_page_budget(redis_server, rds):
    # URLs already fetched and acked are gone from the queue but counted in the budget hash
    k = keys.shard_keys("b2", 1)
    rds.hset(k.budget, mapping={"www.example.com": 40, "blog.example.com": 2, "python.org": 1})
    rds.zadd(k.queue, {b"python.org" + SEP + b"000000000000001" + SEP + b"0" + SEP + b"{}": 0,
                       b"python.org" + SEP + b"000000000000002" + SEP + b"0" + SEP + b"{}": 0})
    weights, found = balance.read_crawl_weights(rds, "b2", 2, batch=1)
    assert weights == {"example.com": 42.0, "python.org": 2.0}
    assert found == {"example.com": 1, "python.org": 1}


def test_run_fetches_the_pinned_domain_from_its_shard(tmp_path, redis_server, rds):
    """A whole crawl (seeds, discovered links across sites, workers) with a
    pinned domain: every row of that domain comes from the pinned shard."""
    import pyarrow.parquet as pq

    from conftest import summary_of
    from crawld.sitesrv import SiteServer, SyntheticSite

    n = 3
    big, small = "www.big-pinned.com", "www.small-hashed.org"
    pinned = other_shard("big-pinned.com", n)
    sites = {big: SyntheticSite(pages=12, peers=[small], extra_links=1),
             small: SyntheticSite(pages=4, peers=[big], extra_links=1)}
    with SiteServer(("127.0.0.1", 0), synthetic=sites) as srv:
        summary = summary_of(crawlctl(
            "run", f"http://{big}/", "--crawl-id", "pinrun", "--shards", str(n), "--allow-domain", "small-hashed.org",
            "--set", 'shard_overrides={"big-pinned.com": %d}' % pinned, "--max-rps-per-host", "100",
            "--proxy", srv.url, "--redis-url", redis_server.url, "--out", str(tmp_path), "--json"))
    assert summary["rows"] >= 17
    rows = pq.read_table(next(tmp_path.rglob("pinrun.parquet"))).to_pylist()
    fetched = [r for r in rows if r["outcome"] == "fetched"]
    assert {r["shard"] for r in fetched if big in r["url"]} == {pinned}
    assert {r["shard"] for r in fetched if small in r["url"]} == {shard_of("small-hashed.org", n)}
    assert len([r for r in fetched if big in r["url"]]) == 13 and len([r for r in fetched if small in r["url"]]) == 5
