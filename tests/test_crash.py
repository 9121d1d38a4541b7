"""Promise 3: a worker killed with SIGKILL mid-crawl loses nothing.

The crawl of the Python documentation runs with a short visibility timeout;
once pages are flowing, the worker of the docs' shard is killed with
SIGKILL.  The supervisor restarts it, the reclaim process returns its
claims, and the crawl still ends with every reachable page in the artifact
and an empty claimed set.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import psutil
import pyarrow.parquet as pq
import pytest
import redis as redis_mod

from conftest import CRAWLCTL, PYDOCS_HOST
from sitegraph import reachable_files, url_to_rel

from crawld import keys
from crawld.sharding import politeness_key, shard_of
from crawld.sitesrv import SiteServer

pytestmark = pytest.mark.slow


def _worker_pid(parent: psutil.Process, shard: int) -> int | None:
    for child in parent.children(recursive=True):
        try:
            cmd = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "crawld.worker" in cmd and cmd[cmd.index("--shard") + 1] == str(shard):
            return child.pid
    return None


def test_kill_9_worker_mid_crawl_loses_nothing(tmp_path, pydocs, own_redis):
    srv = SiteServer(("127.0.0.1", 0), {PYDOCS_HOST: pydocs})
    srv.serve_in_thread()
    shards = 2
    shard = shard_of(politeness_key(PYDOCS_HOST), shards)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.Popen(
        [CRAWLCTL, "run", f"http://{PYDOCS_HOST}/index.html", "--crawl-id", "crash",
         "--shards", str(shards), "--workers", "8", "--max-rps-per-host", "60", "--max-inflight-per-host", "8",
         "--visibility-timeout", "3", "--proxy", srv.url, "--redis-url", own_redis.url,
         "--out", str(tmp_path), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    client = redis_mod.Redis.from_url(own_redis.url)
    stats_key = keys.shard_keys("crash", shard).stats
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and int(client.hget(stats_key, "acked") or 0) < 60:
            time.sleep(0.1)
        claimed_before = client.zcard(keys.shard_keys("crash", shard).claimed)
        pid = _worker_pid(psutil.Process(proc.pid), shard)
        assert pid, "worker process not found"
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        srv.shutdown()
        srv.server_close()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert claimed_before > 0, "the kill did not hit a worker holding claims"
    # the killed worker was restarted by the supervisor
    assert '"child_exited"' in err and "worker-%d" % shard in err
    rows = pq.read_table(summary["artifact"]).to_pylist()
    truth = reachable_files(pydocs, PYDOCS_HOST)
    fetched = {url_to_rel(r["url"]) for r in rows if r["status"] == 200}
    assert truth <= fetched, f"lost after kill -9: {sorted(truth - fetched)[:20]}"
    assert len({r["canonical_url"] for r in rows}) == len(rows)
    k = keys.shard_keys("crash", shard)
    assert client.zcard(k.claimed) == 0 and client.hlen(k.claims) == 0 and client.zcard(k.queue) == 0
    assert int(client.hget(k.stats, "reclaimed") or 0) >= 1
