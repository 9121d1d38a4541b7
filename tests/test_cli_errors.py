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
    (["--crawl-id", "bad id{x}"], "invalid crawl id"),
    (["--visibility-timeout", "0"], "visibility_timeout_s:"),
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
    rds.set(keys.crawl_config("broken"), b'{"version": 1, "crawl_id": "broken", "num_shards": "many"}')
    proc = crawlctl("queue-depth", "--crawl-id", "broken", "--redis-url", redis_server.url)
    assert_one_line_error(proc, exitcodes.CONFIG, "num_shards:")


def test_unknown_crawl(redis_server, rds):
    proc = crawlctl("queue-depth", "--crawl-id", "nosuch", "--redis-url", redis_server.url)
    assert_one_line_error(proc, exitcodes.CONFIG, "no crawl 'nosuch'")


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


@pytest.mark.parametrize("args,needle", [
    (["--shards", "x-y", "--crawl-id", "c"], "shards:"),
    (["--shards", "3-1", "--crawl-id", "c"], "shards:"),
    (["--crawl-id", "c"], "shards:"),
])
def test_daemon_bad_shard_set(args, needle):
    proc = subprocess.run([sys.executable, "-m", "crawld.daemon", *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "REDIS_URL": "redis://127.0.0.1:1/0"}, timeout=60)
    assert_one_line_error(proc, exitcodes.CONFIG, needle, prog="crawld")


def test_help_is_helpful():
    proc = crawlctl("run", "--help")
    assert proc.returncode == 0
    for word in ("--shards", "--workers", "--max-rps-per-host", "--max-depth", "--out", "--proxy", "REDIS_URL"):
        assert word in proc.stdout
    assert crawlctl("settings").stdout.count("\n") >= 15
