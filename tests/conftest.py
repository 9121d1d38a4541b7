"""Shared fixtures: real redis-server processes and a real HTTP site server.

* ``redis_server``: one redis-server for the session on a free loopback port
  (never the machine's own Redis on 6379);
* ``rds``: a client of it, flushed before each test;
* ``own_redis``: a redis-server of the test's own, for tests that kill or
  restart it;
* ``site_server``: the multi-host site server (also the crawler's proxy),
  serving the Python documentation of Debian's python3-doc as
  ``docs.pyref-test.org``, in a thread of the test process;
* ``run_crawlctl``: runs the real ``crawlctl`` command in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from crawld.localredis import RedisServer
from crawld.settings import MACHINE_SETTINGS
from crawld.sitesrv import SiteServer

ROOT = Path(__file__).resolve().parent.parent
PYDOCS = Path("/usr/share/doc/python3-doc/html")
PYDOCS_HOST = "docs.pyref-test.org"
CRAWLCTL = str(Path(sys.executable).with_name("crawlctl"))
#: environment variables that configure crawld on a machine; tests set their own
MACHINE_ENV = {s.env for s in MACHINE_SETTINGS} | {"CRAWLD_CONFIG"}


@pytest.fixture(scope="session")
def redis_server():
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def rds(redis_server) -> redis.Redis:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def own_redis():
    srv = RedisServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def pydocs() -> Path:
    if not (PYDOCS / "index.html").exists():
        pytest.fail("python3-doc is not installed (make test installs it)")
    return PYDOCS.resolve()


@pytest.fixture
def site_server(pydocs):
    with SiteServer(("127.0.0.1", 0), {PYDOCS_HOST: pydocs}) as srv:
        yield srv


def crawlctl(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``crawlctl args`` and return the completed process (text mode)."""
    e = {k: v for k, v in os.environ.items() if k not in MACHINE_ENV}
    e["CRAWLD_CONFIG"] = "/nonexistent/crawld-test-config.json"  # not this machine's /etc/crawl-workers
    e.update(env or {})
    return subprocess.run([CRAWLCTL, *args], capture_output=True, text=True, timeout=timeout, env=e)


@pytest.fixture
def run_crawlctl():
    return crawlctl


def summary_of(proc: subprocess.CompletedProcess) -> dict:
    """The JSON summary printed by ``crawlctl run --json``."""
    assert proc.returncode == 0, f"crawlctl failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
