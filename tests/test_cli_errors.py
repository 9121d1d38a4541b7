"""Bad input gives a one-line error and a meaningful exit code, never a
traceback: bad seeds, missing or unreachable or unfit Redis, bad settings,
an unwritable output directory, a corrupt stored config."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import crawlctl
from crawld import exitcodes, keys
from crawld.localredis import RedisServer, free_port


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str, prog: str = "crawlctl"):
    err = proc.stderr.strip()
    assert proc.returncode == code, f"exit {proc.returncode}, stderr: {err}"
    assert "Traceback" not in proc.stderr
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"{prog}: error: "), err
    for n in needles:
        assert n in err, err


@pytest.mark.parametrize("seed,needle", [
    ("not a url", "not an absolute URL"),
    ("ftp://example.com/file", "unsupported scheme"),
    ("mailto:ops@example.com", "unsupported scheme"),
    ("http://", "no host"),
    ("http://example.com:99999/", "invalid URL"),
    ("/relative/path", "not an absolute URL"),
])
def test_bad_seed_url(seed, needle, tmp_path):
    proc = crawlctl("run", seed, "--out", str(tmp_path))
    assert_one_line_error(proc, exitcodes.DATAERR, needle, repr(seed))


def test_unreachable_redis(tmp_path):
    port = free_port()
    proc = crawlctl("run", "http://example.com/", "--redis-url", f"redis://127.0.0.1:{port}/0",
                    "--out", str(tmp_path))
    assert_one_line_error(proc, exitcodes.UNAVAILABLE, "cannot reach Redis", str(port))


def test_missing_redis_url_for_fleet_commands():
    proc = crawlctl("queue-depth", "--crawl-id", "x")
    assert_one_line_error(proc, exitcodes.CONFIG, "REDIS_URL")


def test_malformed_redis_url():
    proc = crawlctl("queue-depth", "--crawl-id", "x", "--redis-url", "notredis://what")
    assert_one_line_error(proc, exitcodes.UNAVAILABLE, "REDIS_URL")


def test_password_is_not_printed(tmp_path):
    port = free_port()
    proc = crawlctl("queue-depth", "--crawl-id", "x", "--redis-url", f"redis://ops:s3cret@127.0.0.1:{port}/0")
    assert_one_line_error(proc, exitcodes.UNAVAILABLE)
    assert "s3cret" not in proc.stderr


def test_evicting_redis_is_refused(tmp_path):
    with RedisServer(extra_args=["--maxmemory-policy", "allkeys-lru"]) as srv:
        proc = crawlctl("run", "http://example.com/", "--redis-url", srv.url, "--out", str(tmp_path))
    assert_one_line_error(proc, exitcodes.UNAVAILABLE, "noeviction", "allkeys-lru")


@pytest.mark.parametrize("args,needle", [
    (["--shards", "0"], "num_shards:"),
    (["--max-rps-per-host", "-1"], "max_rps_per_host:"),
    (["--burst", "3"], "burst:"),
    (["--max-depth", "-2"], "max_depth:"),
    (["--visibility-timeout", "0"], "visibility_timeout_s:"),
    (["--user-agent", "x\r\nX-Evil: 1"], "user_agent: must not contain control characters"),
    (["--allow-domain", "not a domain!"], "allow_domains:"),
    (["--shards", "200"], "one process per shard"),
])
def test_bad_setting(args, needle, tmp_path):
    proc = crawlctl("run", "http://example.com/", *args, "--out", str(tmp_path))
    assert_one_line_error(proc, exitcodes.CONFIG, needle)


def test_unwritable_output_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = crawlctl("run", "http://example.com/", "--out", str(blocker / "out"))
    assert_one_line_error(proc, exitcodes.CANTCREAT, "--out")


def test_corrupt_stored_config(redis_server, rds):
    rds.set(keys.crawl_config("broken"), b"{not json")
    proc = crawlctl("queue-depth", "--crawl-id", "broken", "--redis-url", redis_server.url)
    assert_one_line_error(proc, exitcodes.CONFIG, "config: not valid JSON")
    rds.set(keys.crawl_config("broken"), b'{"version": 3, "crawl_id": "broken", "num_shards": "many"}')
    proc = crawlctl("queue-depth", "--crawl-id", "broken", "--redis-url", redis_server.url)
    assert_one_line_error(proc, exitcodes.CONFIG, "num_shards:")


def test_unknown_crawl(redis_server, rds):
    proc = crawlctl("queue-depth", "--crawl-id", "nosuch", "--redis-url", redis_server.url)
    assert_one_line_error(proc, exitcodes.NOINPUT, "no crawl 'nosuch'")


def test_merge_without_parts(tmp_path):
    proc = crawlctl("merge", "--crawl-id", "nothing", "--out", str(tmp_path))
    assert_one_line_error(proc, exitcodes.FAILED, "no parts")


def test_crawl_id_taken_with_other_settings(redis_server, rds, tmp_path):
    ok = crawlctl("seed", "http://example.com/", "--crawl-id", "taken", "--redis-url", redis_server.url,
                  "--out", str(tmp_path))
    assert ok.returncode == 0, ok.stderr
    proc = crawlctl("seed", "http://example.com/", "--crawl-id", "taken", "--shards", "7",
                    "--redis-url", redis_server.url, "--out", str(tmp_path))
    assert_one_line_error(proc, exitcodes.CONFIG, "already exists")


@pytest.mark.parametrize("args,code,needle", [
    # a bad --shards argument (or systemd instance name) is a usage error
    (["--shards", "x-y", "--crawl-id", "c"], exitcodes.USAGE, "--shards: 'x-y' is not a shard set like '0-3'"),
    (["--shards", "3-1", "--crawl-id", "c"], exitcodes.USAGE, "--shards: '3-1'"),
    (["--check", "--shards", "abc"], exitcodes.USAGE, "--shards: 'abc' is not a shard set like '0-3'"),
    (["--check", "--shards", ","], exitcodes.USAGE, "--shards: ',' names no shard"),
    # no shard set anywhere: a missing setting
    (["--crawl-id", "c"], exitcodes.CONFIG, "shards:"),
])
def test_daemon_bad_shard_set(args, code, needle):
    proc = subprocess.run([sys.executable, "-m", "crawld.daemon", *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "REDIS_URL": "redis://127.0.0.1:1/0"}, timeout=60)
    assert_one_line_error(proc, code, needle, prog="crawld")


def test_daemon_bad_shard_set_in_the_environment_is_a_bad_setting():
    proc = subprocess.run([sys.executable, "-m", "crawld.daemon", "--check"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "REDIS_URL": "redis://127.0.0.1:1/0",
                               "CRAWLD_SHARDS": "abc"}, timeout=60)
    assert_one_line_error(proc, exitcodes.CONFIG, "CRAWLD_SHARDS", "abc", prog="crawld")


def test_help_is_helpful():
    proc = crawlctl("run", "--help")
    assert proc.returncode == 0
    for word in ("--shards", "--workers", "--max-rps-per-host", "--max-depth", "--out", "--proxy", "REDIS_URL"):
        assert word in proc.stdout
    assert crawlctl("settings").stdout.count("\n") >= 15


def assert_usage_error(proc: subprocess.CompletedProcess, *needles: str):
    assert proc.returncode == exitcodes.USAGE, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert ": error: " in last
    for n in needles:
        assert n in last, last


@pytest.mark.parametrize("args,needle", [
    (["run", "http://x.com/", "--crawl-id", "bad id{x}"], "invalid crawl id"),
    (["queue-depth", "--crawl-id", "a/b"], "invalid crawl id"),
    (["merge", "--crawl-id", "../../etc/x", "--out", "/tmp"], "invalid crawl id"),
    (["run", "http://x.com/", "--workers", "0"], "--workers"),
    (["run", "http://x.com/", "--workers", "-1"], "--workers"),
    (["run", "http://x.com/", "--drain-timeout", "-5"], "--drain-timeout"),
    (["run", "http://x.com/", "--out", ""], "--out"),
    (["run", "http://x.com/", "--proxy", "notaurl"], "--proxy"),
    (["run", "http://x.com/", "--proxy", "socks5://127.0.0.1:1080"], "--proxy"),
    (["run"], "SEED_URL"),
    (["nosuchcommand"], "invalid choice"),
])
def test_usage_errors_exit_64(args, needle):
    assert_usage_error(crawlctl(*args), needle)


@pytest.mark.parametrize("var,value", [("NUM_WORKERS", "abc"), ("NUM_WORKERS", "0"), ("CRAWLD_PROXY", "notaurl"),
                                       ("REDIS_URL", "http://x"), ("LEASE_TTL_S", "-1"), ("CRAWL_ID", "a b")])
def test_bad_machine_setting_in_the_environment(var, value, tmp_path):
    proc = crawlctl("run", "http://x.com/", "--out", str(tmp_path), env={var: value})
    assert_one_line_error(proc, exitcodes.CONFIG, f"{var}: ")


def test_daemon_huge_shard_range_is_refused_at_once():
    proc = subprocess.run([sys.executable, "-m", "crawld.daemon", "--shards", "0-99999999999", "--crawl-id", "c"],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin",
                                                               "REDIS_URL": "redis://127.0.0.1:1/0"}, timeout=30)
    assert_one_line_error(proc, exitcodes.USAGE, "--shards:", prog="crawld")


def test_merge_never_replaces_an_artifact_when_there_are_no_parts(tmp_path):
    art = tmp_path / "crawls" / "2026" / "11" / "29" / "gone.parquet"
    art.parent.mkdir(parents=True)
    art.write_bytes(b"precious")
    proc = crawlctl("merge", "--crawl-id", "gone", "--out", str(tmp_path), "--created-at", "2026-11-29T10:00:00Z")
    assert_one_line_error(proc, exitcodes.FAILED, "no parts")
    assert art.read_bytes() == b"precious"
    assert sorted(p.name for p in (tmp_path / "crawls").rglob("*")) == ["11", "2026", "29", "gone.parquet"]


def test_merge_rejects_a_bad_date(tmp_path):
    proc = crawlctl("merge", "--crawl-id", "c", "--out", str(tmp_path), "--created-at", "garbage")
    assert_one_line_error(proc, exitcodes.CONFIG, "created_at:")


def test_run_refuses_to_reuse_a_crawl_id_with_parts_in_the_output(tmp_path):
    part = tmp_path / "parts" / "weekly" / "shard-0000" / "part-x.ndjson"
    part.parent.mkdir(parents=True)
    part.write_text("")
    proc = crawlctl("run", "http://x.com/", "--crawl-id", "weekly", "--out", str(tmp_path))
    assert_one_line_error(proc, exitcodes.CONFIG, "already holds parts", "weekly")


def test_seed_again_with_same_settings_is_harmless(redis_server, rds, tmp_path):
    import time

    args = ["seed", "http://example.com/", "--crawl-id", "again", "--redis-url", redis_server.url,
            "--out", str(tmp_path)]
    assert crawlctl(*args).returncode == 0
    time.sleep(1.1)  # a later created_at must not matter
    proc = crawlctl(*args)
    assert proc.returncode == 0 and "0 new seed(s)" in proc.stdout, proc.stderr


def test_a_crawl_where_nothing_could_be_fetched_fails(tmp_path):
    dead_proxy = f"http://127.0.0.1:{free_port()}"
    proc = crawlctl("run", "http://www.example-unfetchable.com/", "--proxy", dead_proxy, "--max-attempts", "1",
                    "--set", "robots_retry_s=0.2", "--set", "host_give_up_s=1", "--set", "backoff_max_s=0.2",
                    "--shards", "1", "--out", str(tmp_path), "--json")
    assert proc.returncode == exitcodes.FAILED, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("crawlctl: error: no URL could be fetched")
    assert "--allow-loopback" not in proc.stderr  # not refused as loopback: no such hint
    assert '"rows": 1' in proc.stdout  # the artifact and its summary are still there


@pytest.mark.parametrize("seed", ["http://127.0.0.1:{port}/", "http://localhost:{port}/"])
def test_a_loopback_seed_names_the_flag_that_allows_it(seed, tmp_path):
    seed = seed.format(port=free_port())
    proc = crawlctl("run", seed, "--shards", "1", "--out", str(tmp_path), "--json")
    assert proc.returncode == exitcodes.FAILED, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("crawlctl: error: no URL could be fetched"), last
    assert f"seed {seed} is a loopback address" in last
    assert last.endswith("(pass --allow-loopback to crawl a site on this machine)"), last
    assert "Traceback" not in proc.stderr
    assert '"address_blocked": 1' in proc.stdout


@pytest.mark.parametrize("seeds,warned", [
    (["http://[::1]:8080/", "http://localhost/"], "seed http://[::1]:8080/ (and 1 more) is a loopback address"),
    (["http://127.0.0.1/"], "seed http://127.0.0.1/ is a loopback address"),
    (["http://10.1.2.3/"], None),  # private, not loopback: refused too, but not for that reason
    (["http://www.example.com/"], None),
])
def test_seed_warns_about_loopback_seeds(seeds, warned, redis_server, rds, tmp_path):
    proc = crawlctl("seed", *seeds, "--crawl-id", "lo", "--redis-url", redis_server.url, "--out", str(tmp_path))
    assert proc.returncode == exitcodes.OK, proc.stderr
    if warned is None:
        assert proc.stderr == ""
    else:
        assert proc.stderr.startswith(f"crawlctl: warning: {warned}: "), proc.stderr
        assert proc.stderr.strip().endswith("(pass --allow-loopback to crawl a site on this machine)")
        assert proc.stderr.count("\n") == 1
        allowed = crawlctl("seed", *seeds, "--crawl-id", "lo-allowed", "--allow-loopback",
                           "--redis-url", redis_server.url, "--out", str(tmp_path))
        assert (allowed.returncode, allowed.stderr) == (0, "")


def test_a_url_that_is_not_redis_is_named_in_one_line():
    from crawld.sitesrv import SiteServer, SyntheticSite

    with SiteServer(("127.0.0.1", 0), synthetic={"www.not-redis.com": SyntheticSite(pages=1)}) as srv:
        port = srv.url.rsplit(":", 1)[1].strip("/")
        p = crawlctl("queue-depth", "--crawl-id", "x", "--redis-url", f"redis://127.0.0.1:{port}/0")
    assert p.returncode == 69, p.stderr
    assert p.stderr.startswith(f"crawlctl: error: redis://127.0.0.1:{port}/0 does not answer as Redis: ")
    assert p.stderr.count("\n") == 1, p.stderr
