"""Output to S3: workers spool and ship parts, the merge reads them from the
bucket and writes the artifact there.

Against a real S3-protocol server: moto in server mode, started here on a
free loopback port (``AWS_ENDPOINT_URL`` points at it, dummy credentials),
never stubbed calls.  The crawls are real ``crawlctl run`` processes
against the real site server with synthetic sites.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import pyarrow.parquet as pq
import pytest

from conftest import crawlctl
from crawld import exitcodes, storage
from crawld.localredis import RedisServer, free_port
from crawld.output import PartWriter, shard_dir
from crawld.sitesrv import SiteServer, SyntheticSite

BUCKET = "crawl-artifacts"
PREFIX = "team/audits"
PAGES = 12
HOSTS = ["www.s3-one-test.com", "www.s3-two-test.com"]
SEEDS = [f"http://{h}/" for h in HOSTS]
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": "/nonexistent/aws-config", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-creds"}


@pytest.fixture(scope="module")
def s3_server():
    """A moto S3 server on a free loopback port; yields its endpoint URL."""
    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    argv = [str(moto)] if moto.exists() else [sys.executable, "-m", "moto.server"]
    proc = subprocess.Popen([*argv, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/", timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"moto server did not start on {url}")
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def aws(s3_server, monkeypatch):
    """The AWS environment of the moto server, here and for children, with
    an empty bucket; yields (env dict, boto3 S3 client)."""
    env = {**AWS_ENV, "AWS_ENDPOINT_URL": s3_server}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3")
    if BUCKET in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            for o in page.get("Contents", ()):
                client.delete_object(Bucket=BUCKET, Key=o["Key"])
    else:
        client.create_bucket(Bucket=BUCKET)
    yield env, client


def keys_in(client, prefix: str) -> dict[str, int]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", ()):
            out[o["Key"]] = o["Size"]
    return out


@pytest.fixture(scope="module")
def site():
    synthetic = {h: SyntheticSite(pages=PAGES, extra_links=2) for h in HOSTS}
    with SiteServer(("127.0.0.1", 0), synthetic=synthetic) as srv:
        yield srv


@pytest.fixture
def own_redis_url():
    srv = RedisServer().start()
    yield srv.url
    srv.stop()


def assert_one_line_error(proc, code: int, *needles: str):
    err = proc.stderr.strip()
    assert proc.returncode == code, f"exit {proc.returncode}: {err}"
    assert "Traceback" not in proc.stderr and len(err.splitlines()) == 1, err
    assert err.startswith("crawlctl: error: "), err
    for n in needles:
        assert n in err, err


# -- end to end ----------------------------------------------------------------------

def test_run_to_s3_ships_parts_and_writes_the_artifact_there(aws, site, own_redis_url, tmp_path):
    env, client = aws
    out = f"s3://{BUCKET}/{PREFIX}"
    proc = crawlctl("run", *SEEDS, "--crawl-id", "s3-e2e", "--shards", "2", "--workers", "8",
                    "--max-rps-per-host", "50", "--proxy", site.url, "--redis-url", own_redis_url,
                    "--out", out, "--json", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    # the artifact is in the bucket at crawls/YYYY/MM/DD/<crawl_id>.parquet
    art = summary["artifact"]
    assert art.startswith(f"{out}/crawls/") and art.endswith("/s3-e2e.parquet"), art
    key = art[len(f"s3://{BUCKET}/"):]
    y, m, d = key.split("/")[-4:-1]
    assert len(y) == 4 and len(m) == 2 and len(d) == 2
    # parts landed in the bucket, closed, in the parts layout; the spool is gone
    parts = keys_in(client, f"{PREFIX}/parts/s3-e2e/")
    assert parts and all(k.endswith(".ndjson") and "/shard-000" in k for k in parts), parts
    assert sum(parts.values()) > 0
    assert not any(k.startswith(f"{PREFIX}/.crawld-write-test") for k in keys_in(client, PREFIX))
    # one row per page
    local = tmp_path / "a.parquet"
    client.download_file(BUCKET, key, str(local))
    t = pq.read_table(local)
    canon = t.column("canonical_url").to_pylist()
    assert len(canon) == len(set(canon)) == summary["rows"]
    want = {f"http://{h}{p}" for h in HOSTS for p in SyntheticSite(pages=PAGES).paths()}
    fetched = {c for c, o in zip(canon, t.column("outcome").to_pylist()) if o == "fetched"}
    assert fetched == want
    # crawlctl merge again, from the bucket, prints the URL
    proc = crawlctl("merge", "--crawl-id", "s3-e2e", "--redis-url", own_redis_url, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"artifact={art} rows={summary['rows']}" in proc.stdout
    # crawlctl verify reads the artifact from the bucket
    proc = crawlctl("verify", "--crawl-id", "s3-e2e", "--redis-url", own_redis_url, env=env, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = crawlctl("verify", "--crawl-id", "s3-e2e", "--redis-url", own_redis_url, "--artifact", art,
                    env=env, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # and without Redis
    proc = crawlctl("merge", "--crawl-id", "s3-e2e", "--out", out, "--created-at", f"{y}-{m}-{d}T00:00:00Z",
                    env=env, timeout=60)
    assert proc.returncode == 0 and f"artifact={art}" in proc.stdout, proc.stderr


# -- spool and shipping --------------------------------------------------------------

def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_parts_left_in_the_spool_are_shipped_at_the_next_start(aws, tmp_path):
    """A killed worker leaves its open part (and maybe closed ones) in the
    spool; the next start closes the orphan and ships both, deleting the
    local copies only once uploaded."""
    env, client = aws
    spool = tmp_path / "spool"
    w = PartWriter(spool, "killed", 1)
    w.write([{"canonical_url": "http://a.com/1", "n": 1}])
    closed = w.close()
    d = shard_dir(spool, "killed", 1)
    orphan = d / f"part-20260101T000000-{os.uname().nodename}-{_dead_pid()}-00001.ndjson.open"
    orphan.write_bytes(b'{"canonical_url":"http://a.com/2"}\n{"canonical_url":"http://a.co')  # torn line
    live = d / f"part-20260101T000000-{os.uname().nodename}-{os.getppid()}-00001.ndjson.open"
    live.write_bytes(b"{}\n")  # its writer is alive: not touched
    found = storage.recover_spool(spool, "killed", 1)
    assert [p.name for p in found] == sorted([closed.name, orphan.name[: -len(".open")]])
    assert live.exists()
    n, nbytes = storage.ship_spool(spool, f"s3://{BUCKET}/{PREFIX}", "killed", 2)
    assert n == 2 and nbytes > 0
    got = keys_in(client, f"{PREFIX}/parts/killed/shard-0001/")
    assert sorted(k.rsplit("/", 1)[1] for k in got) == sorted(p.name for p in found)
    assert not any(p.exists() for p in found)


def test_shipper_retries_with_backoff_until_the_bucket_exists(aws, tmp_path):
    """Shipping runs in a greenlet, fails while the bucket is missing (the
    part stays spooled), and succeeds once it exists."""
    import gevent

    env, client = aws
    spool = tmp_path / "spool"
    shipped: list[int] = []
    failures: list[int] = []

    class Log:
        def info(self, *a, **k): pass
        def error(self, *a, **k): pass

    shipper = storage.PartShipper(Log(), backoff_s=0.05, backoff_max_s=0.2)
    target = storage.open_storage("s3://late-bucket/x")
    w = PartWriter(spool, "late", 0, max_age_s=0.0,
                   on_close=lambda p: shipper.add(p, target, storage.part_key(spool, p),
                                                  on_ship=shipped.append, on_failure=lambda: failures.append(1)))
    w.write([{"canonical_url": "http://a.com/"}])  # closed at once: max_age_s=0
    g = gevent.spawn(shipper.run)
    try:
        deadline = time.monotonic() + 10
        while not failures and time.monotonic() < deadline:
            gevent.sleep(0.05)
        assert failures and not shipped and shipper.pending() == 1
        assert list(shard_dir(spool, "late", 0).glob("part-*.ndjson"))  # still spooled
        client.create_bucket(Bucket="late-bucket")
        assert shipper.flush(10)
    finally:
        g.kill()
    assert len(shipped) == 1
    assert not list(shard_dir(spool, "late", 0).iterdir())
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="late-bucket").get("Contents", [])]
    assert len(keys) == 1 and keys[0].startswith("x/parts/late/shard-0000/part-") and keys[0].endswith(".ndjson")


def test_idle_part_is_closed_by_age(tmp_path):
    closed = []
    w = PartWriter(tmp_path, "idle", 0, max_age_s=0.2, on_close=closed.append)
    w.write([{"x": 1}])
    assert w.rotate_if_old() is None and not closed
    time.sleep(0.25)
    path = w.rotate_if_old()
    assert path is not None and closed == [path] and path.name.endswith(".ndjson")
    assert w.rotate_if_old() is None  # nothing open


def test_storage_interface_local_and_s3_alike(aws, tmp_path):
    env, client = aws
    src = tmp_path / "f.ndjson"
    src.write_bytes(b"x" * 1000)
    for st in (storage.open_storage(tmp_path / "out"), storage.open_storage(f"s3://{BUCKET}/{PREFIX}")):
        st.check_writable()
        for i in range(3):
            assert st.upload(src, f"parts/c/shard-0000/part-{i}.ndjson") == 1000
        assert [o.key for o in st.list("parts/c/")] == [f"parts/c/shard-0000/part-{i}.ndjson" for i in range(3)]
        assert [o.size for o in storage.list_remote_parts(st, "c")] == [1000] * 3
        assert st.download("parts/c/shard-0000/part-1.ndjson", tmp_path / "back" / "b") == 1000
        st.delete("parts/c/shard-0000/part-1.ndjson")
        st.delete("parts/c/shard-0000/nothing-there")
        assert len(st.list("parts/c/")) == 2
    assert storage.open_storage(f"s3://{BUCKET}/{PREFIX}/").location_of("a/b") == f"s3://{BUCKET}/{PREFIX}/a/b"


# -- start-up errors -------------------------------------------------------------------

def test_missing_bucket_is_a_one_line_error_at_start(aws, tmp_path):
    env, _ = aws
    proc = crawlctl("run", "http://example.com/", "--out", "s3://no-such-bucket/p", env=env, timeout=60)
    assert_one_line_error(proc, exitcodes.CANTCREAT, "s3://no-such-bucket/p", "does not exist")


def test_unreachable_endpoint_is_a_one_line_error_at_start(tmp_path):
    env = {**AWS_ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    t0 = time.monotonic()
    proc = crawlctl("run", "http://example.com/", "--out", f"s3://{BUCKET}/p", env=env, timeout=60)
    assert_one_line_error(proc, exitcodes.CANTCREAT, f"s3://{BUCKET}/p", "not reachable")
    assert time.monotonic() - t0 < 30
    proc = crawlctl("merge", "--crawl-id", "c", "--out", f"s3://{BUCKET}/p", "--created-at",
                    "2026-11-29T10:00:00Z", env=env, timeout=60)
    assert_one_line_error(proc, exitcodes.CANTCREAT, f"s3://{BUCKET}/p", "not reachable")


def test_merge_without_parts_in_the_bucket(aws):
    env, _ = aws
    proc = crawlctl("merge", "--crawl-id", "nothing", "--out", f"s3://{BUCKET}/{PREFIX}", "--created-at",
                    "2026-11-29T10:00:00Z", env=env, timeout=60)
    assert_one_line_error(proc, exitcodes.FAILED, "no parts")


def test_machine_setting_output_bucket_must_name_a_bucket(tmp_path):
    from crawld.config import ConfigError
    from crawld.settings import load

    with pytest.raises(ConfigError, match="^OUTPUT_BUCKET: must name a bucket"):
        load({"OUTPUT_BUCKET": "s3:///x"}, tmp_path / "none.json")
    assert load({"OUTPUT_BUCKET": "s3://b/p"}, tmp_path / "none.json").crawl_defaults["output"] == "s3://b/p"
