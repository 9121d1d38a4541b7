"""crawld.config: every documented setting is checked, and the stored JSON round-trips."""

from __future__ import annotations

import json

import pytest

from crawld.config import (CONFIG_VERSION, DEFAULT_STRIP_PARAMS, SETTINGS, ConfigError, CrawlConfig,
                           settings_table)

# one clearly bad value per setting
BAD_VALUE = {
    "crawl_id": "bad id!",
    "seeds": [1, 2],
    "num_shards": 0,
    "shard_overrides": {"docs.python.org": 0},
    "max_rps_per_host": 0,
    "burst": 3,
    "max_inflight_per_host": 0,
    "max_depth": -1,
    "allow_domains": ["example.org", ""],
    "psl_private_domains": "maybe",
    "strip_params": [""],
    "user_agent": "",
    "connect_timeout_s": 0,
    "read_timeout_s": -1,
    "fetch_deadline_s": "soon",
    "max_body_bytes": 10,
    "max_redirects": 101,
    "visibility_timeout_s": 0,
    "max_attempts": 0,
    "max_deferrals": -1,
    "backoff_base_s": -1,
    "backoff_max_s": "long",
    "host_max_failures": 0,
    "host_give_up_s": -1,
    "max_retry_after_s": -5,
    "robots_ttl_s": 0,
    "robots_retry_s": 0,
    "honour_nofollow": "maybe",
    "honour_robots_meta": 2,
    "sitemaps": "sometimes",
    "max_pages_per_host": -1,
    "max_url_length": 10,
    "max_query_variants": -3,
    "max_path_repeats": 0,
    "dedup": "memcached",
    "expected_urls": 0,
    "bloom_fp_rate": 0,
    "allow_loopback": "y3s",
    "allow_private_networks": None,
    "memory_high_watermark": 1.5,
    "output": "   ",
    # the unit is "UTC ISO-8601" and the value dates the artifact path
    "created_at": "yesterday",
    "family": "weekly\naudit",
}

# more bad values, for settings whose check has several branches
MORE_BAD = [
    ("crawl_id", ""), ("crawl_id", "a{b}"), ("crawl_id", "x" * 65), ("crawl_id", 5), ("crawl_id", "a:b"),
    ("seeds", 42), ("seeds", [""]),
    ("num_shards", 2.5), ("num_shards", True), ("num_shards", "four"), ("num_shards", 4097), ("num_shards", None),
    ("num_shards", float("nan")), ("num_shards", "1e3"),
    ("max_rps_per_host", float("nan")), ("max_rps_per_host", float("inf")), ("max_rps_per_host", "inf"),
    ("max_rps_per_host", -1), ("max_rps_per_host", [2]),
    ("burst", 0.5), ("burst", False),
    ("max_depth", [1]), ("max_depth", 10001),
    ("user_agent", "x" * 301), ("user_agent", 7),
    ("max_body_bytes", 1 << 32),
    ("dedup", 1), ("dedup", ""), ("dedup", "redis_set,redis_bloom"),
    ("expected_urls", 2.5), ("expected_urls", "many"), ("expected_urls", 10 ** 12),
    ("bloom_fp_rate", 0.6), ("bloom_fp_rate", "1%"), ("bloom_fp_rate", float("nan")),
    ("output", ""), ("output", None),
    ("memory_high_watermark", -0.1), ("memory_high_watermark", "high"), ("memory_high_watermark", float("nan")),
    ("created_at", ""), ("created_at", "2024-13-45T99:99:99Z"), ("created_at", "not a date at all"),
]


def test_bad_values_cover_every_setting():
    assert set(BAD_VALUE) == {s.name for s in SETTINGS}


@pytest.mark.parametrize("name", [s.name for s in SETTINGS])
def test_each_setting_rejects_a_bad_value(name):
    data = {"crawl_id": "c1", name: BAD_VALUE[name]}
    with pytest.raises(ConfigError) as info:
        CrawlConfig.from_dict(data)
    assert str(info.value).startswith(f"{name}: "), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name, value", MORE_BAD, ids=[f"{n}={v!r}"[:60] for n, v in MORE_BAD])
def test_more_bad_values(name, value):
    data = {"crawl_id": "c1", name: value}
    with pytest.raises(ConfigError) as info:
        CrawlConfig.from_dict(data)
    assert str(info.value).startswith(f"{name}: "), str(info.value)


GOOD = [
    ("num_shards", "8", 8), ("num_shards", 8.0, 8), ("num_shards", " 16 ", 16), ("num_shards", 4096, 4096),
    ("max_rps_per_host", "0.5", 0.5), ("max_rps_per_host", 3, 3.0),
    ("burst", 2, 2.0),
    ("max_depth", 0, 0),
    ("seeds", "http://a.example/ http://b.example/,http://c.example/",
     ("http://a.example/", "http://b.example/", "http://c.example/")),
    ("allow_domains", [], ()),
    ("strip_params", ["sid", "ref_*"], ("sid", "ref_*")),
    ("user_agent", "  bot/1.0  ", "bot/1.0"),
    ("created_at", "2024-03-05T10:00:00Z", "2024-03-05T10:00:00Z"),
]


@pytest.mark.parametrize("name, value, expected", GOOD, ids=[f"{n}={v!r}" for n, v, _ in GOOD])
def test_good_values_normalised(name, value, expected):
    cfg = CrawlConfig.from_dict({"crawl_id": "c1", name: value})
    got = getattr(cfg, name)
    assert got == expected and type(got) is type(expected)


def test_unknown_setting_rejected():
    with pytest.raises(ConfigError) as info:
        CrawlConfig.from_dict({"crawl_id": "c1", "max_speed": 9})
    assert str(info.value).startswith("max_speed: ")


def test_missing_crawl_id_rejected():
    with pytest.raises(ConfigError) as info:
        CrawlConfig.from_dict({"num_shards": 4})
    assert str(info.value).startswith("crawl_id: ")


def test_not_a_dict_rejected():
    with pytest.raises(ConfigError):
        CrawlConfig.from_dict(["crawl_id", "c1"])  # type: ignore[arg-type]


def test_deadline_shorter_than_read_timeout_rejected():
    with pytest.raises(ConfigError) as info:
        CrawlConfig.from_dict({"crawl_id": "c1", "read_timeout_s": 30, "fetch_deadline_s": 10})
    assert str(info.value).startswith("fetch_deadline_s: ")


def test_defaults():
    cfg = CrawlConfig.from_dict({"crawl_id": "c1"})
    assert cfg.num_shards == 4 and cfg.strip_params == DEFAULT_STRIP_PARAMS
    assert cfg.emission_interval_ms == 500.0 and cfg.burst_tolerance_ms == 0.0
    assert cfg.created_at.endswith("Z") and len(cfg.created_at) == 20


def test_json_round_trip():
    cfg = CrawlConfig.from_dict({
        "crawl_id": "docs-2024.03", "seeds": ["https://docs.python.org/3/"], "num_shards": 16,
        "max_rps_per_host": 0.25, "burst": 1.5, "allow_domains": ["python.org", "pypi.org"],
        "strip_params": ["utm_*", "sid"], "user_agent": "crawld-test/1", "output": "/tmp/out",
        "created_at": "2024-03-05T10:00:00Z", "max_body_bytes": 2048, "max_redirects": 0,
    })
    text = cfg.to_json()
    data = json.loads(text)
    assert data["version"] == CONFIG_VERSION
    assert set(data) == {s.name for s in SETTINGS} | {"version"}
    back = CrawlConfig.from_json(text)
    assert back == cfg
    assert CrawlConfig.from_json(text.encode()) == cfg
    assert back.to_json() == text


def test_round_trip_of_defaults():
    cfg = CrawlConfig(crawl_id="c1")
    assert CrawlConfig.from_json(cfg.to_json()) == cfg


def test_from_json_without_version_is_current():
    assert CrawlConfig.from_json('{"crawl_id": "c1"}').crawl_id == "c1"


@pytest.mark.parametrize("version", [1, 0, "2", None, CONFIG_VERSION + 1])
def test_version_mismatch_rejected(version):
    text = json.dumps({"version": version, "crawl_id": "c1"})
    with pytest.raises(ConfigError) as info:
        CrawlConfig.from_json(text)
    assert str(info.value).startswith("version: ")


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '"c1"', "{"])
def test_from_json_rejects_non_objects(text):
    with pytest.raises(ConfigError) as info:
        CrawlConfig.from_json(text)
    assert str(info.value).startswith("config: ")


def test_from_json_validates_settings():
    with pytest.raises(ConfigError) as info:
        CrawlConfig.from_json(json.dumps({"version": CONFIG_VERSION, "crawl_id": "c1", "num_shards": 0}))
    assert str(info.value).startswith("num_shards: ")


def test_replace_validates():
    cfg = CrawlConfig.from_dict({"crawl_id": "c1"})
    assert cfg.replace(num_shards=8).num_shards == 8
    assert cfg.num_shards == 4
    with pytest.raises(ConfigError):
        cfg.replace(num_shards=-3)


def test_settings_table_lists_every_setting():
    table = settings_table()
    header, *lines = table.splitlines()
    assert header.split() == ["setting", "default", "unit", "meaning"]
    assert len(lines) == len(SETTINGS)
    for line, s in zip(lines, SETTINGS):
        assert line.split()[0] == s.name
        assert line.rstrip().endswith(s.doc)
        if s.unit:
            assert f" {s.unit} " in line
    defaults = dict((ln.split()[0], ln.split()[1]) for ln in lines)
    assert defaults["num_shards"] == "4"
    assert defaults["crawl_id"] == "(required)"
    assert defaults["created_at"] == "(now)"
    assert defaults["strip_params"] == ",".join(DEFAULT_STRIP_PARAMS)
    assert defaults["allow_domains"] == "(none)"


def test_settings_match_dataclass_fields():
    import dataclasses
    assert [s.name for s in SETTINGS] == [f.name for f in dataclasses.fields(CrawlConfig)]


def test_a_crawl_stored_by_the_crawld_before_slot_routing_is_refused_with_what_to_do():
    with pytest.raises(ConfigError) as info:
        CrawlConfig.from_json(json.dumps({"version": 1, "crawl_id": "old-crawl"}))
    msg = str(info.value)
    assert "older crawld" in msg and "crawlctl purge --crawl-id old-crawl --force" in msg and "\n" not in msg
