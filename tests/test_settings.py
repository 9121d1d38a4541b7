"""Machine settings: /etc/crawl-workers/shard_config.json then the
environment over it; every invalid value a one-line error naming it."""

from __future__ import annotations

import json

import pytest

from conftest import crawlctl
from crawld import keys
from crawld.config import ConfigError, CrawlConfig
from crawld.settings import MACHINE_SETTINGS, load

BAD = {
    "REDIS_URL": "http://not-redis", "CRAWL_ID": "has space", "CRAWLD_SHARDS": "3-1", "NUM_WORKERS": "0",
    "DRAIN_TIMEOUT_S": "-3", "LEASE_TTL_S": "forever", "CRASH_LOOP_LIMIT": "1.5", "CRAWLD_PROXY": "socks5://x:1",
    "OUTPUT_BUCKET": "   ", "MAX_RPS_PER_HOST": "0", "METRICS_PORT": "70000", "CRAWLD_LOG_LEVEL": "loud",
    "CRAWLD_SPOOL_DIR": "   ",
}


def test_every_machine_setting_has_a_bad_value_case():
    assert set(BAD) == {s.env for s in MACHINE_SETTINGS}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_value_in_environment_names_the_setting(name, tmp_path):
    with pytest.raises(ConfigError) as err:
        load({name: BAD[name]}, tmp_path / "none.json")
    assert str(err.value).startswith(f"{name}: ") and "\n" not in str(err.value)


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_value_in_file_names_the_setting(name, tmp_path):
    f = tmp_path / "shard_config.json"
    f.write_text(json.dumps({name.lower(): BAD[name]}))
    with pytest.raises(ConfigError) as err:
        load({}, f)
    assert str(err.value).startswith(f"{name}: ")


def test_environment_overrides_file_and_defaults_apply(tmp_path):
    f = tmp_path / "shard_config.json"
    f.write_text(json.dumps({"num_workers": 8, "lease_ttl_s": 20, "crawl": {"max_depth": 3}}))
    m = load({"NUM_WORKERS": "64"}, f)
    assert m["NUM_WORKERS"] == 64 and m["LEASE_TTL_S"] == 20.0 and m["DRAIN_TIMEOUT_S"] == 30.0
    assert m.crawl_defaults == {"max_depth": 3} and m.source == str(f)
    m = load({"MAX_RPS_PER_HOST": "0.5", "OUTPUT_BUCKET": "/srv/out"}, f)
    assert m.crawl_defaults == {"max_depth": 3, "max_rps_per_host": 0.5, "output": "/srv/out"}


@pytest.mark.parametrize("content,needle", [
    ("{not json", "cannot be read as JSON"), ("[1, 2]", "must hold a JSON object"),
    ('{"surprise": 1}', "surprise: unknown setting"), ('{"crawl": {"bogus": 1}}', "bogus: unknown crawl setting"),
    ('{"crawl": 5}', "'crawl' must be an object"),
])
def test_bad_file(content, needle, tmp_path):
    f = tmp_path / "shard_config.json"
    f.write_text(content)
    with pytest.raises(ConfigError) as err:
        load({}, f)
    assert needle in str(err.value)


def test_seed_takes_crawl_defaults_from_the_settings_file(tmp_path, redis_server, rds):
    f = tmp_path / "shard_config.json"
    f.write_text(json.dumps({"crawl": {"max_depth": 3, "num_shards": 6, "user_agent": "AuditBot/2"}}))
    proc = crawlctl("seed", "http://example.com/", "--crawl-id", "defaults", "--redis-url", redis_server.url,
                    env={"CRAWLD_CONFIG": str(f), "OUTPUT_BUCKET": str(tmp_path / "out"), "MAX_RPS_PER_HOST": "0.5"})
    assert proc.returncode == 0, proc.stderr
    cfg = CrawlConfig.from_json(rds.get(keys.crawl_config("defaults")))
    assert (cfg.max_depth, cfg.num_shards, cfg.user_agent) == (3, 6, "AuditBot/2")
    assert cfg.max_rps_per_host == 0.5 and cfg.output == str(tmp_path / "out")
    # command-line flags beat the defaults
    proc = crawlctl("seed", "http://example.com/", "--crawl-id", "flags", "--max-depth", "7",
                    "--redis-url", redis_server.url, env={"CRAWLD_CONFIG": str(f)})
    assert CrawlConfig.from_json(rds.get(keys.crawl_config("flags"))).max_depth == 7


def test_crawlctl_settings_documents_both_tables():
    out = crawlctl("settings").stdout
    for s in MACHINE_SETTINGS:
        assert s.env in out
    assert "max_rps_per_host" in out and "requests/s" in out
