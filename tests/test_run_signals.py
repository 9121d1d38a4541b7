"""``crawlctl run`` stopped early leaves nothing behind: SIGINT drains and
exits 130 with one line; SIGKILL of crawlctl still takes down its workers
and its private redis-server."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil

from conftest import CRAWLCTL, PYDOCS_HOST
from crawld import exitcodes


def _start(site_server, tmp_path, **kw) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return subprocess.Popen([CRAWLCTL, "run", f"http://{PYDOCS_HOST}/index.html", "--shards", "2",
                             "--max-rps-per-host", "20", "--proxy", site_server.url, "--out", str(tmp_path),
                             "--drain-timeout", "5"],
                            text=True, env=env, **({"stdout": subprocess.PIPE, "stderr": subprocess.PIPE} | kw))


def _wait_for_fetches(site_server, n: int = 20, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(site_server.hits()) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(site_server.hits()) >= n, "crawl did not start"


def _gone(pids: list[int], timeout: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.1)
    return alive


def test_sigint_stops_the_run_cleanly(site_server, tmp_path):
    proc = _start(site_server, tmp_path)
    try:
        _wait_for_fetches(site_server)
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert any("redis-server" in psutil.Process(p).name() for p in children)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == exitcodes.INTERRUPTED, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("crawlctl: error: interrupted")
    assert _gone(children) == []


def test_sigkill_of_crawlctl_takes_down_workers_and_private_redis(site_server, tmp_path):
    with open(tmp_path / "log", "w") as log:
        proc = _start(site_server, tmp_path, stdout=log, stderr=log)
    try:
        _wait_for_fetches(site_server)
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert len(children) >= 4  # redis-server, 2 workers, reclaimer
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # workers drain (at most --drain-timeout with their Redis gone), then exit
    assert _gone(children, timeout=30) == [], "orphans left after crawlctl was killed"
